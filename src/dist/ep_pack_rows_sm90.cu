// Each sent route's row into its destination's segment (ep_send_sm90.cuh): a warp per route, the
// hidden row copied 16 bytes a lane at a time.
#include <string>

#include "common/cuda_check.hpp"
#include "dist/ep_send_sm90.cuh"

namespace loom::dist {
namespace {

__global__ void ep_pack_rows_kernel(const __grid_constant__ EpTables t, const EpSendParams p) {
  const int warps = int(blockDim.x) / 32;
  const int s = int(blockIdx.x) * warps + int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (s >= p.tokens * p.topk) return;
  const int32_t pos = p.route_row[s];
  int32_t row = -1;
  if (pos >= 0) {
    const int q = p.dest[s];
    const int i = pos - p.offsets[q];
    if (i < p.rows_per_peer) row = ep_send_row(q, i, p.ranks, p.rows_per_peer, p.chunks);
  }
  if (lane == 0) p.slot_row[s] = row;
  if (row < 0) return;  // dropped (id out of range) or beyond the peer's cap
  if (lane == 0) {
    p.send_ids[row] = int32_t(t.local[p.ids[s]]);
    p.send_w[row] = p.weights[s];
  }
  const uint4* src = reinterpret_cast<const uint4*>(p.hidden + int64_t(s / p.topk) * p.hidden_dim);
  uint4* dst = reinterpret_cast<uint4*>(p.send_x + int64_t(row) * p.hidden_dim);
  for (int c = lane; c < p.hidden_dim / 8; c += 32) dst[c] = src[c];
}

}  // namespace

void launch_ep_pack_rows(const EpTables& t, const EpSendParams& p, cudaStream_t stream) {
  if (p.tokens < 0 || p.topk < 1 || p.ranks < 1 || p.rows_per_peer < 0 || p.hidden_dim < 8 || p.hidden_dim % 8 ||
      p.chunks < 1 || p.rows_per_peer % p.chunks)
    throw Error("ep_pack_rows: T >= 0, k >= 1, P >= 1, rows_per_peer >= 0 a multiple of the chunks and H a positive "
                "multiple of 8");
  if (!p.hidden || !p.ids || !p.weights || !p.dest || !p.offsets || !p.route_row || !p.send_x || !p.send_ids ||
      !p.send_w || !p.slot_row)
    throw Error("ep_pack_rows: null device pointer");
  if (reinterpret_cast<uintptr_t>(p.hidden) % 16 || reinterpret_cast<uintptr_t>(p.send_x) % 16)
    throw Error("ep_pack_rows: hidden and the send rows must be 16-byte aligned");
  const int routes = p.tokens * p.topk;
  if (routes == 0) return;
  constexpr int kThreads = 256, kWarps = kThreads / 32;
  ep_pack_rows_kernel<<<(routes + kWarps - 1) / kWarps, kThreads, 0, stream>>>(t, p);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace loom::dist
