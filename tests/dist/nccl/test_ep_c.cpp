// Expert parallelism's C ABI (include/loom/loom_dist_c.h) on the host: defaults that mirror
// loom::ExpertParallel, and the refusals that come before any device or NCCL call, each a status
// code with a message. (Plans and runs need a GPU: python/tests/test_dist.py drives them.)
#include "loom/loom_dist_c.h"

#include <gtest/gtest.h>

#include <string>

#include "loom/dist.hpp"

namespace {

TEST(EpCApi, DefaultsMirrorTheCppApi) {
  EXPECT_EQ(loom_ep_abi_version(), uint32_t(LOOM_ABI_VERSION));
  loom_ep_t ep;
  loom_ep_default(&ep);
  const loom::ExpertParallel d;
  EXPECT_EQ(ep.size, d.size);
  EXPECT_EQ(ep.rank, d.rank);
  EXPECT_EQ(ep.first_expert, d.first_expert);
  EXPECT_EQ(ep.expert_count, d.expert_count);
  EXPECT_EQ(ep.expert_rank, nullptr);
  EXPECT_EQ(ep.expert_rank_count, 0);
  EXPECT_EQ(ep.rows_per_peer, d.rows_per_peer);
  EXPECT_EQ(ep.tokens_per_peer, d.tokens_per_peer);
  EXPECT_EQ(ep.chunks, d.chunks);
  EXPECT_EQ(ep.comm_sms, d.comm_sms);
  loom_ep_default(nullptr);  // no crash
}

TEST(EpCApi, RefusesNullsAndBadRanksWithAMessage) {
  loom_ep_plan_t plan = reinterpret_cast<loom_ep_plan_t>(1);
  loom_ep_t ep;
  loom_ep_default(&ep);
  EXPECT_EQ(loom_ep_plan_create(nullptr, nullptr, nullptr, &ep, &plan), LOOM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(plan, nullptr);  // cleared before anything can fail
  EXPECT_NE(std::string(loom_ep_last_error()).find("shape is NULL"), std::string::npos) << loom_ep_last_error();
  void* comm = reinterpret_cast<void*>(1);
  uint8_t id[LOOM_NCCL_ID_BYTES] = {};
  EXPECT_EQ(loom_nccl_comm_create(id, 2, 2, &comm), LOOM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(comm, nullptr);
  EXPECT_NE(std::string(loom_ep_last_error()).find("rank 2 of 2"), std::string::npos) << loom_ep_last_error();
  EXPECT_EQ(loom_nccl_comm_create(nullptr, 1, 0, &comm), LOOM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(loom_nccl_unique_id(nullptr), LOOM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(loom_ep_run(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr), LOOM_ERROR_INVALID_ARGUMENT);
  loom_ep_status_t st;
  EXPECT_EQ(loom_ep_read_status(nullptr, nullptr, nullptr, &st), LOOM_ERROR_INVALID_ARGUMENT);
  int64_t count = -1;
  EXPECT_EQ(loom_ep_plan_local_experts(nullptr, nullptr, 0, &count), LOOM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(loom_ep_plan_workspace_bytes(nullptr), 0u);
  EXPECT_EQ(loom_nccl_comm_destroy(nullptr), LOOM_OK);
  EXPECT_STREQ(loom_ep_last_error(), "");  // cleared by a call that succeeded
  loom_ep_plan_destroy(nullptr);
}

}  // namespace
