// Expert parallelism's plan without a GPU (a described H200): the placement and the caps it
// records, the local plan over P x tokens_per_peer token rows of k slots, a workspace that holds
// every part, and the configurations it rejects.
#include <gtest/gtest.h>

#include <string>

#include "loom/dist.hpp"

namespace loom {
namespace {

const Shape kShape{256, 2048, 512, 64, 8, Mode::ffn, DType::fp8};

Options det() {  // one returned row per route
  Options o;
  o.deterministic = true;
  return o;
}

TEST(EpPlan, PlacementCapAndLocalPlan) {
  ExpertParallel ep;
  ep.size = 4;
  ep.rank = 3;
  const EpPlan p = plan_ep(kShape, Routing{}, det(), ep, device_spec("h200"));
  EXPECT_EQ(p.local_experts.size(), 16u);
  EXPECT_EQ(p.local_experts.front(), 48);
  EXPECT_EQ(p.rows_per_peer, 1024);   // ceil(2 x 256 x 8 / 4)
  EXPECT_EQ(p.tokens_per_peer, 256);  // the same share, at most T
  EXPECT_EQ(p.local.shape.tokens, 4 * 256);
  EXPECT_EQ(p.local.shape.experts, 16);
  EXPECT_EQ(p.local.shape.topk, 8);
  EXPECT_TRUE(p.local.options.deterministic);
  // Every part inside the workspace, the local plan's last.
  EXPECT_GE(workspace_bytes(p), p.layout.local + workspace_bytes(p.local));
  EXPECT_GE(p.layout.recv_x - p.layout.send_x, size_t(4 * 256 * (2048 + 16 * 4 + 8 * 12)));  // FP8 rows
  EXPECT_GE(p.layout.out_back - p.layout.out_local, size_t(4 * 1024 * 2048 * 2));
  EXPECT_NE(describe(p).find("rank 3 of 4: experts 48..63 of 64"), std::string::npos) << describe(p);
  EXPECT_TRUE(p.route_returns);
  // Not deterministic: one row back per token row, the owner's layer not deterministic either.
  const EpPlan fast = plan_ep(kShape, Routing{}, Options{}, ep, device_spec("h200"));
  EXPECT_FALSE(fast.route_returns);
  EXPECT_EQ(fast.rows_per_peer, fast.tokens_per_peer);
  EXPECT_FALSE(fast.local.options.deterministic);
  EXPECT_LT(workspace_bytes(fast), workspace_bytes(p));
}

TEST(EpPlan, MapAndCap) {
  ExpertParallel ep;
  ep.size = 2;
  ep.rank = 0;
  ep.expert_rank.assign(64, 1);
  ep.expert_rank[5] = ep.expert_rank[9] = 0;
  ep.rows_per_peer = 100;
  ep.tokens_per_peer = 50;
  const EpPlan p = plan_ep(kShape, Routing{}, det(), ep, device_spec("h200"));
  EXPECT_EQ(p.local_experts, (std::vector<int32_t>{5, 9}));
  EXPECT_EQ(p.local_index[9], 1);
  EXPECT_EQ(p.owner[10], 1);
  EXPECT_EQ(p.rows_per_peer, 100);
  EXPECT_EQ(p.tokens_per_peer, 50);
  EXPECT_EQ(p.local.shape.tokens, 100);
}

TEST(EpPlan, PartsSplitTheCapAndLeaveSmsToNccl) {
  const DeviceSpec h200 = device_spec("h200");
  ExpertParallel ep;
  ep.size = 4;
  ep.rank = 1;
  ep.rows_per_peer = 1000;
  ep.chunks = 3;
  const EpPlan p = plan_ep(kShape, Routing{}, det(), ep, h200);
  EXPECT_EQ(p.chunks, 3);
  EXPECT_EQ(p.rows_per_peer, 1008);  // up to whole parts of a multiple of 4 rows: 334 -> 336
  EXPECT_EQ(p.chunk_rows, 336);
  EXPECT_EQ(p.tokens_per_peer, 264);  // 256 tokens: 86 -> 88 a part
  EXPECT_EQ(p.chunk_tokens, 88);
  EXPECT_EQ(p.local.shape.tokens, 4 * 88);  // one part's token rows from every peer
  EXPECT_EQ(p.comm_sms, 16);
  EXPECT_EQ(p.local.sm_count, h200.sm_count - 16);
  EXPECT_GE(p.layout.recv_x - p.layout.send_x, size_t(4 * 264 * 2048));  // every part's rows
  EXPECT_GE(p.layout.out_back - p.layout.out_local, size_t(4 * 1008 * 2048 * 2));
  EXPECT_NE(describe(p).find("in 3 parts"), std::string::npos) << describe(p);
  ep.comm_sms = 0;
  EXPECT_EQ(plan_ep(kShape, Routing{}, det(), ep, h200).local.sm_count, h200.sm_count);
  ep.chunks = 1;  // unsplit: every SM to the GEMMs, whatever comm_sms says
  ep.comm_sms = 20;
  const EpPlan one = plan_ep(kShape, Routing{}, det(), ep, h200);
  EXPECT_EQ(one.comm_sms, 0);
  EXPECT_EQ(one.local.sm_count, h200.sm_count);
  EXPECT_EQ(one.rows_per_peer, 1000);
  ep.chunks = 2;
  ep.comm_sms = h200.sm_count;  // more than half the SMs
  EXPECT_THROW(plan_ep(kShape, Routing{}, det(), ep, h200), Error);
  ep.comm_sms = -1;
  ep.chunks = 0;
  EXPECT_THROW(plan_ep(kShape, Routing{}, det(), ep, h200), Error);
  ep.chunks = 9;
  EXPECT_THROW(plan_ep(kShape, Routing{}, det(), ep, h200), Error);
}

TEST(EpPlan, RejectsWhatItCannotRun) {
  const DeviceSpec h200 = device_spec("h200");
  ExpertParallel ep;
  ep.size = 2;
  ep.rank = 2;
  EXPECT_THROW(plan_ep(kShape, Routing{}, det(), ep, h200), Error);
  ep.rank = 0;
  ep.first_expert = 32;  // rank 1's block
  ep.expert_count = 32;
  EXPECT_THROW(plan_ep(kShape, Routing{}, det(), ep, h200), Error);
  ep.first_expert = ep.expert_count = -1;
  ep.rows_per_peer = 256 * 8 + 1;  // above T k
  EXPECT_THROW(plan_ep(kShape, Routing{}, det(), ep, h200), Error);
  ep.rows_per_peer = 0;
  ep.tokens_per_peer = 257;  // above T
  EXPECT_THROW(plan_ep(kShape, Routing{}, det(), ep, h200), Error);
  ep.tokens_per_peer = -1;
  EXPECT_THROW(plan_ep(kShape, Routing{}, det(), ep, h200), Error);
  ep.tokens_per_peer = 0;
  Shape single = kShape;
  single.mode = Mode::single;
  EXPECT_THROW(plan_ep(single, Routing{}, Options{}, ep, h200), Error);
  Shape many = kShape;
  many.experts = 1024;  // beyond the GPU path's 512
  EXPECT_THROW(plan_ep(many, Routing{}, Options{}, ep, h200), Error);
  Shape none = kShape;
  none.tokens = 0;
  EXPECT_THROW(plan_ep(none, Routing{}, Options{}, ep, h200), Error);
}

}  // namespace
}  // namespace loom
