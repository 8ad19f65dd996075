// Epilogue run by the consumer warpgroups themselves (weights-on-M kernels, inline): each stages 32
// token columns of its 64 weight rows at a time, then weights them by their routes' top-k weights
// and either adds them into the token's output row (fast combine: red.global.add.v4.f32) or stores
// them as the route's row (deterministic combine: the combine kernel sums a token's rows in order).
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>

#include "diag/chain_trace.cuh"
#include "gemm/epilogue/stage_columns.cuh"
#include "gemm/mainloop/fp8_weights_on_m.cuh"
#include "ptx/barrier.cuh"
#include "ptx/red.cuh"

namespace loom::gemm {

// kConvert: the ffn GEMM 2 instance that rounds each completed column block to bf16 (finish_unit,
// WeightsOnMConfig::convert); an instance of its own, so the others keep their registers.
template <bool kConvertT>
struct CombineInConsumersT {
  static constexpr bool kHandoff = false;
  static constexpr bool kConvert = kConvertT;
  static constexpr int kCols = 32;  // token columns staged per pass
  static_assert(kMaxChunk % kCols == 0, "epilogue passes tile the widest chunk");

  struct Staging {
    float cols[2][kCols][kEpilogueStride];
    float chunk_weight[2][kMaxChunk];  // top-k weight and token of each of the chunk's rows
    int32_t chunk_token[2][kMaxChunk];
  };
  struct ConvertStaging : Staging {
    int32_t completes[2];  // finish_unit: this warpgroup's count completed the column block
  };
  using Storage = std::conditional_t<kConvert, ConvertStaging, Staging>;
  struct ConsumerState {};

  template <class S>
  static __device__ __forceinline__ void init(S&) {}
  // No producer warp of its own.
  template <class S, class A>
  static __device__ __forceinline__ void producer_warps(S&, const A&) {}
  template <class S>
  static __device__ __forceinline__ void end(S&, ConsumerState&) {}

  template <int W, class S, class A>
  static __device__ __forceinline__ void finish(S& s, ConsumerState&, const A& a, const float (&final_acc)[W / 2],
                                                int row0, int chunk_rows, int nb, int consumer, float row_w,
                                                int32_t row_t) {
    if (threadIdx.x == 128) LOOM_TRACE(kGemmEpilogue);
    const int wg_row = threadIdx.x % 128;
    const uint32_t barrier_id = 1 + consumer, wg_thread = threadIdx.x % 128;
    float(*stage_cols)[kEpilogueStride] = s.epi.cols[consumer];
    // Published by the first barrier below; overwritten only after the chunk's last barrier.
    s.epi.chunk_weight[consumer][wg_row] = row_w;
    s.epi.chunk_token[consumer][wg_row] = row_t;
    // The block's output columns (its segment's rows; past the segment's end: not stored).
    const int n_first = a.seg.first_row(nb) + consumer * 64, n_end = a.seg.end_row(nb);
#pragma unroll
    for (int cg = 0; cg < (W + kCols - 1) / kCols; ++cg) {
      constexpr int kGroupCols = W < kCols ? W : kCols;
      stage_fragment<kGroupCols, W>(stage_cols, final_acc, cg * (kCols / 8));
      ptx::named_barrier_sync(barrier_id, 128);
      for (int item = wg_thread; item < kGroupCols * 16; item += 128) {
        const int col = item / 16, quad = item % 16;
        const int chunk_col = cg * kCols + col;
        const int n = n_first + 4 * quad;
        if (chunk_col < chunk_rows && n < n_end) {
          const int row = row0 + chunk_col;
          const float w = s.epi.chunk_weight[consumer][chunk_col];
          const float4 v = *reinterpret_cast<const float4*>(&stage_cols[col][4 * quad]);
          if (a.atomic) {
            const int token = s.epi.chunk_token[consumer][chunk_col];
            ptx::red_add_v4_f32(a.out + int64_t(token) * a.n + n, w * v.x, w * v.y, w * v.z, w * v.w);
          } else {
            *reinterpret_cast<float4*>(a.out + int64_t(row) * a.n + n) =
                make_float4(w * v.x, w * v.y, w * v.z, w * v.w);
          }
        }
      }
      // The next pass (or chunk) overwrites the staging area.
      ptx::named_barrier_sync(barrier_id, 128);
    }
  }

  // WeightsOnMConfig::convert, after this warpgroup's last reduction of a unit of `rows` rows into
  // column block nb: the count of reduced rows per block reaches 2 warpgroups x split_k x the routed
  // rows once every contribution is in; the warpgroup that brings it there rounds the block.
  template <class S, class A>
  static __device__ __forceinline__ void finish_unit(S& s, const A& a, int nb, int rows, int consumer) {
    const uint32_t barrier_id = 1 + consumer;
    const int wg_thread = int(threadIdx.x % 128);
    __threadfence();  // this thread's reductions, device-wide, before the warpgroup's count
    ptx::named_barrier_sync(barrier_id, 128);
    if (wg_thread == 0) {
      const int target = 2 * a.split_k * __ldcg(a.offsets + a.experts);
      const int done = atomicAdd(a.column_done + nb, rows) + rows;
      s.epi.completes[consumer] = done == target;
      if (done == target) a.column_done[nb] = 0;  // nothing else counts this block in this launch
    }
    ptx::named_barrier_sync(barrier_id, 128);
    if (s.epi.completes[consumer]) {
      __threadfence();  // every other count (and the reductions before it) before the reads
      convert_block(a, nb, wg_thread);
    }
    ptx::named_barrier_sync(barrier_id, 128);  // the flag read before the next unit writes it
  }

  // Column block nb of out ([out_rows, N] fp32, complete) rounded to out_bf16 (nearest even): a
  // warp per row, a lane per 4 columns, kRows rows of loads in flight per warpgroup.
  template <class A>
  static __device__ __forceinline__ void convert_block(const A& a, int nb, int wg_thread) {
    const int c0 = a.seg.first_row(nb), cols = min(kBlockM, a.seg.end_row(nb) - c0);
    const int col = 4 * (wg_thread % 32), row_in = wg_thread / 32;
    if (col >= cols) return;
    constexpr int kInFlight = 2, kRows = 4 * kInFlight;
    for (int r0 = 0; r0 < a.out_rows; r0 += kRows) {
      float4 v[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int r = r0 + 4 * u + row_in;
        if (r < a.out_rows) v[u] = __ldcg(reinterpret_cast<const float4*>(a.out + int64_t(r) * a.n + c0 + col));
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int r = r0 + 4 * u + row_in;
        if (r < a.out_rows) {
          const __nv_bfloat162 lo = __floats2bfloat162_rn(v[u].x, v[u].y), hi = __floats2bfloat162_rn(v[u].z, v[u].w);
          *reinterpret_cast<uint2*>(a.out_bf16 + int64_t(r) * a.n + c0 + col) =
              make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
        }
      }
    }
  }
};
using CombineInConsumers = CombineInConsumersT<false>;

}  // namespace loom::gemm
