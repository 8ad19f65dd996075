#include "gemm/combine_rows_sm90.cuh"

#include <cuda_bf16.h>

#include <cstdint>
#include <string>

#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "loom/types.hpp"
#include "ptx/pdl.cuh"

// Mapping: one thread per (token, 4 consecutive columns). It loads the token's route rows (one
// batch of up to kBatch slots), then issues one 16-byte load of y per kept slot, all in flight
// together, and only then adds them in slot order. Consecutive threads cover consecutive columns of
// the same token, so a warp reads 512 contiguous bytes of each y row and the route_row loads are
// warp-wide broadcasts. topk > kBatch runs further batches in order (the sum stays sequential).

namespace loom {
namespace {

constexpr int kThreads = 256;

// Four consecutive y values of a row, as fp32: a 16-byte load of fp32 rows, an 8-byte load of bf16
// rows widened exactly.
template <bool kBf16Rows>
__device__ __forceinline__ float4 load_quad(const CombineRowsParams& p, int32_t row, uint32_t c) {
  if constexpr (kBf16Rows) {
    const uint2 w = __ldcg(reinterpret_cast<const uint2*>(p.y_bf16 + int64_t(row) * p.cols) + c);
    return make_float4(__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xffff0000u), __uint_as_float(w.y << 16),
                       __uint_as_float(w.y & 0xffff0000u));
  } else {
    return __ldcg(reinterpret_cast<const float4*>(p.y + int64_t(row) * p.cols) + c);
  }
}

template <int kBatch, bool kBf16Rows>
__global__ void __launch_bounds__(kThreads) combine_rows_kernel(const CombineRowsParams p) {
  ptx::pdl_launch_dependents();
  // Before any global access: y and route_row come from earlier kernels, and `out` may still be
  // read by a kernel of the previous run.
  ptx::pdl_wait();

  const int k = p.topk;
  const uint32_t quads = uint32_t(p.cols) / 4u;  // float4 per row
  const uint64_t total = uint64_t(p.tokens) * quads;
  const uint64_t stride = uint64_t(gridDim.x) * kThreads;
  for (uint64_t i = uint64_t(blockIdx.x) * kThreads + threadIdx.x; i < total; i += stride) {
    const uint64_t t = i / quads;
    const uint32_t c = uint32_t(i - t * quads);
    const int32_t* slots = p.route_row + int64_t(t) * k;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int j0 = 0; j0 < k; j0 += kBatch) {
      int32_t row[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) row[j] = j0 + j < k ? __ldcg(slots + j0 + j) : -1;
      float4 v[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        v[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (row[j] >= 0) v[j] = load_quad<kBf16Rows>(p, row[j], c);
      }
      // Slot order, one fp32 add at a time (no fast-math: nothing reassociates or contracts).
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        if (row[j] >= 0) {
          acc.x = acc.x + v[j].x;
          acc.y = acc.y + v[j].y;
          acc.z = acc.z + v[j].z;
          acc.w = acc.w + v[j].w;
        }
      }
    }
    if (p.out_bf16 != nullptr) {
      const __nv_bfloat162 lo = __floats2bfloat162_rn(acc.x, acc.y), hi = __floats2bfloat162_rn(acc.z, acc.w);
      reinterpret_cast<uint2*>(p.out_bf16 + int64_t(t) * p.cols)[c] =
          make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
    } else {
      reinterpret_cast<float4*>(p.out + int64_t(t) * p.cols)[c] = acc;
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
  if (p.cols <= 0 || p.cols % 4 != 0)
    throw Error(who + "cols must be a positive multiple of 4, got " + std::to_string(p.cols));
  if ((p.y == nullptr) == (p.y_bf16 == nullptr) || !p.route_row || (p.out == nullptr) == (p.out_bf16 == nullptr))
    throw Error(who + "null buffer (exactly one of y and y_bf16, route_row, and exactly one of out and out_bf16)");
  if ((p.y && !aligned16(p.y)) || (p.out && !aligned16(p.out)) || (reinterpret_cast<uintptr_t>(p.y_bf16) & 7u) != 0 ||
      (reinterpret_cast<uintptr_t>(p.out_bf16) & 7u) != 0)
    throw Error(who + "y and out must be 16-byte aligned, y_bf16 and out_bf16 8-byte");
  if (int64_t(p.tokens) * p.topk > INT32_MAX) throw Error(who + "problem too large");

  const int64_t total = int64_t(p.tokens) * (p.cols / 4);
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
