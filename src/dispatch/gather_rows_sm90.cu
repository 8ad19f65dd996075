#include "dispatch/gather_rows_sm90.cuh"

#include <string>

#include "common/launch.hpp"
#include "loom/types.hpp"
#include "ptx/pdl.cuh"

namespace loom {
namespace {

constexpr int kWarps = 8;

__global__ void __launch_bounds__(kWarps * 32) gather_rows_kernel(const GatherRowsParams p) {
  ptx::pdl_launch_dependents();
  ptx::pdl_wait();  // route_row is the dispatch's
  const int lane = threadIdx.x % 32;
  const int t = blockIdx.x * kWarps + threadIdx.x / 32;
  if (t >= p.tokens) return;
  // Lane j < k holds route j's row; the copy loop reads them by shuffle.
  const int my_row = lane < p.topk ? __ldcg(p.route_row + int64_t(t) * p.topk + lane) : -1;
  const int chunks = p.hidden_dim / 8;  // 16-byte pieces of a row
  const uint4* src = reinterpret_cast<const uint4*>(p.hidden + int64_t(t) * p.hidden_dim);
  for (int c = lane; c < chunks; c += 32) {
    const uint4 v = __ldg(src + c);
    for (int j = 0; j < p.topk; ++j) {
      const int row = __shfl_sync(0xffffffffu, my_row, j);
      if (row >= 0) reinterpret_cast<uint4*>(p.rows + int64_t(row) * p.hidden_dim)[c] = v;
    }
  }
}

}  // namespace

void launch_gather_rows(const GatherRowsParams& p, cudaStream_t stream, bool pdl) {
  static const std::string who = "gather_rows: ";
  if (p.tokens < 0 || p.topk < 1 || p.topk > 32 || p.hidden_dim <= 0 || p.hidden_dim % 8)
    throw Error(who + "tokens >= 0, topk in [1, 32] and hidden a positive multiple of 8, got T=" +
                std::to_string(p.tokens) + ", k=" + std::to_string(p.topk) + ", H=" + std::to_string(p.hidden_dim));
  if (p.tokens == 0) return;
  if (!p.hidden || !p.route_row || !p.rows) throw Error(who + "null buffer");
  if ((reinterpret_cast<uintptr_t>(p.hidden) | reinterpret_cast<uintptr_t>(p.rows)) & 15u)
    throw Error(who + "hidden and rows must be 16-byte aligned");
  launch_kernel(gather_rows_kernel, dim3(unsigned((p.tokens + kWarps - 1) / kWarps)), dim3(kWarps * 32), 0, stream, pdl,
                p);
}

}  // namespace loom
