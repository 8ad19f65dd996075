// BF16 mainloop with an expert's rows on the MMA's M side: per stage a 128 x 64 tile of the sorted
// rows (A) and a 256 x 64 tile of weight rows (B), both by TMA with 128-byte swizzle; consumer
// warpgroup c multiplies rows 64c..64c+63 by all 256 weight rows, four m64n256k16 per stage into
// one fp32 accumulator over all of K. The MMAs of a stage stay in flight while the next stage's are
// issued; a stage is freed once its MMAs have completed.
#pragma once

#include <cstdint>
#include <utility>

#include "gemm/gemm_bf16.hpp"
#include "gemm/mainloop/bf16_k_loop.cuh"
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

// One unit's K loop for consumer warpgroup `consumer` (its 64 rows of A, all of B): acc = A rows x
// B^T, as bf16_k_loop.
template <bool kGenericA, class Tiles, class Release>
__device__ __forceinline__ void k_loop(Tiles& s, float (&acc)[128], int kblocks, int consumer,
                                       PipelineState<Tiles::kStages>& st, const Release& release) {
  auto descs = [&](uint32_t stage) {
    return std::pair{ptx::smem_desc_k_major_sw128(&s.a[stage][consumer * 64 * kBlockK * 2]),
                     ptx::smem_desc_k_major_sw128(&s.b[stage][0])};
  };
  bf16_k_loop<ptx::WgmmaBf16<kTileCols>, kGenericA>(s.full, acc, kblocks, st, descs, release);
}

}  // namespace loom::gemm::bf16_tokens_on_m
