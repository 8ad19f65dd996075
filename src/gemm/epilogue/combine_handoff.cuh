// Hand-off epilogue (weights-on-M kernels, sorted rows with wide chunks): the consumers stage each
// chunk's whole result once and go on to the next chunk's MMAs, while the producer warpgroup's
// spare warps 1-3 weight it and add it into the output rows (store them, in the deterministic
// mode), so the tensor cores do not idle through the epilogue. Its staging takes the shared memory
// of two pipeline stages. Needs a token source whose producer is thread 0 alone (sorted rows).
#pragma once

#include <cstdint>

#include "gemm/epilogue/route_rows.cuh"
#include "gemm/epilogue/stage_columns.cuh"
#include "gemm/mainloop/fp8_weights_on_m.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/red.cuh"

namespace loom::gemm {

struct CombineHandoff {
  static constexpr bool kHandoff = true;
  static constexpr int kEpilogueWarps = 3;  // producer warps 1-3 (warp 0 issues the TMA loads)
  static_assert(kBlockM == 32 * 4, "one lane per 4 output columns of a 128-row block");

  struct Storage {
    float cols[2][kMaxChunk][kEpilogueStride];  // [consumer][token column][weight row]
    float row_weight[kMaxChunk];                // top-k weight and token of each of the chunk's rows
    int32_t row_token[kMaxChunk];
    int4 chunk;      // (first sorted row, rows, 128-row block, 0); rows < 0: the consumers are done
    uint64_t full;   // every consumer thread, after its stores
    uint64_t empty;  // every epilogue thread, after its reads
  };
  struct ConsumerState {
    uint32_t phase = 0;
  };

  template <class S>
  static __device__ __forceinline__ void init(S& s) {
    ptx::mbar_init(&s.epi.full, 32 * kConsumerWarps);
    ptx::mbar_init(&s.epi.empty, 32 * kEpilogueWarps);
  }

  // Consumer side: once the epilogue warps have read the previous chunk's staging, store this
  // chunk's result there (with its rows' weights and tokens), publish it, and go on.
  template <int W, class S, class A>
  static __device__ __forceinline__ void finish(S& s, ConsumerState& st, const A&, const float (&final_acc)[W / 2],
                                                int row0, int chunk_rows, int nb, int consumer, float row_w,
                                                int32_t row_t) {
    ptx::mbar_wait(&s.epi.empty, st.phase ^ 1);
    stage_fragment<W, W>(s.epi.cols[consumer], final_acc, 0);
    if (consumer == 0) {
      const int wg_row = threadIdx.x % 128;
      s.epi.row_weight[wg_row] = row_w;
      s.epi.row_token[wg_row] = row_t;
      if (wg_row == 0) s.epi.chunk = make_int4(row0, chunk_rows, nb, 0);
    }
    ptx::mbar_arrive(&s.epi.full);  // release: publishes this thread's stores
    st.phase ^= 1;
  }

  // Consumer side, after the last chunk: tell the epilogue warps to stop.
  template <class S>
  static __device__ __forceinline__ void end(S& s, ConsumerState& st) {
    ptx::mbar_wait(&s.epi.empty, st.phase ^ 1);
    if (threadIdx.x % 256 == 128) s.epi.chunk = make_int4(0, -1, 0, 0);
    ptx::mbar_arrive(&s.epi.full);
  }

  // Producer warps 1-3: for each chunk the consumers publish, weight its staged token columns and
  // add them into the output rows. Warp w takes the columns w, w + 3, ...; lane l the output
  // columns 4l..4l+3 of the 128-row block, so each warp instruction covers a 512-byte segment of
  // one output row. They then fall through the producer's code with nothing to do.
  template <class S, class A>
  static __device__ __forceinline__ void producer_warps(S& s, const A& a) {
    if (threadIdx.x < 32) return;
    const int epilogue_warp = int(threadIdx.x) / 32 - 1;
    const int lane = threadIdx.x % 32, half = lane / 16, quad = lane % 16;
    uint32_t phase = 0;
    while (true) {
      ptx::mbar_wait(&s.epi.full, phase);
      const int4 chunk = s.epi.chunk;
      if (chunk.y < 0) break;
      const int n = a.seg.first_row(chunk.z) + 4 * lane, end = a.seg.end_row(chunk.z);
      for (int col = epilogue_warp; col < chunk.y; col += kEpilogueWarps) {
        const float w = s.epi.row_weight[col];
        const float4 v = *reinterpret_cast<const float4*>(&s.epi.cols[half][col][4 * quad]);
        if (n >= end) continue;
        if (a.atomic)
          ptx::red_add_v4_f32(a.out + int64_t(a.reduce_rows ? chunk.x + col : s.epi.row_token[col]) * a.n + n,
                              w * v.x, w * v.y, w * v.z, w * v.w);
        else
          store_route_quad(a.out, a.store_bf16, chunk.x + col, a.n, n, w * v.x, w * v.y, w * v.z, w * v.w);
      }
      ptx::mbar_arrive(&s.epi.empty);  // every epilogue thread, after its own reads
      phase ^= 1;
    }
  }
};

}  // namespace loom::gemm
