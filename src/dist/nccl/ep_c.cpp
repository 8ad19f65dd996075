// Expert parallelism's C ABI (include/loom/loom_dist_c.h) over loom/dist.hpp and NCCL.
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "capi/capi_util.hpp"
#include "loom/dist.hpp"
#include "loom/loom_dist_c.h"

static_assert(sizeof(ncclUniqueId) == LOOM_NCCL_ID_BYTES, "an NCCL unique id is 128 bytes");

struct loom_ep_plan_s {
  loom::EpPlan plan;
};

namespace {

thread_local std::string last_error;

template <class F>
loom_status_code guarded(F&& f) {
  return loom::capi::guarded(last_error, std::forward<F>(f));
}

using loom::capi::require;

void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw loom::CudaError(std::string(what) + ": " + ncclGetErrorString(r));
}

}  // namespace

extern "C" {

uint32_t loom_ep_abi_version(void) { return LOOM_ABI_VERSION; }

const char* loom_ep_last_error(void) { return last_error.c_str(); }

void loom_ep_default(loom_ep_t* ep) {
  if (ep == nullptr) return;
  const loom::ExpertParallel d;
  ep->size = d.size;
  ep->rank = d.rank;
  ep->first_expert = d.first_expert;
  ep->expert_count = d.expert_count;
  ep->expert_rank = nullptr;
  ep->expert_rank_count = 0;
  ep->rows_per_peer = d.rows_per_peer;
  ep->chunks = d.chunks;
  ep->comm_sms = d.comm_sms;
  ep->tokens_per_peer = d.tokens_per_peer;
}

loom_status_code loom_nccl_unique_id(uint8_t* id) {
  return guarded([&] {
    require(id, "id");
    ncclUniqueId u;
    nccl_check(ncclGetUniqueId(&u), "ncclGetUniqueId");
    std::memcpy(id, &u, sizeof u);
  });
}

loom_status_code loom_nccl_comm_create(const uint8_t* id, int32_t size, int32_t rank, void** comm) {
  return guarded([&] {
    require(comm, "comm");
    *comm = nullptr;
    require(id, "id");
    if (size < 1 || rank < 0 || rank >= size)
      throw loom::Error("rank " + std::to_string(rank) + " of " + std::to_string(size) + " is not a rank");
    setenv("NCCL_NVLS_ENABLE", "0", 0);  // NVLink multicast off unless the environment says otherwise
    ncclUniqueId u;
    std::memcpy(&u, id, sizeof u);
    ncclComm_t c = nullptr;
    nccl_check(ncclCommInitRank(&c, size, u, rank), "ncclCommInitRank");
    *comm = c;
  });
}

loom_status_code loom_nccl_comm_destroy(void* comm) {
  return guarded([&] {
    if (comm) nccl_check(ncclCommDestroy(static_cast<ncclComm_t>(comm)), "ncclCommDestroy");
  });
}

loom_status_code loom_ep_plan_create(const loom_shape_t* shape, const loom_routing_t* routing,
                                     const loom_options_t* options, const loom_ep_t* ep, loom_ep_plan_t* plan) {
  return guarded([&] {
    require(plan, "plan");
    *plan = nullptr;
    require(shape, "shape");
    require(routing, "routing");
    require(options, "options");
    require(ep, "ep");
    loom::ExpertParallel e;
    e.size = ep->size;
    e.rank = ep->rank;
    e.first_expert = ep->first_expert;
    e.expert_count = ep->expert_count;
    if (ep->expert_rank_count < 0) throw loom::Error("expert_rank_count must be >= 0");
    if (ep->expert_rank_count > 0) {
      require(ep->expert_rank, "expert_rank");
      e.expert_rank.assign(ep->expert_rank, ep->expert_rank + ep->expert_rank_count);
    }
    e.rows_per_peer = ep->rows_per_peer;
    e.chunks = ep->chunks;
    e.comm_sms = ep->comm_sms;
    e.tokens_per_peer = ep->tokens_per_peer;
    auto handle = std::make_unique<loom_ep_plan_s>();
    handle->plan = loom::plan_ep(loom::capi::to_shape(*shape), loom::capi::to_routing(*routing),
                                 loom::capi::to_options(*options), e);
    *plan = handle.release();
  });
}

void loom_ep_plan_destroy(loom_ep_plan_t plan) { delete plan; }

size_t loom_ep_plan_workspace_bytes(loom_ep_plan_t plan) { return plan ? loom::workspace_bytes(plan->plan) : 0; }

loom_status_code loom_ep_plan_local_experts(loom_ep_plan_t plan, int32_t* experts, int64_t capacity, int64_t* count) {
  return guarded([&] {
    require(plan, "plan");
    const std::vector<int32_t>& mine = plan->plan.local_experts;
    if (capacity > 0) require(experts, "experts");
    if (count) *count = int64_t(mine.size());
    for (int64_t i = 0; i < capacity && i < int64_t(mine.size()); ++i) experts[i] = mine[size_t(i)];
  });
}

loom_status_code loom_ep_plan_describe(loom_ep_plan_t plan, char* buffer, size_t capacity, size_t* length) {
  return guarded([&] {
    require(plan, "plan");
    loom::capi::copy_text(loom::describe(plan->plan), buffer, capacity, length);
  });
}

loom_status_code loom_ep_run(loom_ep_plan_t plan, const loom_weights_t* weights, const loom_inputs_t* inputs,
                             void* output, void* workspace, void* comm, void* stream) {
  return guarded([&] {
    require(plan, "plan");
    require(weights, "weights");
    require(inputs, "inputs");
    loom::run_ep(plan->plan, loom::capi::to_weights(*weights), loom::capi::to_inputs(*inputs), output, workspace,
                 static_cast<ncclComm_t>(comm), static_cast<cudaStream_t>(stream));
  });
}

loom_status_code loom_ep_read_status(loom_ep_plan_t plan, const void* workspace, void* stream,
                                     loom_ep_status_t* status) {
  return guarded([&] {
    require(plan, "plan");
    require(workspace, "workspace");
    require(status, "status");
    const loom::EpStatus st = loom::read_status(plan->plan, workspace, static_cast<cudaStream_t>(stream));
    status->nan_tokens = st.nan_tokens;
    status->dropped_routes = st.dropped_routes;
    status->overflow_routes = st.overflow_routes;
    status->reserved = 0;
  });
}

}  // extern "C"
