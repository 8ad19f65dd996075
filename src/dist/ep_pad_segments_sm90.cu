// The token rows of each segment past the rank's count: ids -1, weights 0, return rows -1, so the
// owner computes and returns nothing for them; and the routes not sent (ep_send_sm90.cuh). A
// thread per (row, slot); thread 0 of block 0 also sums the overflow (one plain store).
#include <algorithm>

#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "dist/ep_send_sm90.cuh"
#include "ptx/pdl.cuh"

namespace loom::dist {
namespace {

__global__ void ep_pad_segments_kernel(const EpSendParams p) {
  // Launched with PDL: let the next kernel launch, then wait for the previous one's writes
  // before any global access.
  ptx::pdl_launch_dependents();
  ptx::pdl_wait();
  const int j = int(blockIdx.x) * int(blockDim.x) + int(threadIdx.x);
  if (j == 0) {
    // Routes whose token was beyond a token cap (bucket P C), and routes beyond a return cap.
    const int buckets = p.ranks * p.chunks, per_part = p.rows_per_peer / p.chunks;
    uint32_t over = uint32_t(p.ret_offsets[buckets + 1] - p.ret_offsets[buckets]);
    for (int b = 0; b < buckets; ++b) over += uint32_t(max(0, p.ret_offsets[b + 1] - p.ret_offsets[b] - per_part));
    *p.overflow = over;
  }
  if (j >= p.ranks * p.tokens_per_peer * p.topk) return;
  // Row r of the buffer [C][P][tokens_per_peer / C] is position i of peer q's segment (ep_send_row).
  const int r = j / p.topk, per_chunk = p.tokens_per_peer / p.chunks, c = r / (p.ranks * per_chunk);
  const int q = (r / per_chunk) % p.ranks, i = (r % per_chunk) * p.chunks + c;
  if (i >= p.tok_offsets[q + 1] - p.tok_offsets[q]) {
    const bool self = q == p.self_rank;
    (self ? p.recv_ids : p.send_ids)[j] = -1;
    (self ? p.recv_w : p.send_w)[j] = 0.0f;
    (self ? p.recv_ret : p.send_ret)[j] = -1;
  }
}

}  // namespace

void launch_ep_pad_segments(const EpSendParams& p, cudaStream_t stream, bool pdl) {
  constexpr int kThreads = 256;
  const int slots = p.ranks * p.tokens_per_peer * p.topk;
  const dim3 grid(unsigned(std::max(1, (slots + kThreads - 1) / kThreads)));
  launch_kernel(ep_pad_segments_kernel, grid, dim3(kThreads), 0, stream, pdl, p);
}

}  // namespace loom::dist
