// dest[s] = the rank that owns route s's expert, -1 for an id outside [0, E) (ep_send_sm90.cuh).
#include "common/cuda_check.hpp"
#include "dist/ep_send_sm90.cuh"

namespace loom::dist {
namespace {

__global__ void ep_owner_kernel(const __grid_constant__ EpTables t, const int32_t* ids, int routes, int experts,
                                int32_t* dest) {
  const int s = int(blockIdx.x) * int(blockDim.x) + int(threadIdx.x);
  if (s >= routes) return;
  const int32_t e = ids[s];
  dest[s] = e >= 0 && e < experts ? int32_t(t.owner[e]) : -1;
}

}  // namespace

void launch_ep_owner(const EpTables& t, const EpSendParams& p, cudaStream_t stream) {
  if (p.tokens < 0 || p.topk < 1 || p.experts < 1 || p.experts > kGpuMaxExperts)
    throw Error("ep_owner: T >= 0, k >= 1 and E in [1, " + std::to_string(kGpuMaxExperts) + "]");
  if (!p.ids || !p.dest) throw Error("ep_owner: null device pointer");
  const int routes = p.tokens * p.topk;
  if (routes == 0) return;
  constexpr int kThreads = 256;
  ep_owner_kernel<<<(routes + kThreads - 1) / kThreads, kThreads, 0, stream>>>(t, p.ids, routes, p.experts, p.dest);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace loom::dist
