// The owner's side of the return (ep_send_sm90.cuh): each received route's weighted row, which the
// local run left in y at its route_row, into its source's return segment at the row the source
// sent with it. A warp per (row, slot), 16 bytes a lane.
#include <string>

#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "dist/ep_send_sm90.cuh"
#include "ptx/pdl.cuh"

namespace loom::dist {
namespace {

__global__ void ep_return_rows_kernel(const EpReturnParams p) {
  // Launched with PDL: let the next kernel launch, then wait for the previous one's writes
  // before any global access.
  ptx::pdl_launch_dependents();
  ptx::pdl_wait();
  const int warps = int(blockDim.x) / 32;
  const int s = int(blockIdx.x) * warps + int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (s >= p.rows * p.topk) return;
  const int32_t ret = p.recv_ret[s];
  if (ret < 0) return;
  const int32_t src_row = p.route_row[s];  // >= 0: a slot with a return row has a local id
  const int source = s / p.topk / p.tokens_per_source;
  const uint4* src = reinterpret_cast<const uint4*>(p.y + int64_t(src_row) * p.hidden_dim);
  uint16_t* out = source == p.self_source ? p.self_out : p.out;
  uint4* dst = reinterpret_cast<uint4*>(out + (int64_t(source) * p.rows_per_source + ret) * p.hidden_dim);
  for (int v = lane; v < p.hidden_dim / 8; v += 32) dst[v] = src[v];
}

}  // namespace

void launch_ep_return_rows(const EpReturnParams& p, cudaStream_t stream, bool pdl) {
  if (p.rows < 0 || p.topk < 1 || p.hidden_dim < 8 || p.hidden_dim % 8 || p.tokens_per_source < 1 ||
      p.rows_per_source < 0 || p.rows % p.tokens_per_source)
    throw Error("ep_return_rows: rows >= 0 whole sources, k >= 1 and H a positive multiple of 8");
  if (p.rows == 0) return;
  if (!p.recv_ret || !p.route_row || !p.y || !p.out || (p.self_source >= 0 && !p.self_out))
    throw Error("ep_return_rows: null device pointer");
  if (reinterpret_cast<uintptr_t>(p.y) % 16 || reinterpret_cast<uintptr_t>(p.out) % 16 ||
      reinterpret_cast<uintptr_t>(p.self_out) % 16)
    throw Error("ep_return_rows: y and the return rows must be 16-byte aligned");
  constexpr int kThreads = 256, kWarps = kThreads / 32;
  const int slots = p.rows * p.topk;
  const dim3 grid(unsigned((slots + kWarps - 1) / kWarps));
  launch_kernel(ep_return_rows_kernel, grid, dim3(kThreads), 0, stream, pdl, p);
}

}  // namespace loom::dist
