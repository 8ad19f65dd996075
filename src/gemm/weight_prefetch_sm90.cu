#include "gemm/weight_prefetch_sm90.cuh"

#include <string>

#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "loom/types.hpp"
#include "ptx/prefetch.cuh"
#include "ptx/tma.cuh"

namespace loom {
namespace {

constexpr int kThreads = 256;
constexpr int kLine = 128;

__global__ void __launch_bounds__(kThreads) weight_prefetch_kernel(const WeightPrefetchParams p) {
  if (p.bulk) {
    // One chunk per CTA, cut into pieces the TMA unit takes (size < 2^32, multiple of 16).
    const int64_t chunk = (p.bytes / gridDim.x + 15) / 16 * 16;
    const int64_t lo = int64_t(blockIdx.x) * chunk, hi = min(p.bytes, lo + chunk);
    constexpr int64_t kPiece = 1 << 16;
    for (int64_t off = lo + int64_t(threadIdx.x) * kPiece; off < hi; off += int64_t(kThreads) * kPiece)
      ptx::prefetch_l2_bulk(p.begin + off, uint32_t(min(kPiece, hi - off)));
    return;
  }
  const int64_t lines = (p.bytes + kLine - 1) / kLine;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < lines; i += stride)
    ptx::prefetch_l2(p.begin + i * kLine);
}

}  // namespace

void launch_weight_prefetch(const WeightPrefetchParams& p, int sm_count, cudaStream_t stream) {
  if (p.bytes <= 0) return;
  if (!p.begin || (reinterpret_cast<uintptr_t>(p.begin) & 15u) || p.bytes % 16)
    throw Error("launch_weight_prefetch: the range must be 16-byte aligned, a multiple of 16 bytes");
  launch_kernel(weight_prefetch_kernel, dim3(unsigned(sm_count)), dim3(kThreads), 0, stream, false, p);
}

}  // namespace loom
