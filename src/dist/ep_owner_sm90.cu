// Each route's owner rank, and the mark that makes one row per (token, owner) (ep_send_sm90.cuh).
// A thread per route; the earlier slots of its token are looked up again (k <= 16).
#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "dist/ep_send_sm90.cuh"
#include "ptx/pdl.cuh"

namespace loom::dist {
namespace {

__device__ inline int32_t owner_of(const EpTables& t, int32_t e, int experts) {
  return e >= 0 && e < experts ? int32_t(t.owner[e]) : -1;
}

__global__ void ep_owner_kernel(const __grid_constant__ EpTables t, const int32_t* ids, int routes, int topk,
                                int experts, int ranks, int32_t* dest, int32_t* mark, uint32_t* zero) {
  // Launched with PDL: let the next kernel launch, then wait for the previous one's writes
  // before any global access.
  ptx::pdl_launch_dependents();
  ptx::pdl_wait();
  const int s = int(blockIdx.x) * int(blockDim.x) + int(threadIdx.x);
  if (s == 0 && zero) *zero = 0;  // token returns: ep_pack_tokens adds the routes it cannot send
  if (s >= routes) return;
  const int32_t q = owner_of(t, ids[s], experts);
  dest[s] = q;
  int32_t m = q;  // the first slot of this token owned by q carries the token's row to q
  for (int j = s - s % topk; j < s && m >= 0; ++j)
    if (owner_of(t, ids[j], experts) == q) m = ranks;
  mark[s] = m;
}

}  // namespace

void launch_ep_owner(const EpTables& t, const EpSendParams& p, cudaStream_t stream, bool pdl) {
  const int routes = p.tokens * p.topk;
  if (routes == 0) return;
  constexpr int kThreads = 256;
  const dim3 grid(unsigned((routes + kThreads - 1) / kThreads));
  launch_kernel(ep_owner_kernel, grid, dim3(kThreads), 0, stream, pdl, t, p.ids, routes, p.topk, p.experts, p.ranks,
                p.dest, p.mark, p.token_returns ? p.overflow : nullptr);
}

}  // namespace loom::dist
