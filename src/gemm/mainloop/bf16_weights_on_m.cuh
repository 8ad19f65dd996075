// BF16 mainloop with weight rows on the MMA's M side, for small batches (decode): per stage a
// 64 x 64 tile of weight rows (A) and a 64 x 64 tile of an expert's sorted rows (B, the tokens on
// N), both by TMA with 128-byte swizzle; one consumer warpgroup issues four m64n64k16 per stage into
// one fp32 accumulator over all of K. An expert's few rows then cost a 64-wide MMA, not a 128-row
// tile, and its weights leave HBM in 64-row units that spread over every SM.
#pragma once

#include <cstdint>
#include <utility>

#include "gemm/mainloop/bf16_k_loop.cuh"
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

// One unit's K loop: acc = A (weight rows) x B^T (the chunk's rows), as bf16_k_loop.
template <class Release>
__device__ __forceinline__ void k_loop(StageTiles& s, float (&acc)[32], int kblocks, PipelineState<kStages>& st,
                                       const Release& release) {
  auto descs = [&](uint32_t stage) {
    return std::pair{ptx::smem_desc_k_major_sw128(&s.a[stage][0]), ptx::smem_desc_k_major_sw128(&s.b[stage][0])};
  };
  bf16_k_loop<ptx::WgmmaBf16<kChunk>, false>(s.full, acc, kblocks, st, descs, release);
}

}  // namespace loom::gemm::bf16_weights_on_m
