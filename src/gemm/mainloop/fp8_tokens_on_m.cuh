// Mainloop with an expert's token rows on the MMA's M side: tiles of 128 rows x 128 weight rows
// (tall; consumer warpgroup c takes rows 64c..64c+63) or 64 rows x 256 weight rows (wide; both
// warpgroups take the same 64 rows, warpgroup c weight block nb + c, for experts of about 64 rows
// where a tall tile leaves its second warpgroup idle). A comes from registers (the token source's
// fragments, regrouped from the shared-memory ring each thread fills), B (the weights) from the
// TMA ring; per 128-wide K block four wgmma m64n128k32, then the promotion by row (the tokens'
// activation scales) times the weight block's scale.
//
// Probe: the phase profile's hook (lab/phase_profile; NoProbe here, which compiles to nothing).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "diag/chain_trace.cuh"
#include "gemm/gemm_fp8.hpp"
#include "gemm/kernel/grouped_gemm_sm90.cuh"
#include "gemm/ring_cursor.cuh"
#include "ptx/cp_async.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"

namespace loom::gemm::tokens_on_m {

inline constexpr int kBlockK = kFp8BlockK;     // K per stage: one scale block
inline constexpr int kTileRows = kRegsTileRows;  // an expert's token rows per tall tile: two warpgroups of 64
inline constexpr int kTileCols = kFp8BlockRows;  // weight rows per tile: the MMA's N, one weight-scale block
// Weight tiles in flight per SM (16 KiB each): 4, 6 and 8 measured equal, 12 far slower; more shared
// memory than the ring and the activation ring cost the kernel its L1.
inline constexpr int kStages = 4;
// K blocks of activations in flight per consumer thread (tall tiles; the wide ones keep 2), in
// shared memory, one cp.async group per block, so that a block waits only for its own copies.
inline constexpr int kRing = kRegsRing;
inline constexpr int kMaxK = kRegsMaxK;  // weight scales per unit held in the unit's record
inline constexpr int kWTileBytes = kTileCols * kBlockK;
static_assert(kMaxK % kBlockK == 0, "whole K blocks");
static_assert(kWTileBytes % 1024 == 0, "128-byte-swizzled TMA tiles start on 1024-byte boundaries");
static_assert(kBlockK == 4 * 32, "four k32 MMAs per K block; a quad lane's 32 fragment bytes cover them");
static_assert(kTileRows == 2 * 64, "two consumer warpgroups of 64 rows");
static_assert(kTileCols == 128, "the MMA wrapper is m64n128k32; one weight-scale block per tile");

// Tile shapes (the kernel's template argument).
template <bool kWide>
struct TileShape {
  static constexpr int kRows = kWide ? 64 : kTileRows;  // an expert's rows per tile
  static constexpr int kBlocks = kWide ? 2 : 1;          // weight blocks (ring stages) per K block
};

using StageCursor = PipelineState<kStages>;

// The phase profile's points (lab/phase_profile reads them; the product's NoProbe ignores them):
// sums of cycles per phase over every CTA. Rows: consumer warpgroups 0 and 1 (their thread 0), the
// weight producer (thread 0) and the combine warp (lane 0).
enum Phase : int {
  kPhCtas,                     // CTA launches profiled (producer row)
  kPhTotal,                    // cycles from the role's start to its end
  kPhUnits, kPhIdleUnits,      // units with rows of this warpgroup / without (stages passed)
  kPhUnitStart,                // a unit's start: the next unit's record, the ring's copies for it
  kPhKLoop,                    // the unit's K loop, start to last promotion
  kPhKLoopTall, kPhUnitsTall,  // ... of units of more than 64 rows (both warpgroups compute)
  kPhEpilogue,                 // the unit's end: staging for the combine (or the stores)
  kPhOutWait,                  // ... of which the wait for the staging block to be free
  kPhIdle,                     // units without rows, passed
  kPhFullWait,                 // K block: the stage's full barrier
  kPhFragments,                // ... the A fragments regrouped (waits for the block's copies)
  kPhMmaIssue,                 // ... the four MMAs issued and committed
  kPhReload,                   // ... the ring slot's refill issued
  kPhMmaWait,                  // ... the MMAs' completion
  kPhPromote,                  // ... the promotion into the final accumulator
  kPhEmptyWait,                // producer: waits for a free stage
  kPhStages,                   // producer: stages issued
  kPhCombineWait,              // combine warp: waits for a staged block
  kPhCombineRead,              // combine warp: waits for its bulk reductions to read the block
  kPhBlocks,                   // combine warp: blocks taken
  kPhNanos,                    // producer: global-timer nanoseconds over its total (the SM clock rate)
  kPhCount
};

// The product's probe: every hook compiles to nothing.
struct NoProbe {
  struct Sums {};
  static __device__ __forceinline__ uint32_t clock() { return 0; }
  static __device__ __forceinline__ uint32_t clock_after(uint32_t, uint32_t, uint32_t, uint32_t) { return 0; }
  static __device__ __forceinline__ uint64_t nanos() { return 0; }
  static __device__ __forceinline__ void add(Sums&, int, uint32_t) {}
  static __device__ __forceinline__ void set(Sums&, int, uint32_t) {}
  static __device__ __forceinline__ void flush(int, const Sums&) {}
};

// One K block's activations for this thread: rows r and r + 8, 32 fragment bytes each. (Their
// scales come with the stage.)
struct RowBlock {
  uint4 a_lo, a_hi, b_lo, b_hi;
};

// Waits for the stage (weight tile and scales) and for this thread's copies of the block in ring
// slot `slot` (at most kPendingGroups later groups may be in flight), runs the K block's four MMAs
// with A from the slot, waits for them, frees the stage and returns the two rows' activation scales.
// The MMAs read a regrouped register copy of the slot, so the slot is refilled (reload, which
// commits one group) as soon as they are issued, not after their wait.
template <int kPendingGroups, class Probe, class S, class Reload>
__device__ __forceinline__ float2 mma_block(S& s, float (&acc)[64], int slot, int consumer, int wg_thread,
                                            const StageCursor& st, int tile_row_a, int tile_row_b,
                                            const Reload& reload, [[maybe_unused]] typename Probe::Sums& ph) {
  [[maybe_unused]] const uint32_t ph_wait = Probe::clock();
  ptx::mbar_wait(&s.full[st.stage], st.phase);
  [[maybe_unused]] const uint32_t ph_full = Probe::clock();
  Probe::add(ph, kPhFullWait, ph_full - ph_wait);
#ifdef LOOM_CHAIN_TRACE
  // Stage 0 in phase 0: its first fill (and every second lap's; the trace reads the first stamp).
  if (threadIdx.x == 128 && st.stage == 0 && st.phase == 0) LOOM_TRACE(kGemmStageFull);
#endif
  const float2 scales = make_float2(s.src.xs[st.stage][tile_row_a], s.src.xs[st.stage][tile_row_b]);
  const uint64_t desc_b = ptx::smem_desc_k_major_sw128(&s.w[st.stage][0]);
  // k32 step j's operand quad: row r's words (j, h = 0), row r + 8's, row r's (j, h = 1), row
  // r + 8's (fragment_word order). Each quad mixes two chunks, so it is assembled here.
  ptx::cp_async_wait<kPendingGroups>();
  RowBlock rb;
  rb.a_lo = s.src.xring[slot][consumer][0][wg_thread];
  rb.a_hi = s.src.xring[slot][consumer][1][wg_thread];
  rb.b_lo = s.src.xring[slot][consumer][2][wg_thread];
  rb.b_hi = s.src.xring[slot][consumer][3][wg_thread];
  uint32_t frag[4][4];
  ptx::regroup_a_fragments(frag, rb.a_lo, rb.a_hi, rb.b_lo, rb.b_hi, 0u);  // no pin: short shared-memory reads
  [[maybe_unused]] const uint32_t ph_frag = Probe::clock_after(frag[0][0], frag[0][1], frag[3][2], frag[3][3]);
  Probe::add(ph, kPhFragments, ph_frag - ph_full);
#pragma unroll
  for (int i = 0; i < 64; ++i) ptx::fence_operand(acc[i]);
  ptx::wgmma_fence();
#pragma unroll
  for (int j = 0; j < kBlockK / 32; ++j) ptx::WgmmaE4M3RegA128::mma(acc, frag[j], desc_b + 2 * j, j > 0 ? 1 : 0);
  ptx::wgmma_commit_group();
  [[maybe_unused]] const uint32_t ph_issued = Probe::clock();
  Probe::add(ph, kPhMmaIssue, ph_issued - ph_frag);
  reload();
  [[maybe_unused]] const uint32_t ph_reloaded = Probe::clock();
  Probe::add(ph, kPhReload, ph_reloaded - ph_issued);
  ptx::wgmma_wait_group<0>();
#pragma unroll
  for (int i = 0; i < 64; ++i) ptx::fence_operand(acc[i]);
  Probe::add(ph, kPhMmaWait, Probe::clock() - ph_reloaded);
  // This thread's MMAs and scale reads are done with the stage: free it.
  release_slot(&s.empty[st.stage]);
  return scales;
}

// Passes over a ring stage another warpgroup computes on: waits for it to fill (so this arrival
// counts in the phase it belongs to) and frees this warp's share.
template <class S>
__device__ __forceinline__ void pass_stage(S& s, const StageCursor& st) {
  ptx::mbar_wait(&s.full[st.stage], st.phase);
  release_slot(&s.empty[st.stage]);
}

}  // namespace loom::gemm::tokens_on_m
