// BF16 mainloop with an expert's rows on the MMA's M side: per stage a 128 x 64 tile of the sorted
// rows (A) and a 256 x 64 tile of weight rows (B), both by TMA with 128-byte swizzle; consumer
// warpgroup c multiplies rows 64c..64c+63 by all 256 weight rows, four m64n256k16 per stage into
// one fp32 accumulator over all of K. The MMAs of a stage stay in flight while the next stage's are
// issued; a stage is freed once its MMAs have completed.
#pragma once

#include <cstdint>

#include "gemm/gemm_bf16.hpp"
#include "gemm/ring_cursor.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"

namespace loom::gemm::bf16_tokens_on_m {

inline constexpr int kBlockK = kBf16BlockK;
inline constexpr int kTileRows = kBf16TileRows;
inline constexpr int kTileCols = kBf16TileCols;
inline constexpr int kBoxRows = 128;  // TMA boxes of 128 rows: A is one, B two (act: gate and up block)
inline constexpr int kATileBytes = kTileRows * kBlockK * 2;
inline constexpr int kBTileBytes = kTileCols * kBlockK * 2;
inline constexpr int kBoxBytes = kBoxRows * kBlockK * 2;
static_assert(kBlockK * 2 == 128, "a stage's K is one 128-byte swizzled row");
static_assert(kTileRows == 2 * 64, "two consumer warpgroups of 64 rows");
static_assert(kTileCols == 2 * kBoxRows, "B is two 128-row boxes (gate and up blocks in the act epilogue)");
static_assert(kATileBytes % 1024 == 0 && kBoxBytes % 1024 == 0, "128-byte-swizzled tiles on 1024-byte boundaries");

// 48 KiB a stage: three or four fit beside the scheduler's tables (and the epilogue's staging).
template <int kStagesT>
struct StageTiles {
  static constexpr int kStages = kStagesT;
  static_assert(kStages >= 2, "a ring refills one stage while the MMAs read another");
  uint8_t a[kStages][kATileBytes];
  uint8_t b[kStages][kBTileBytes];
  uint64_t full[kStages];   // the producer's arrive.expect_tx
  uint64_t empty[kStages];  // every consumer thread, once its MMAs on the stage have completed (and, in a
                            // 2-CTA cluster, each of the peer's consumer warps: its B half lands here too)
};

// One unit's K loop for consumer warpgroup `consumer`: acc = A rows x B^T over kblocks stages,
// starting at stage `st` (advanced past them); release(stage) frees a stage whose MMAs are done.
// kGenericA: A arrived by cp.async (generic proxy), which the MMAs read through the async proxy.
template <bool kGenericA, class Tiles, class Release>
__device__ __forceinline__ void k_loop(Tiles& s, float (&acc)[128], int kblocks, int consumer,
                                       PipelineState<Tiles::kStages>& st, const Release& release) {
  using Mma = ptx::WgmmaBf16<kTileCols>;
  PipelineState<Tiles::kStages> prev = st;
  for (int kb = 0; kb < kblocks; ++kb) {
    ptx::mbar_wait(&s.full[st.stage], st.phase);
    if constexpr (kGenericA) ptx::fence_proxy_async_shared();
    const uint64_t desc_a = ptx::smem_desc_k_major_sw128(&s.a[st.stage][consumer * 64 * kBlockK * 2]);
    const uint64_t desc_b = ptx::smem_desc_k_major_sw128(&s.b[st.stage][0]);
#pragma unroll
    for (int i = 0; i < 128; ++i) ptx::fence_operand(acc[i]);
    ptx::wgmma_fence();
    // A k16 step is 32 bytes along the swizzled row: +2 in the descriptor's 16-byte units. The
    // first MMA of the unit overwrites the accumulator.
#pragma unroll
    for (int j = 0; j < kBlockK / 16; ++j) Mma::mma(acc, desc_a + 2 * j, desc_b + 2 * j, kb > 0 || j > 0 ? 1 : 0);
    ptx::wgmma_commit_group();
    // The previous stage's MMAs are done once at most this stage's group is pending: free it.
    ptx::wgmma_wait_group<1>();
#pragma unroll
    for (int i = 0; i < 128; ++i) ptx::fence_operand(acc[i]);
    if (kb > 0) {
      release(prev.stage);
      prev.advance();
    }
    st.advance();
  }
  ptx::wgmma_wait_group<0>();
#pragma unroll
  for (int i = 0; i < 128; ++i) ptx::fence_operand(acc[i]);
  if (kblocks > 0) release(prev.stage);
}

}  // namespace loom::gemm::bf16_tokens_on_m
