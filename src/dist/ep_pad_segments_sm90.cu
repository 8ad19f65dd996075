// The send segments' rows past each peer's count: id -1 and weight 0, so the owner's dispatch
// drops them; and the routes beyond the cap (ep_send_sm90.cuh). A thread per segment row; thread 0
// of block 0 also sums the overflow over the peers (one plain store: nothing to clear).
#include <string>

#include "common/cuda_check.hpp"
#include "dist/ep_send_sm90.cuh"

namespace loom::dist {
namespace {

__global__ void ep_pad_segments_kernel(const EpSendParams p) {
  const int j = int(blockIdx.x) * int(blockDim.x) + int(threadIdx.x);
  if (j == 0) {
    uint32_t over = 0;
    for (int q = 0; q < p.ranks; ++q) over += uint32_t(max(0, p.offsets[q + 1] - p.offsets[q] - p.rows_per_peer));
    *p.overflow = over;
  }
  if (j >= p.ranks * p.rows_per_peer) return;
  // Row j of the buffer [C][P][rows_per_peer / C] is position i of peer q's segment (ep_send_row).
  const int per_chunk = p.rows_per_peer / p.chunks, c = j / (p.ranks * per_chunk);
  const int q = (j / per_chunk) % p.ranks, i = (j % per_chunk) * p.chunks + c;
  if (i >= p.offsets[q + 1] - p.offsets[q]) {
    p.send_ids[j] = -1;
    p.send_w[j] = 0.0f;
  }
}

}  // namespace

void launch_ep_pad_segments(const EpSendParams& p, cudaStream_t stream) {
  if (p.ranks < 1 || p.rows_per_peer < 0 || p.chunks < 1 || p.rows_per_peer % p.chunks)
    throw Error("ep_pad_segments: P >= 1 and rows_per_peer >= 0 a multiple of the chunks");
  if (!p.offsets || !p.send_ids || !p.send_w || !p.overflow) throw Error("ep_pad_segments: null device pointer");
  constexpr int kThreads = 256;
  const int rows = p.ranks * p.rows_per_peer;
  ep_pad_segments_kernel<<<std::max(1, (rows + kThreads - 1) / kThreads), kThreads, 0, stream>>>(p);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace loom::dist
