// BF16 mainloop with weight rows on the MMA's M side, for small batches (decode): per stage a
// 64 x 64 tile of weight rows (A) and a 64 x 64 tile of an expert's sorted rows (B, the tokens on
// N), both by TMA with 128-byte swizzle; one consumer warpgroup issues four m64n64k16 per stage into
// one fp32 accumulator over all of K. An expert's few rows then cost a 64-wide MMA, not a 128-row
// tile, and its weights leave HBM in 64-row units that spread over every SM.
#pragma once

#include <cstdint>

#include "gemm/ring_cursor.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/wgmma.cuh"

namespace loom::gemm::bf16_weights_on_m {

inline constexpr int kBlockK = 64;      // K per stage: one 128-byte swizzled row
inline constexpr int kWeightRows = 64;  // the MMA's M
inline constexpr int kChunk = 64;       // the MMA's N: an expert's sorted rows per unit
inline constexpr int kATileBytes = kWeightRows * kBlockK * 2;
inline constexpr int kBTileBytes = kChunk * kBlockK * 2;
// 16 KiB a stage; twelve keep ~190 KiB of the weight stream in flight per SM.
inline constexpr int kStages = 12;
static_assert(kBlockK * 2 == 128, "a stage's K is one 128-byte swizzled row");
static_assert(kATileBytes % 1024 == 0 && kBTileBytes % 1024 == 0, "128-byte-swizzled tiles on 1024-byte boundaries");

struct StageTiles {
  uint8_t a[kStages][kATileBytes];
  uint8_t b[kStages][kBTileBytes];
  uint64_t full[kStages];   // the producer's arrive.expect_tx
  uint64_t empty[kStages];  // every thread of the consumer warpgroup, once its MMAs on the stage completed
};

// One unit's K loop: acc = A (weight rows) x B^T (the chunk's rows) over kblocks stages from `st`
// (advanced past them); release(stage) frees a stage whose MMAs are done.
template <class Release>
__device__ __forceinline__ void k_loop(StageTiles& s, float (&acc)[32], int kblocks, PipelineState<kStages>& st,
                                       const Release& release) {
  using Mma = ptx::WgmmaBf16<kChunk>;
  PipelineState<kStages> prev = st;
  for (int kb = 0; kb < kblocks; ++kb) {
    ptx::mbar_wait(&s.full[st.stage], st.phase);
    const uint64_t desc_a = ptx::smem_desc_k_major_sw128(&s.a[st.stage][0]);
    const uint64_t desc_b = ptx::smem_desc_k_major_sw128(&s.b[st.stage][0]);
#pragma unroll
    for (int i = 0; i < 32; ++i) ptx::fence_operand(acc[i]);
    ptx::wgmma_fence();
    // A k16 step is 32 bytes along the swizzled row: +2 in the descriptor's 16-byte units.
#pragma unroll
    for (int j = 0; j < kBlockK / 16; ++j) Mma::mma(acc, desc_a + 2 * j, desc_b + 2 * j, kb > 0 || j > 0 ? 1 : 0);
    ptx::wgmma_commit_group();
    ptx::wgmma_wait_group<1>();  // the previous stage's MMAs are done: free it
#pragma unroll
    for (int i = 0; i < 32; ++i) ptx::fence_operand(acc[i]);
    if (kb > 0) {
      release(prev.stage);
      prev.advance();
    }
    st.advance();
  }
  ptx::wgmma_wait_group<0>();
#pragma unroll
  for (int i = 0; i < 32; ++i) ptx::fence_operand(acc[i]);
  if (kblocks > 0) release(prev.stage);
}

}  // namespace loom::gemm::bf16_weights_on_m
