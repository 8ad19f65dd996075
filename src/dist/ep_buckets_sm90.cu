// Each sent route's (rank, part) bucket from its token's position among the tokens to that rank
// (ep_send_sm90.cuh). A thread per route.
#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "dist/ep_send_sm90.cuh"
#include "ptx/pdl.cuh"

namespace loom::dist {
namespace {

__global__ void ep_buckets_kernel(const EpSendParams p) {
  // Launched with PDL: let the next kernel launch, then wait for the previous one's writes
  // before any global access.
  ptx::pdl_launch_dependents();
  ptx::pdl_wait();
  const int s = int(blockIdx.x) * int(blockDim.x) + int(threadIdx.x);
  if (s >= p.tokens * p.topk) return;
  const int32_t q = p.dest[s];
  if (q < 0) {
    p.bucket[s] = -1;
    return;
  }
  int first = s - s % p.topk;  // the slot that carries the token's row to q
  while (p.mark[first] != q) ++first;
  const int i = p.tok_row[first] - p.tok_offsets[q];
  p.bucket[s] = i < p.tokens_per_peer ? q * p.chunks + i % p.chunks : p.ranks * p.chunks;
}

}  // namespace

void launch_ep_buckets(const EpSendParams& p, cudaStream_t stream, bool pdl) {
  const int routes = p.tokens * p.topk;
  if (routes == 0) return;
  constexpr int kThreads = 256;
  const dim3 grid(unsigned((routes + kThreads - 1) / kThreads));
  launch_kernel(ep_buckets_kernel, grid, dim3(kThreads), 0, stream, pdl, p);
}

}  // namespace loom::dist
