#include "gemm/combine_rows_sm90.cuh"

#include <cuda_bf16.h>

#include <cstdint>
#include <string>

#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "loom/types.hpp"
#include "ptx/pdl.cuh"

// Mapping: one thread per (token, kCols consecutive columns: 4 of fp32 rows, 8 of bf16 rows, so
// each y load is 16 bytes). It loads the token's route rows (one batch of up to kBatch slots), then
// issues one 16-byte load of y per kept slot, all in flight together, and only then adds them in
// slot order. Consecutive threads cover consecutive columns of the same token, so a warp reads 512
// contiguous bytes of each y row and the route_row loads are warp-wide broadcasts. topk > kBatch runs
// further batches in order (the sum stays sequential).

namespace loom {
namespace {

constexpr int kThreads = 256;

// Column j of a 16-byte load of y: fp32 rows hold 4 values, bf16 rows 8 (widened exactly).
template <bool kBf16Rows>
__device__ __forceinline__ float widen(const uint4& w, int j) {
  const uint32_t word = j < (kBf16Rows ? 2 : 1) ? w.x : j < (kBf16Rows ? 4 : 2) ? w.y : j < (kBf16Rows ? 6 : 3) ? w.z : w.w;
  if constexpr (kBf16Rows) return __uint_as_float((j & 1) ? (word & 0xffff0000u) : (word << 16));
  return __uint_as_float(word);
}

template <int kBatch, bool kBf16Rows>
__global__ void __launch_bounds__(kThreads) combine_rows_kernel(const CombineRowsParams p) {
  constexpr int kCols = kBf16Rows ? 8 : 4;
  static_assert(kBatch >= 1 && kBatch <= 16, "one batch's loads are held in registers");
  ptx::pdl_launch_dependents();
  // Before any global access: y and route_row come from earlier kernels, and `out` may still be
  // read by a kernel of the previous run.
  ptx::pdl_wait();

  const int k = p.topk;
  const uint32_t groups = uint32_t(p.cols) / kCols;  // 16-byte y loads per row
  const uint64_t total = uint64_t(p.tokens) * groups;
  const uint64_t stride = uint64_t(gridDim.x) * kThreads;
  const uint4* y = kBf16Rows ? reinterpret_cast<const uint4*>(p.y_bf16) : reinterpret_cast<const uint4*>(p.y);
  for (uint64_t i = uint64_t(blockIdx.x) * kThreads + threadIdx.x; i < total; i += stride) {
    const uint64_t t = i / groups;
    const uint32_t c = uint32_t(i - t * groups);
    const int32_t* slots = p.route_row + int64_t(t) * k;
    float acc[kCols];
#pragma unroll
    for (int j = 0; j < kCols; ++j) acc[j] = 0.0f;
    for (int j0 = 0; j0 < k; j0 += kBatch) {
      int32_t row[kBatch];
#pragma unroll
      for (int s = 0; s < kBatch; ++s) row[s] = j0 + s < k ? __ldcg(slots + j0 + s) : -1;
      uint4 v[kBatch];
#pragma unroll
      for (int s = 0; s < kBatch; ++s) {
        v[s] = make_uint4(0u, 0u, 0u, 0u);
        if (row[s] >= 0) v[s] = __ldcg(y + int64_t(row[s]) * groups + c);
      }
      // Slot order, one fp32 add at a time (no fast-math: nothing reassociates or contracts).
#pragma unroll
      for (int s = 0; s < kBatch; ++s) {
        if (row[s] >= 0) {
#pragma unroll
          for (int j = 0; j < kCols; ++j) acc[j] = acc[j] + widen<kBf16Rows>(v[s], j);
        }
      }
    }
    const int64_t first = int64_t(t) * p.cols + int64_t(c) * kCols;
    if (p.out_bf16 != nullptr) {
      // 8-byte stores: out_bf16 need only be 8-byte aligned.
#pragma unroll
      for (int j = 0; j < kCols; j += 4) {
        const __nv_bfloat162 lo = __floats2bfloat162_rn(acc[j], acc[j + 1]);
        const __nv_bfloat162 hi = __floats2bfloat162_rn(acc[j + 2], acc[j + 3]);
        *reinterpret_cast<uint2*>(p.out_bf16 + first + j) =
            make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
      }
    } else {
#pragma unroll
      for (int j = 0; j < kCols; j += 4)
        *reinterpret_cast<float4*>(p.out + first + j) = make_float4(acc[j], acc[j + 1], acc[j + 2], acc[j + 3]);
    }
  }
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

}  // namespace

void launch_combine_rows(const CombineRowsParams& p, cudaStream_t stream, bool pdl) {
  static const std::string who = "launch_combine_rows: ";
  if (p.tokens < 0) throw Error(who + "tokens must be >= 0, got " + std::to_string(p.tokens));
  if (p.tokens == 0) return;
  if (p.topk <= 0) throw Error(who + "topk must be positive, got " + std::to_string(p.topk));
  if (p.cols <= 0 || p.cols % (p.y_bf16 ? 8 : 4) != 0)
    throw Error(who + "cols must be a positive multiple of 4 (of 8 with bf16 rows), got " + std::to_string(p.cols));
  if ((p.y == nullptr) == (p.y_bf16 == nullptr) || !p.route_row || (p.out == nullptr) == (p.out_bf16 == nullptr))
    throw Error(who + "null buffer (exactly one of y and y_bf16, route_row, and exactly one of out and out_bf16)");
  if ((p.y && !aligned16(p.y)) || (p.out && !aligned16(p.out)) || (p.y_bf16 && !aligned16(p.y_bf16)) ||
      (reinterpret_cast<uintptr_t>(p.out_bf16) & 7u) != 0)
    throw Error(who + "y, y_bf16 and out must be 16-byte aligned, out_bf16 8-byte");
  if (int64_t(p.tokens) * p.topk > INT32_MAX) throw Error(who + "problem too large");

  const int64_t total = int64_t(p.tokens) * (p.cols / (p.y_bf16 ? 8 : 4));
  int64_t blocks = (total + kThreads - 1) / kThreads;
  if (blocks > (int64_t(1) << 20)) blocks = int64_t(1) << 20;  // grid-stride beyond
  // Batch size: every slot's load in flight at once for topk <= 16; register use grows with it.
  void (*kernel)(CombineRowsParams);
  if (p.y_bf16)
    kernel = p.topk <= 4 ? combine_rows_kernel<4, true> : p.topk <= 8 ? combine_rows_kernel<8, true> : combine_rows_kernel<16, true>;
  else
    kernel = p.topk <= 4 ? combine_rows_kernel<4, false> : p.topk <= 8 ? combine_rows_kernel<8, false> : combine_rows_kernel<16, false>;
  launch_kernel(kernel, dim3(unsigned(blocks)), dim3(kThreads), 0, stream, pdl, p);
}

}  // namespace loom
