// Epilogue run by the consumer warpgroups themselves (weights-on-M kernels, inline): each stages 32
// token columns of its 64 weight rows at a time, then weights them by their routes' top-k weights
// and either adds them into the token's output row (fast combine: red.global.add.v4.f32) or stores
// them as the route's row (deterministic combine: the combine kernel sums a token's rows in order).
#pragma once

#include <cstdint>

#include "diag/chain_trace.cuh"
#include "gemm/epilogue/route_rows.cuh"
#include "gemm/epilogue/stage_columns.cuh"
#include "gemm/mainloop/fp8_weights_on_m.cuh"
#include "ptx/barrier.cuh"
#include "ptx/red.cuh"

namespace loom::gemm {

struct CombineInConsumers {
  static constexpr bool kHandoff = false;
  static constexpr int kCols = 32;  // token columns staged per pass
  static_assert(kMaxChunk % kCols == 0, "epilogue passes tile the widest chunk");

  struct Storage {
    float cols[2][kCols][kEpilogueStride];
    float chunk_weight[2][kMaxChunk];  // top-k weight and token of each of the chunk's rows
    int32_t chunk_token[2][kMaxChunk];
  };
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
            const int dst = a.reduce_rows ? row : s.epi.chunk_token[consumer][chunk_col];
            ptx::red_add_v4_f32(a.out + int64_t(dst) * a.n + n, w * v.x, w * v.y, w * v.z, w * v.w);
          } else {
            store_route_quad(a.out, a.store_bf16, row, a.n, n, w * v.x, w * v.y, w * v.z, w * v.w);
          }
        }
      }
      // The next pass (or chunk) overwrites the staging area.
      ptx::named_barrier_sync(barrier_id, 128);
    }
  }
};

}  // namespace loom::gemm
