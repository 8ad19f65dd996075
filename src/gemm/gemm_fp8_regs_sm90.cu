#include "gemm/gemm_fp8_regs_sm90.cuh"

#include <cuda.h>

#include <algorithm>
#include <cstdio>
#include <type_traits>

#include "common/chain_trace.cuh"
#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "common/tensor_map.hpp"
#include "gemm/promote_rows.cuh"
#include "gemm/expert_scan.cuh"
#include "gemm/ring_cursor.cuh"
#include "gemm/work_queue.cuh"
#include "contract/device_layout.hpp"
#include "ptx/clock.cuh"
#include "ptx/cp_async.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/pdl.cuh"
#include "ptx/red.cuh"
#include "ptx/setmaxnreg.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"

namespace loom {

namespace {

// Phase profile (builds with -DLOOM_PHASE_PROFILE=ON only; `loom bench --phase-profile N`): cycle
// sums per phase, added up over every CTA of the profiled launches. Rows of g_phase: consumer
// warpgroups 0 and 1 (their thread 0), then the weight producer (thread 0) and the combine warp
// (lane 0). Elsewhere the macros are empty and the kernel is the production one.
enum Phase : int {
  kPhCtas,                 // CTA launches profiled (producer row)
  kPhTotal,                // cycles from the role's start to its end
  kPhUnits, kPhIdleUnits,  // units with rows of this warpgroup / without (stages passed)
  kPhUnitStart,            // a unit's start: the next unit's record, the ring's copies for it
  kPhKLoop,                // the unit's K loop, start to last promotion
  kPhKLoopTall, kPhUnitsTall,  // ... of units of more than 64 rows (both warpgroups compute)
  kPhEpilogue,             // the unit's end: staging for the combine (or the stores)
  kPhOutWait,              // ... of which the wait for the staging block to be free
  kPhIdle,                 // units without rows, passed
  kPhFullWait,             // K block: the stage's full barrier
  kPhFragments,            // ... the A fragments regrouped (waits for the block's copies)
  kPhMmaIssue,             // ... the four MMAs issued and committed
  kPhReload,               // ... the ring slot's refill issued
  kPhMmaWait,              // ... the MMAs' completion
  kPhPromote,              // ... the promotion into the final accumulator
  kPhEmptyWait,            // producer: waits for a free stage
  kPhStages,               // producer: stages issued
  kPhCombineWait,          // combine warp: waits for a staged block
  kPhCombineRead,          // combine warp: waits for its bulk reductions to read the block
  kPhBlocks,               // combine warp: blocks taken
  kPhNanos,                // producer: global-timer nanoseconds over its total (the SM clock rate)
  kPhCount
};
#ifdef LOOM_PHASE_PROFILE
__device__ unsigned long long g_phase[4][kPhCount];
#define LOOM_PHASE_CLOCK() ptx::clock32()
#define LOOM_PHASE_ADD(arr, i, v) ((arr)[i] += (v))
#else
#define LOOM_PHASE_CLOCK() 0u
#define LOOM_PHASE_ADD(arr, i, v) ((void)0)
#endif
// A role's phase sums, added into its row of g_phase by one thread at the role's end.
using PhaseSums = uint32_t[kPhCount];
__device__ __forceinline__ void add_phase_sums([[maybe_unused]] int row, [[maybe_unused]] const PhaseSums& sums) {
#ifdef LOOM_PHASE_PROFILE
  for (int i = 0; i < kPhCount; ++i)
    if (sums[i] != 0) atomicAdd(&g_phase[row][i], (unsigned long long)sums[i]);
#endif
}

constexpr int kBlockK = 128;     // K per stage: one scale block
constexpr int kTileRows = kRegsTileRows;  // an expert's token rows per tile: two consumer warpgroups of 64
constexpr int kTileCols = 128;   // weight rows per tile: the MMA's N, one weight-scale block
// Weight tiles in flight per SM (16 KiB each): 4, 6 and 8 measured equal, 12 far slower (T=8192
// GEMM alone 307-311 vs 247-249 us; docs/perf.md, thirteenth session). With the activations in
// registers, more shared memory cost the kernel its L1 (8 stages beside the combine staging: T=8192
// GEMM alone 306 vs 235 us; the largest carve-out, L1 ~28 KiB: 290 vs 223; fifteenth session); the
// shared-memory activation ring below (48 KiB, ~196 KiB in all) measured faster, not slower.
constexpr int kStages = 4;
// K blocks of activations in flight per consumer thread (the ring; tall tiles, the wide ones keep
// 2), in shared memory, one cp.async group per block, so that a block waits only for its own
// copies. As register loads, all of the ring's loads shared one scoreboard and each block's
// regrouping waited for the newest (issued one block earlier): the ring in shared memory, e2e
// T=2048 / 3072 / 8192 92.7-92.8 / 105.6-105.7 / 229.6-231.3 vs 94.3-94.4 / 109.2-109.4 / 247.0-247.4
// us; 2 slots 93.6-93.7 / 107.1-107.3 / 239.1-239.3, 4 no faster (docs/perf.md, thirty-sixth
// session). K need not be a multiple of it: the slot of a unit's first block rotates (rot in the
// consumer loop).
constexpr int kRing = kRegsRing;
constexpr int kThreads = 384;    // warpgroup 0: producer warps (TMA, unit records, scales); 1, 2: consumers
constexpr int kConsumerWarps = 8;
constexpr int kMaxK = kRegsMaxK;  // weight scales per unit held in shared memory
static_assert(kMaxK % kBlockK == 0, "whole K blocks");
constexpr int kWTileBytes = kTileCols * kBlockK;
constexpr uint32_t kLaunchRegs = 168, kProducerRegs = 40, kConsumerRegs = 232;

static_assert(kWTileBytes % 1024 == 0, "128-byte-swizzled TMA tiles start on 1024-byte boundaries");
static_assert(kBlockK == 4 * 32, "four k32 MMAs per K block; a quad lane's 32 fragment bytes cover them");
static_assert(kTileRows == 2 * 64 && kThreads == 3 * 128, "one producer and two consumer warpgroups of 64 rows");
static_assert(kTileCols == 128, "the MMA wrapper is m64n128k32; one weight-scale block per tile");
static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= kThreads * kLaunchRegs, "the CTA's register pool");

// A unit's rows as the consumers need them, loaded ahead by producer warp 1 (so no global load
// of the consumers shares a scoreboard with their activation loads in flight).
constexpr int kMetaSlots = 3;  // the loader runs two units ahead: a consumer reads the next unit at the start of one
struct UnitMeta {
  int32_t token[kTileRows];   // 0 past the tile's rows (never copied: the consumers zero-fill them)
  float weight[kTileRows];
  float wscale[kMaxK / kBlockK];
  float wscale2[kMaxK / kBlockK];  // wide tiles: the second weight block's
  int32_t row0, rows, nb;  // first sorted row, rows in the tile (0..128), weight block; rows < 0: the end
  int32_t expert;          // the weight producer's dynamic units read it here
};

// Tile shapes (the kernel's template argument):
//   tall (kWide = false): 128 rows x 128 weight rows; consumer warpgroup c takes rows 64c..64c+63.
//   wide (kWide = true):  64 rows x 256 weight rows (two weight blocks nb, nb + 1); both consumer
//     warpgroups take the same 64 rows, warpgroup c weight block nb + c. Each K block then fills
//     two ring stages (nb's tile, then nb + 1's); a warpgroup passes over the other's stage. For
//     experts of about 64 rows, where a tall tile leaves its second warpgroup idle.
template <bool kWide>
struct Shape {
  static constexpr int kRows = kWide ? 64 : kTileRows;    // an expert's rows per tile
  static constexpr int kBlocks = kWide ? 2 : 1;            // weight blocks (ring stages) per K block
};

// The combine in atomic mode: a consumer warpgroup's finished 64 x 128 block of top-k-weighted
// outputs goes to shared memory, and the combine warp (producer warp 3) adds each row into its
// token's output row by one bulk reduction while the warpgroup starts its next unit. Against
// red.global.add.v4.f32 from the consumers' registers (which both warpgroups issued at once, the
// tensor pipe idle meanwhile), e2e T=1280 / 2560 / 4096 / 8192: 101.3 / 127.9 / 166.7 / 264.6 vs
// 102.4 / 130.9 / 171.6 / 276.6 us (docs/perf.md, fifteenth session).
// Floats per staged row: 16 bytes of padding spread a warp's 8 rows over the banks.
constexpr int kOutStride = kTileCols + 4;
static_assert(kOutStride * 4 % 16 == 0, "each staged row starts 16-byte aligned (bulk copies)");
struct alignas(16) OutStage {
  float v[64][kOutStride];
  int32_t token[64];  // the row's token; -1: no row
  int32_t col0, bytes;  // first output column, bytes per row (0: nothing to add)
};

struct alignas(1024) Smem {
  uint8_t w[kStages][kWTileBytes];
  // The activation ring: slot, consumer warpgroup, 16-byte chunk (RowBlock order), thread; each
  // thread copies and reads only its own chunks, and a warp's 32 chunks are 512 contiguous bytes.
  uint4 xring[kRing][2][4][128];
  float xs[kStages][kTileRows];  // the stage's activation scales of the tile's rows (producer warp 2)
  OutStage out[2];                // per consumer warpgroup (atomic mode)
  uint64_t out_full[2];           // the warpgroup's 128 threads, after their stores and proxy fences
  uint64_t out_empty[2];          // the combine warp, once its bulk reductions have read the block
  uint64_t full[kStages];
  uint64_t empty[kStages];
  int32_t tile_start[kGpuMaxExperts + 1];  // row tiles of the experts before e (tile_start[E]: all)
  int32_t expert_row[kGpuMaxExperts];  // expert e's rows are [expert_row[e], expert_end[e])
  int32_t expert_end[kGpuMaxExperts];
  UnitMeta meta[kMetaSlots];
  uint64_t meta_full[kMetaSlots];   // the loader warp's 32 lanes, after their stores
  uint64_t meta_empty[kMetaSlots];  // every consumer thread and warp 2's lanes, after their last read of the unit
};

struct Args {
  const uint8_t* x;       // [x_rows, K] token-order codes in fragment order
  const float* x_scales;  // [K/128, x_rows] (group-major) or [K/512, x_rows, 4] (row quads)
  int64_t x_rows;
  int scales_in_quads;    // ScaleLayout::row_quads
  const float* weight_scales;
  const int32_t* offsets;
  const int32_t* counts;  // expert bins (GemmFp8Params::expert_counts) or nullptr: offsets
  int stride;             // GemmFp8Params::expert_stride
  const int32_t* row_token;
  const float* row_weight;
  float* out;
  int experts, n, k, nblocks, kblocks;
  int atomic;
  int weights_evict_first;  // GemmFp8Config::weights_evict_first
  int x_evict_last;         // GemmFp8Config::x_evict_last
  int32_t* queue;           // dynamic tail (GemmFp8Config::dynamic): two words, zero at launch; nullptr: round robin
};

// Dynamic tail: round robin up to the last kDynamicRounds rounds' worth of units, which CTAs then
// take from a global queue as they finish (SMs stream at unequal rates, and units do not divide
// evenly among the CTAs).
constexpr int kDynamicRounds = 1;

using StageCursor = PipelineState<kStages>;
using MetaCursor = PipelineState<kMetaSlots>;

// Unit u = (row tile, weight blocks): consecutive units share a row tile (its activation rows),
// then an expert (its weights), so CTAs running together read the same lines.
struct Unit {
  int expert, tile, nb;  // nb: the unit's first weight block
};
template <bool kWide>
__device__ __forceinline__ int unit_columns(const Args& a) {  // units per row tile
  return (a.nblocks + Shape<kWide>::kBlocks - 1) / Shape<kWide>::kBlocks;
}
template <bool kWide>
__device__ __forceinline__ Unit decode(const Smem& s, const Args& a, int u) {
  const int cols = unit_columns<kWide>(a);
  const int tile = u / cols;
  // The last expert whose first tile is at or before `tile` (experts without rows share their
  // start with the next one, so the last of them is the one with rows).
  int lo = 0, hi = a.experts - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (s.tile_start[mid] <= tile) lo = mid; else hi = mid - 1;
  }
  return Unit{lo, tile - s.tile_start[lo], (u - tile * cols) * Shape<kWide>::kBlocks};
}

// tile_start from the offsets or bin counts: ceil(rows / tile rows) tiles per expert, an exclusive
// scan by warp 0.
template <bool kWide>
__device__ __forceinline__ void build_tile_starts(Smem& s, const Args& a) {
  constexpr int kRows = Shape<kWide>::kRows;
  for (int e = threadIdx.x; e < a.experts; e += blockDim.x) {
    const int begin = a.counts ? e * a.stride : __ldcg(a.offsets + e);
    const int rows = a.counts ? min(__ldcg(a.counts + e * kBinCountStride), a.stride) : __ldcg(a.offsets + e + 1) - begin;
    s.tile_start[e + 1] = (rows + kRows - 1) / kRows;
    s.expert_row[e] = begin;
    s.expert_end[e] = begin + rows;
  }
  __syncthreads();
  if (threadIdx.x < 32) scan_expert_counts(s.tile_start, a.experts, threadIdx.x);
  __syncthreads();
}

// One K block's activations for this thread: rows r and r + 8, 32 fragment bytes each. (Their
// scales come with the stage.)
struct RowBlock {
  uint4 a_lo, a_hi, b_lo, b_hi;
};

// Copies this thread's chunks of K block kb into its ring slot `slot` (the caller commits the
// group). Row t's group kb at t K + 128 kb; quad lane q's lo bytes at + 16 q (the quad covers
// 0-63), hi at + 64 + 16 q. int32 offsets: the launcher keeps x_rows * K below 2^31. A token < 0
// is a padding row: zero-filled, nothing read (cp.async does not merge the lanes' copies of one
// address, and padding rows read as token 0 made one hot set of L2 lines: T=2048 138 vs 94 us).
__device__ __forceinline__ void copy_block(Smem& s, int slot, int consumer, int wg_thread, const Args& a, int tok_a,
                                           int tok_b, int q, int kb) {
  const uint4* pa = reinterpret_cast<const uint4*>(a.x + (max(tok_a, 0) * a.k + kb * kBlockK + 16 * q));
  const uint4* pb = reinterpret_cast<const uint4*>(a.x + (max(tok_b, 0) * a.k + kb * kBlockK + 16 * q));
  const uint4* src[4] = {pa, pa + 4, pb, pb + 4};
  const uint32_t bytes[4] = {tok_a >= 0 ? 16u : 0u, tok_a >= 0 ? 16u : 0u, tok_b >= 0 ? 16u : 0u, tok_b >= 0 ? 16u : 0u};
  if (a.x_evict_last) {
    const uint64_t policy = ptx::l2_policy_evict_last();
#pragma unroll
    for (int c = 0; c < 4; ++c)
      ptx::cp_async_16_zfill_hint(ptx::smem_u32(&s.xring[slot][consumer][c][wg_thread]), src[c], bytes[c], policy);
  } else {
#pragma unroll
    for (int c = 0; c < 4; ++c)
      ptx::cp_async_16_zfill(ptx::smem_u32(&s.xring[slot][consumer][c][wg_thread]), src[c], bytes[c]);
  }
}

// Waits for the stage (weight tile and scales) and for this thread's copies of the block in ring
// slot `slot` (at most kPendingGroups later groups may be in flight), runs the K block's four MMAs
// with A from the slot, waits for them, frees the stage and returns the two rows' activation scales.
// The MMAs read a regrouped register copy of the slot, so the slot is refilled (reload, which
// commits one group) as soon as they are issued, not after their wait (register ring: T=8192 GEMM
// alone 250 vs 267 us).
template <int kPendingGroups, class Reload>
__device__ __forceinline__ float2 mma_block(Smem& s, float (&acc)[64], int slot, int consumer, int wg_thread,
                                            const StageCursor& st, int tile_row_a, int tile_row_b,
                                            const Reload& reload, [[maybe_unused]] PhaseSums& ph) {
  [[maybe_unused]] const uint32_t ph_wait = LOOM_PHASE_CLOCK();
  ptx::mbar_wait(&s.full[st.stage], st.phase);
  [[maybe_unused]] const uint32_t ph_full = LOOM_PHASE_CLOCK();
  LOOM_PHASE_ADD(ph, kPhFullWait, ph_full - ph_wait);
#ifdef LOOM_CHAIN_TRACE
  // Stage 0 in phase 0: its first fill (and every second lap's; the trace reads the first stamp).
  if (threadIdx.x == 128 && st.stage == 0 && st.phase == 0) LOOM_TRACE(kGemmStageFull);
#endif
  const float2 scales = make_float2(s.xs[st.stage][tile_row_a], s.xs[st.stage][tile_row_b]);
  const uint64_t desc_b = ptx::smem_desc_k_major_sw128(&s.w[st.stage][0]);
  // k32 step j's operand quad: row r's words (j, h = 0), row r + 8's, row r's (j, h = 1), row
  // r + 8's (fragment_word order). Each quad mixes two chunks, so it is assembled here.
  ptx::cp_async_wait<kPendingGroups>();
  RowBlock rb;
  rb.a_lo = s.xring[slot][consumer][0][wg_thread];
  rb.a_hi = s.xring[slot][consumer][1][wg_thread];
  rb.b_lo = s.xring[slot][consumer][2][wg_thread];
  rb.b_hi = s.xring[slot][consumer][3][wg_thread];
  uint32_t frag[4][4];
  ptx::regroup_a_fragments(frag, rb.a_lo, rb.a_hi, rb.b_lo, rb.b_hi, 0u);  // no pin: short shared-memory reads
#ifdef LOOM_PHASE_PROFILE
  const uint32_t ph_frag = ptx::clock32_after(frag[0][0], frag[0][1], frag[3][2], frag[3][3]);
  LOOM_PHASE_ADD(ph, kPhFragments, ph_frag - ph_full);
#endif
#pragma unroll
  for (int i = 0; i < 64; ++i) ptx::fence_operand(acc[i]);
  ptx::wgmma_fence();
#pragma unroll
  for (int j = 0; j < kBlockK / 32; ++j) ptx::WgmmaE4M3RegA128::mma(acc, frag[j], desc_b + 2 * j, j > 0 ? 1 : 0);
  ptx::wgmma_commit_group();
#ifdef LOOM_PHASE_PROFILE
  const uint32_t ph_issued = ptx::clock32();
  LOOM_PHASE_ADD(ph, kPhMmaIssue, ph_issued - ph_frag);
#endif
  reload();
#ifdef LOOM_PHASE_PROFILE
  const uint32_t ph_reloaded = ptx::clock32();
  LOOM_PHASE_ADD(ph, kPhReload, ph_reloaded - ph_issued);
#endif
  ptx::wgmma_wait_group<0>();
#pragma unroll
  for (int i = 0; i < 64; ++i) ptx::fence_operand(acc[i]);
#ifdef LOOM_PHASE_PROFILE
  LOOM_PHASE_ADD(ph, kPhMmaWait, ptx::clock32() - ph_reloaded);
#endif
  // Every lane's MMAs and scale reads are done with the stage: free it.
  __syncwarp();
  if (threadIdx.x % 32 == 0) ptx::mbar_arrive(&s.empty[st.stage]);
  return scales;
}

// Passes over a ring stage another warpgroup computes on: waits for it to fill (so this arrival
// counts in the phase it belongs to) and frees this warp's share.
__device__ __forceinline__ void pass_stage(Smem& s, const StageCursor& st) {
  ptx::mbar_wait(&s.full[st.stage], st.phase);
  __syncwarp();
  if (threadIdx.x % 32 == 0) ptx::mbar_arrive(&s.empty[st.stage]);
}

template <bool kWide>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_fp8_regs_kernel(const __grid_constant__ CUtensorMap weights_map, const Args a) {
  using Sh = Shape<kWide>;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t align_pad = (1024u - uint32_t(reinterpret_cast<uintptr_t>(smem_raw) % 1024u)) % 1024u;
  Smem& s = *reinterpret_cast<Smem*>(smem_raw + align_pad);
  if (threadIdx.x == 0) LOOM_TRACE(kGemmStart);
  if (threadIdx.x == 0) LOOM_TRACE_SM(kGemmSm);
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      ptx::mbar_init(&s.full[i], 1 + 32);  // the weight tile's arrive.expect_tx, warp 2's lanes after their scales
      ptx::mbar_init(&s.empty[i], kConsumerWarps);
    }
    for (int i = 0; i < kMetaSlots; ++i) {
      ptx::mbar_init(&s.meta_full[i], 32);
      ptx::mbar_init(&s.meta_empty[i], 32 * kConsumerWarps + 32);
    }
    for (int c = 0; c < 2; ++c) {
      ptx::mbar_init(&s.out_full[c], 128);
      ptx::mbar_init(&s.out_empty[c], 1);
    }
    ptx::fence_mbar_init();
    ptx::prefetch_tensormap(&weights_map);
  }
  // Everything below reads what the dispatch and quantisation kernels wrote.
  ptx::pdl_wait();
  if (threadIdx.x == 0) LOOM_TRACE(kGemmWaited);
  build_tile_starts<kWide>(s, a);  // its barriers also publish the mbarrier initialisation
  if (threadIdx.x == 0) LOOM_TRACE(kGemmUnits);
  const int units = s.tile_start[a.experts] * unit_columns<kWide>(a);
  // Units below static_end go round robin; the rest come from the queue (none without one).
  const int static_end =
      a.queue != nullptr ? max(1, units / int(gridDim.x) - kDynamicRounds) * int(gridDim.x) : INT32_MAX;

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    ptx::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0) LOOM_TRACE(kGemmProducerRole);
    if (threadIdx.x == 0) {
      [[maybe_unused]] PhaseSums ph = {};
      [[maybe_unused]] const uint32_t ph_start = LOOM_PHASE_CLOCK();
#ifdef LOOM_PHASE_PROFILE
      const uint64_t ns_start = ptx::globaltimer();
#endif
      StageCursor st;
      [[maybe_unused]] bool traced_first_tma = false;  // trace builds: the first TMA only
      const uint64_t evict_first = ptx::l2_policy_evict_first();
      // Round-robin units it decodes itself (no wait for the unit loader at the start); the queue's
      // units it reads from the loader's records, whose slots cannot be refilled before it has: a
      // record is freed only once the consumers have taken every stage of its unit.
      MetaCursor mc;
      for (int u = blockIdx.x;;) {
        Unit unit;
        if (u < static_end) {
          if (u >= units) break;
          unit = decode<kWide>(s, a, u);
          u += gridDim.x;
        } else {
          ptx::mbar_wait(&s.meta_full[mc.stage], mc.phase);
          const UnitMeta& m = s.meta[mc.stage];
          if (m.rows < 0) break;
          unit = Unit{m.expert, 0, m.nb};
        }
        if (!traced_first_tma) LOOM_TRACE(kGemmFirstDecoded);
        mc.advance();
        for (int kb = 0; kb < a.kblocks; ++kb)
#pragma unroll
          for (int j = 0; j < Sh::kBlocks; ++j) {
            // A wide unit past the last weight block (an odd number of them) loads the last one
            // again: the warpgroup that takes it drops every output (columns >= N).
            const int w_row = unit.expert * a.n + min(unit.nb + j, a.nblocks - 1) * kTileCols;
            [[maybe_unused]] const uint32_t ph_wait = LOOM_PHASE_CLOCK();
            ptx::mbar_wait(&s.empty[st.stage], st.phase ^ 1);
            LOOM_PHASE_ADD(ph, kPhEmptyWait, LOOM_PHASE_CLOCK() - ph_wait);
            LOOM_PHASE_ADD(ph, kPhStages, 1u);
            ptx::mbar_arrive_expect_tx(&s.full[st.stage], kWTileBytes);
            if (a.weights_evict_first)
              ptx::tma_load_2d_hint(s.w[st.stage], &weights_map, kb * kBlockK, w_row, &s.full[st.stage], evict_first);
            else
              ptx::tma_load_2d(s.w[st.stage], &weights_map, kb * kBlockK, w_row, &s.full[st.stage]);
            if (st.stage == 0 && st.phase == 0 && !traced_first_tma) LOOM_TRACE(kGemmFirstTma);
            traced_first_tma = true;
            st.advance();
          }
      }
      LOOM_PHASE_ADD(ph, kPhTotal, LOOM_PHASE_CLOCK() - ph_start);
#ifdef LOOM_PHASE_PROFILE
      ph[kPhNanos] = uint32_t(ptx::globaltimer() - ns_start);
#endif
      LOOM_PHASE_ADD(ph, kPhCtas, 1u);
      add_phase_sums(2, ph);
    } else if (threadIdx.x / 32 == 1) {
      // Warp 1: each unit's rows (tokens, top-k weights) and weight scales into the meta ring; it
      // walks the units, fetching each queue index one unit ahead so that the atomic's round trip
      // hides behind the current unit.
      const int lane = threadIdx.x % 32;
      MetaCursor mc;
      for (int u = blockIdx.x;;) {
        ptx::mbar_wait(&s.meta_empty[mc.stage], mc.phase ^ 1);
        UnitMeta& m = s.meta[mc.stage];
        if (u >= units) {
          if (lane == 0) m.rows = -1;
        } else {
          const Unit unit = decode<kWide>(s, a, u);
          const int begin = s.expert_row[unit.expert] + unit.tile * Sh::kRows;
          const int rows = min(Sh::kRows, s.expert_end[unit.expert] - begin);
          for (int i = lane; i < kTileRows; i += 32) {
            m.token[i] = i < rows ? __ldcg(a.row_token + begin + i) : 0;
            m.weight[i] = i < rows ? __ldcg(a.row_weight + begin + i) : 0.0f;
          }
          const float* wscale = a.weight_scales + (int64_t(unit.expert) * a.nblocks + unit.nb) * a.kblocks;
          for (int i = lane; i < a.kblocks; i += 32) m.wscale[i] = __ldg(wscale + i);
          if constexpr (kWide) {
            const float* wscale2 = wscale + (unit.nb + 1 < a.nblocks ? a.kblocks : 0);
            for (int i = lane; i < a.kblocks; i += 32) m.wscale2[i] = __ldg(wscale2 + i);
          }
#ifdef LOOM_CHAIN_TRACE
          if (lane == 0 && u == int(blockIdx.x)) LOOM_TRACE(kGemmFirstRows);
#endif
          if (lane == 0) {
            m.row0 = begin;
            m.rows = rows;
            m.nb = unit.nb;
            m.expert = unit.expert;
          }
        }
        ptx::mbar_arrive(&s.meta_full[mc.stage]);  // release: this lane's stores
        mc.advance();
        if (u >= units) break;
        if (u + int(gridDim.x) < static_end) {
          u += gridDim.x;
        } else {
          u = fetch_work_unit(a.queue, static_end, lane);
        }
      }
      if (a.queue != nullptr && lane == 0) leave_work_queue(a.queue);  // lane 0 made every fetch
    } else if (threadIdx.x / 32 == 2) {
      // Warp 2: each stage's activation scales of the tile's 128 rows into the stage, each lane then
      // arriving on its full barrier, in step with the weight tiles.
      const int lane = threadIdx.x % 32;
      MetaCursor mc;
      StageCursor st;
      while (true) {
        ptx::mbar_wait(&s.meta_full[mc.stage], mc.phase);
        const UnitMeta& m = s.meta[mc.stage];
        if (m.rows < 0) break;
        // A row's scale of block kb: group-major at kb x_rows + token; in row quads at
        // (kb / 4 x_rows + token) 4 + kb % 4, where the quad's other three blocks share its sector,
        // which the L1-cached loads keep for the next three stages (the tile's tokens are scattered:
        // group-major, every stage's scale is a sector of its own from L2).
        const int tok_stride = a.scales_in_quads ? 4 : 1;
        int tok[Sh::kRows / 32];
#pragma unroll
        for (int i = 0; i < Sh::kRows / 32; ++i) tok[i] = m.token[lane + 32 * i] * tok_stride;
        ptx::mbar_arrive(&s.meta_empty[mc.stage]);
        for (int kb = 0; kb < a.kblocks; ++kb) {
          const float* src = a.scales_in_quads ? a.x_scales + int64_t(kb / 4) * a.x_rows * 4 + kb % 4
                                               : a.x_scales + int64_t(kb) * a.x_rows;
#pragma unroll
          for (int j = 0; j < Sh::kBlocks; ++j) {  // a wide unit's two stages of a K block: the same scales
            ptx::mbar_wait(&s.empty[st.stage], st.phase ^ 1);
            // Loads (L1-cached), stores, then the lane's arrival, which releases its stores to the
            // consumers' wait. (By cp.async with an mbarrier arrival, beside the consumers' ring
            // copies: T=2048 / 8192 e2e 96.6 / 237.6-238.5 vs 95.4-95.9 / 235.1-236.6 us.)
            float v[Sh::kRows / 32];
#pragma unroll
            for (int i = 0; i < Sh::kRows / 32; ++i) v[i] = __ldca(src + tok[i]);
#pragma unroll
            for (int i = 0; i < Sh::kRows / 32; ++i) s.xs[st.stage][lane + 32 * i] = v[i];
            ptx::mbar_arrive(&s.full[st.stage]);
            st.advance();
          }
        }
        mc.advance();
      }
    } else if (threadIdx.x / 32 == 3 && a.atomic) {
      // Warp 3: the combine. Units in the consumers' order; per unit, each warpgroup's block, until
      // both warpgroups stage the end of the walk (bytes < 0).
      const int lane = threadIdx.x % 32;
      [[maybe_unused]] PhaseSums ph = {};
      uint32_t phase = 0;
      for (bool end = false; !end;) {
        for (int c = 0; c < 2; ++c) {
          const OutStage& o = s.out[c];
          [[maybe_unused]] const uint32_t ph_wait = LOOM_PHASE_CLOCK();
          ptx::mbar_wait(&s.out_full[c], phase);
          LOOM_PHASE_ADD(ph, kPhCombineWait, LOOM_PHASE_CLOCK() - ph_wait);
          LOOM_PHASE_ADD(ph, kPhBlocks, 1u);
          const int bytes = o.bytes, col0 = o.col0;
          end = bytes < 0;
          if (bytes > 0)
            for (int i = lane; i < 64; i += 32) {
              const int token = o.token[i];
              if (token >= 0)
                ptx::bulk_reduce_add_f32(a.out + int64_t(token) * a.n + col0, &o.v[i][0], uint32_t(bytes));
            }
          ptx::bulk_commit();
          [[maybe_unused]] const uint32_t ph_read = LOOM_PHASE_CLOCK();
          ptx::bulk_wait_read();  // this lane's reductions have read the block
          LOOM_PHASE_ADD(ph, kPhCombineRead, LOOM_PHASE_CLOCK() - ph_read);
          __syncwarp();
          if (lane == 0) ptx::mbar_arrive(&s.out_empty[c]);
        }
        phase ^= 1;
      }
      ptx::bulk_wait();  // and have completed, before the CTA exits
      if (lane == 0) add_phase_sums(3, ph);
    }
  } else {
    ptx::setmaxnreg_inc<kConsumerRegs>();
    [[maybe_unused]] PhaseSums ph = {};
    [[maybe_unused]] const uint32_t ph_start = LOOM_PHASE_CLOCK();
    // The wide kernel keeps a ring of 2 (with 3, as a register ring, T=1536 ran 0.5-0.7 us slower)
    // over an even number of K blocks, so it never rotates. With the ring in shared memory neither
    // kernel spills (the register ring's forms spilled 14 / 60 and 8 / 8 bytes).
    constexpr int kRingT = kWide ? 2 : kRing;
    const int consumer = warpgroup - 1, lane = threadIdx.x % 32, q = lane % 4, wg_thread = threadIdx.x % 128;
    uint32_t out_phase = 0;  // atomic mode: the parity of this warpgroup's next staged block
    [[maybe_unused]] bool traced_epilogue = false;  // trace builds
    const int row_a = 16 * (threadIdx.x / 32 % 4) + lane / 4, row_b = row_a + 8;  // in the warpgroup's 64
    StageCursor st;
    MetaCursor mc;
    // This warpgroup's first row in a tile, and its rows of a unit (<= 0: none).
    const int row_base = kWide ? 0 : 64 * consumer;
    auto wg_rows_of = [&](const UnitMeta& m) { return min(64, m.rows - row_base); };
    static_assert(kRingT <= kRing, "the ring's slots in shared memory");
    ptx::mbar_wait(&s.meta_full[mc.stage], mc.phase);
    // The ring slot of the unit's K block 0: block kb sits in slot (kb + rot) % kRingT, so a unit's
    // last blocks can load the next unit's first ones into the slots they free whatever K is.
    int rot = 0;
    {
      const UnitMeta& m = s.meta[mc.stage];
      if (wg_rows_of(m) > 0)
#pragma unroll
        for (int i = 0; i < kRingT; ++i) {
          copy_block(s, i, consumer, wg_thread, a, row_base + row_a < m.rows ? m.token[row_base + row_a] : -1,
                     row_base + row_b < m.rows ? m.token[row_base + row_b] : -1, q, i);
          ptx::cp_async_commit();
        }
    }
    while (s.meta[mc.stage].rows >= 0) {
      [[maybe_unused]] const uint32_t ph_unit = LOOM_PHASE_CLOCK();
      const UnitMeta& m = s.meta[mc.stage];
      const uint32_t cur_slot = mc.stage;
      mc.advance();
      // The next unit (the loader is two ahead: no wait in the steady state): its first blocks are
      // loaded into the ring slots this unit's last blocks free.
      ptx::mbar_wait(&s.meta_full[mc.stage], mc.phase);
      const UnitMeta& next = s.meta[mc.stage];
      const bool next_has_rows = next.rows >= 0 && wg_rows_of(next) > 0;
      const int next_tok_a = row_base + row_a < next.rows ? next.token[row_base + row_a] : -1;
      const int next_tok_b = row_base + row_b < next.rows ? next.token[row_base + row_b] : -1;
      const int wg_rows = wg_rows_of(m);
      if (wg_rows <= 0) {
        // No rows here (the expert's last tile is at most half full): keep the stage ring in step.
        for (int kb = 0; kb < a.kblocks * Sh::kBlocks; ++kb) {
          pass_stage(s, st);
          st.advance();
        }
        if (next_has_rows)
#pragma unroll
          for (int i = 0; i < kRingT; ++i) {
            copy_block(s, i, consumer, wg_thread, a, next_tok_a, next_tok_b, q, i);
            ptx::cp_async_commit();
          }
        rot = 0;
        ptx::mbar_arrive(&s.meta_empty[cur_slot]);
        if (a.atomic) {  // the combine warp takes a block per unit and warpgroup: an empty one
          ptx::mbar_wait(&s.out_empty[consumer], out_phase ^ 1);
          if (wg_thread == 0) s.out[consumer].bytes = 0;
          ptx::mbar_arrive(&s.out_full[consumer]);
          out_phase ^= 1;
        }
        LOOM_PHASE_ADD(ph, kPhIdle, LOOM_PHASE_CLOCK() - ph_unit);
        LOOM_PHASE_ADD(ph, kPhIdleUnits, 1u);
        continue;
      }
      const int tok_a = row_base + row_a < m.rows ? m.token[row_base + row_a] : -1;
      const int tok_b = row_base + row_b < m.rows ? m.token[row_base + row_b] : -1;
      float final_acc[64], acc[64];
#pragma unroll
      for (int i = 0; i < 64; ++i) final_acc[i] = 0.0f;
      // K blocks in steps of kRingT, the loop instantiated once per rotation (as in the register
      // ring's measured form) so that every ring slot's offset is a compile-time constant.
      auto k_loop = [&](auto rotation) {
        constexpr int kRot = decltype(rotation)::value;
        for (int kb0 = 0; kb0 < a.kblocks; kb0 += kRingT) {
#pragma unroll
          for (int i = 0; i < kRingT; ++i) {
            const int kb = kb0 + i;
            if (kb >= a.kblocks) break;
            const int slot = (i + kRot) % kRingT;
            const float sw = kWide && consumer == 1 ? m.wscale2[kb] : m.wscale[kb];
            // A wide unit's K block: warpgroup 0 computes on the first stage, 1 on the second.
            if (kWide && consumer == 1) {
              pass_stage(s, st);
              st.advance();
            }
            const float2 xs = mma_block<kRingT - 1>(s, acc, slot, consumer, wg_thread, st, row_base + row_a,
                                                     row_base + row_b, [&] {
              // One group per K block, empty or not, so that the kRingT - 1 groups left pending are
              // always the blocks after this one.
              if (kb + kRingT < a.kblocks)
                copy_block(s, slot, consumer, wg_thread, a, tok_a, tok_b, q, kb + kRingT);
              else if (next_has_rows)
                copy_block(s, slot, consumer, wg_thread, a, next_tok_a, next_tok_b, q, kb + kRingT - a.kblocks);
              ptx::cp_async_commit();
            }, ph);
            [[maybe_unused]] const uint32_t ph_promote = LOOM_PHASE_CLOCK();
            const float scale_a = xs.x * sw, scale_b = xs.y * sw;
            st.advance();
            if (kWide && consumer == 0) {
              pass_stage(s, st);
              st.advance();
            }
            promote_rows(final_acc, acc, scale_a, scale_b);
#ifdef LOOM_PHASE_PROFILE
            LOOM_PHASE_ADD(ph, kPhPromote,
                           ptx::clock32_after(__float_as_uint(final_acc[0]), __float_as_uint(final_acc[21]),
                                              __float_as_uint(final_acc[42]), __float_as_uint(final_acc[63])) -
                               ph_promote);
#endif
          }
        }
      };
      static_assert(kRingT >= 2 && kRingT <= 3, "one k_loop instantiation per rotation below");
      [[maybe_unused]] const uint32_t ph_loop = LOOM_PHASE_CLOCK();
      LOOM_PHASE_ADD(ph, kPhUnitStart, ph_loop - ph_unit);
      if constexpr (kWide) {
        // An even number of K blocks (the launcher checks): the rotation stays 0.
        k_loop(std::integral_constant<int, 0>{});
      } else {
        if (rot == 0)
          k_loop(std::integral_constant<int, 0>{});
        else if (kRingT == 2 || rot == 1)
          k_loop(std::integral_constant<int, 1>{});
        else
          k_loop(std::integral_constant<int, 2 % kRingT>{});
        rot = (rot + a.kblocks) % kRingT;  // the next unit's block 0 went where this unit's block kblocks would
      }

      [[maybe_unused]] const uint32_t ph_end = LOOM_PHASE_CLOCK();
      LOOM_PHASE_ADD(ph, kPhKLoop, ph_end - ph_loop);
      LOOM_PHASE_ADD(ph, kPhUnits, 1u);
      if (m.rows > 64) {
        LOOM_PHASE_ADD(ph, kPhKLoopTall, ph_end - ph_loop);
        LOOM_PHASE_ADD(ph, kPhUnitsTall, 1u);
      }
#ifdef LOOM_CHAIN_TRACE
      if (threadIdx.x == 128 && !traced_epilogue) LOOM_TRACE(kGemmEpilogue);  // the first unit's K loop done
      traced_epilogue = true;
#endif
      if (a.atomic) {
        // Weighted outputs into this warpgroup's staging block (the tile's meta is read before its
        // slot is freed); the combine warp adds them into the token rows.
        OutStage& o = s.out[consumer];
        const float wt_a = m.weight[row_base + row_a], wt_b = m.weight[row_base + row_b];
        const int token = wg_thread < 64 && wg_thread < wg_rows ? m.token[row_base + wg_thread] : -1;
        const int nb = m.nb + (kWide ? consumer : 0);
        ptx::mbar_arrive(&s.meta_empty[cur_slot]);
        [[maybe_unused]] const uint32_t ph_wait = LOOM_PHASE_CLOCK();
        ptx::mbar_wait(&s.out_empty[consumer], out_phase ^ 1);  // its previous block has been read
        LOOM_PHASE_ADD(ph, kPhOutWait, LOOM_PHASE_CLOCK() - ph_wait);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          *reinterpret_cast<float2*>(&o.v[row_a][8 * j + 2 * q]) =
              make_float2(wt_a * final_acc[4 * j + 0], wt_a * final_acc[4 * j + 1]);
          *reinterpret_cast<float2*>(&o.v[row_b][8 * j + 2 * q]) =
              make_float2(wt_b * final_acc[4 * j + 2], wt_b * final_acc[4 * j + 3]);
        }
        if (wg_thread < 64) o.token[wg_thread] = token;
        if (wg_thread == 0) {
          o.col0 = nb * kTileCols;
          o.bytes = nb < a.nblocks ? min(kTileCols, a.n - nb * kTileCols) * 4 : 0;
        }
        ptx::fence_proxy_async_shared();  // this thread's stores, before the async proxy reads them
        ptx::mbar_arrive(&s.out_full[consumer]);
        out_phase ^= 1;
        LOOM_PHASE_ADD(ph, kPhEpilogue, LOOM_PHASE_CLOCK() - ph_end);
        continue;
      }
      // Store mode: lanes q and q ^ 1 swap halves so that each holds four consecutive outputs of one
      // row (even q: row r, odd q: row r + 8), one 16-byte store each.
      const bool even = q % 2 == 0;
      const int my_row = row_base + (even ? row_a : row_b);  // in the tile
      const bool ok = my_row - row_base < wg_rows;
      const float wt = m.weight[my_row];
      float* dst = a.out + int64_t(m.row0 + my_row) * a.n;
      const int nb = m.nb + (kWide ? consumer : 0);
      ptx::mbar_arrive(&s.meta_empty[cur_slot]);  // every read of the unit's meta is done
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const float give0 = even ? final_acc[4 * j + 2] : final_acc[4 * j + 0];
        const float give1 = even ? final_acc[4 * j + 3] : final_acc[4 * j + 1];
        const float got0 = __shfl_xor_sync(0xffffffffu, give0, 1);
        const float got1 = __shfl_xor_sync(0xffffffffu, give1, 1);
        const float v0 = even ? final_acc[4 * j + 0] : got0, v1 = even ? final_acc[4 * j + 1] : got1;
        const float v2 = even ? got0 : final_acc[4 * j + 2], v3 = even ? got1 : final_acc[4 * j + 3];
        const int n = nb * kTileCols + 8 * j + 4 * (q / 2);
        if (ok && n < a.n) *reinterpret_cast<float4*>(dst + n) = make_float4(wt * v0, wt * v1, wt * v2, wt * v3);
      }
      LOOM_PHASE_ADD(ph, kPhEpilogue, LOOM_PHASE_CLOCK() - ph_end);
    }
    if (a.atomic) {  // the end of the walk, for the combine warp
      ptx::mbar_wait(&s.out_empty[consumer], out_phase ^ 1);
      if (wg_thread == 0) s.out[consumer].bytes = -1;
      ptx::mbar_arrive(&s.out_full[consumer]);
    }
    LOOM_PHASE_ADD(ph, kPhTotal, LOOM_PHASE_CLOCK() - ph_start);
    if (wg_thread == 0) add_phase_sums(consumer, ph);
  }
  ptx::pdl_launch_dependents();
  if (threadIdx.x % 32 == 0) LOOM_TRACE(kGemmEnd);  // each warp's end (the combine warp's after its reductions)
}

}  // namespace

void launch_gemm_fp8_regs(const GemmFp8Params& p, const GemmFp8Config& cfg, const DeviceInfo& device,
                          cudaStream_t stream, bool pdl) {
  const std::string who = "fp8 GEMM (rows in registers): ";
  if (cfg.x_source != XSource::token_fragments) throw Error(who + "needs XSource::token_fragments");
  if (p.n <= 0 || p.k <= 0 || p.n % 16 || p.k % kBlockK || p.k > kMaxK)
    throw Error(who + "N must be a positive multiple of 16 and K a multiple of 128 up to " + std::to_string(kMaxK) +
                " (got N=" + std::to_string(p.n) + ", K=" + std::to_string(p.k) + ")");
  if (p.experts <= 0 || p.experts > kGpuMaxExperts)
    throw Error(who + "experts must be in [1, " + std::to_string(kGpuMaxExperts) + "]");
  if (p.k < kRing * kBlockK)
    throw Error(who + "K must be at least " + std::to_string(kRing * kBlockK) + " (the register ring), got " +
                std::to_string(p.k));
  if (cfg.wide_tiles && p.k % (2 * kBlockK))
    throw Error(who + "wide tiles need K a multiple of " + std::to_string(2 * kBlockK) + " (their ring of 2 does not "
                "rotate), got " + std::to_string(p.k));
  if (int64_t(p.experts) * p.n >= (int64_t(1) << 31) || p.x_rows <= 0 || p.x_rows * p.k >= (int64_t(1) << 31))
    throw Error(who + "sizes exceed the kernel's 32-bit coordinates");
  if (!p.weights || !p.weight_scales || !p.x || !p.x_scales || !(p.offsets || p.expert_counts) || !p.row_token ||
      !p.row_weight || !p.out)
    throw Error(who + "null device pointer");
  if (p.expert_counts && p.combine != CombineMode::atomic)
    throw Error(who + "expert bins hold no sorted row index for the store epilogue: atomic combine only");
  if (p.expert_counts && (p.expert_stride <= 0 || int64_t(p.experts) * p.expert_stride >= (int64_t(1) << 31)))
    throw Error(who + "expert bins need a positive stride with experts * stride below 2^31, got stride " +
                std::to_string(p.expert_stride));
  if (reinterpret_cast<uintptr_t>(p.x) % 16 || reinterpret_cast<uintptr_t>(p.x_scales) % 4)
    throw Error(who + "the activation rows must be 16-byte aligned");
  if (cfg.split_k != 1 || cfg.balanced || cfg.handoff_epilogue ||
      cfg.x_evict_first)
    throw Error(who + "takes none of split-K, balanced shares, the hand-off epilogue or an activation eviction "
                      "hint: " + cfg.str());
  if (cfg.dynamic && !p.work_queue) throw Error(who + "the dynamic tail needs a work_queue");
  Args a{p.x, p.x_scales, p.x_rows, p.x_scale_layout == ScaleLayout::row_quads ? 1 : 0, p.weight_scales, p.offsets,
         p.expert_counts, p.expert_stride, p.row_token,
         p.row_weight, p.out,
         p.experts, p.n, p.k, (p.n + kTileCols - 1) / kTileCols, p.k / kBlockK,
         p.combine == CombineMode::atomic ? 1 : 0, cfg.weights_evict_first ? 1 : 0, cfg.x_evict_last ? 1 : 0,
         cfg.dynamic ? p.work_queue : nullptr};
  // L2 fetches exactly the 128-byte line of each box row it misses on: widened to 256 bytes (the
  // usual promotion) the weight stream ran 8 % slower (`loom stream-probe`: 70.4 vs 65.1 us over
  // the preset's 256 MiB; e2e T=1024 / 2048 / 4096 82.0 / 95.0 / 139.3 vs 86.0 / 97.2 / 142.4 us;
  // docs/perf.md, twenty-third session).
  const CUtensorMap map = make_tensor_map_2d(p.weights, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, uint64_t(p.experts) * p.n,
                                             p.k, p.k, kTileCols, kBlockK, TmaSwizzle::b128, TmaL2Promotion::b128);
  static_assert(sizeof(Smem) + 1024 <= 227 * 1024, "shared memory budget of one sm_90 CTA");
  const size_t smem = sizeof(Smem) + 1024;  // + alignment slack for the 1024-byte base
  ensure_dynamic_smem(gemm_fp8_regs_kernel<false>, smem);
  ensure_dynamic_smem(gemm_fp8_regs_kernel<true>, smem);
  // Persistent: one CTA per SM; the row tiles are known only on the device.
  if (cfg.wide_tiles)
    launch_kernel(gemm_fp8_regs_kernel<true>, dim3(device.sm_count), dim3(kThreads), smem, stream, pdl, map, a);
  else
    launch_kernel(gemm_fp8_regs_kernel<false>, dim3(device.sm_count), dim3(kThreads), smem, stream, pdl, map, a);
}

bool gemm_regs_phase_profile_built() {
#ifdef LOOM_PHASE_PROFILE
  return true;
#else
  return false;
#endif
}

void gemm_regs_phase_profile_reset() {
#ifdef LOOM_PHASE_PROFILE
  static const unsigned long long zero[4][kPhCount] = {};
  LOOM_CUDA_CHECK(cudaMemcpyToSymbol(g_phase, zero, sizeof zero));
#endif
}

void gemm_regs_phase_profile_print([[maybe_unused]] std::ostream& log, [[maybe_unused]] int kblocks) {
#ifdef LOOM_PHASE_PROFILE
  unsigned long long v[4][kPhCount];
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  LOOM_CUDA_CHECK(cudaMemcpyFromSymbol(v, g_phase, sizeof v));
  const double ctas = double(v[2][kPhCtas]);
  if (ctas == 0) {
    log << "  phase profile: the register-loaded GEMM did not run\n";
    return;
  }
  auto per_cta = [&](int row, int ph) { return double(v[row][ph]) / ctas; };
  auto ratio = [](double num, double den) { return den > 0 ? num / den : 0.0; };
  char line[320];
  log << "  phase profile of the register-loaded GEMM (" << ctas << " CTA launches; cycles per CTA launch unless stated):\n";
  std::snprintf(line, sizeof line, "    %-44s %12s %12s\n", "consumer warpgroup", "0", "1");
  log << line;
  const std::pair<const char*, int> rows[] = {
      {"total", kPhTotal},          {"units computed", kPhUnits},   {"units passed (no rows)", kPhIdleUnits},
      {"unit starts", kPhUnitStart}, {"K loops", kPhKLoop},           {"epilogues", kPhEpilogue},
      {"... waits for the staging block", kPhOutWait}, {"passed units", kPhIdle}};
  for (const auto& [name, ph] : rows) {
    std::snprintf(line, sizeof line, "    %-44s %12.1f %12.1f\n", name, per_cta(0, ph), per_cta(1, ph));
    log << line;
  }
  log << "    per K block computed (cycles):\n";
  const std::pair<const char*, int> steps[] = {{"full-barrier wait", kPhFullWait}, {"A fragments ready", kPhFragments},
                                               {"MMAs issued", kPhMmaIssue},        {"ring refill issued", kPhReload},
                                               {"MMAs complete", kPhMmaWait},       {"promotion", kPhPromote}};
  for (const auto& [name, ph] : steps) {
    std::snprintf(line, sizeof line, "      %-42s %12.0f %12.0f\n", name,
                  ratio(double(v[0][ph]), double(v[0][kPhUnits]) * kblocks),
                  ratio(double(v[1][ph]), double(v[1][kPhUnits]) * kblocks));
    log << line;
  }
  for (int tall = 1; tall >= 0; --tall) {
    double out[2];
    for (int c = 0; c < 2; ++c) {
      const double loop = tall ? double(v[c][kPhKLoopTall]) : double(v[c][kPhKLoop] - v[c][kPhKLoopTall]);
      const double units = tall ? double(v[c][kPhUnitsTall]) : double(v[c][kPhUnits] - v[c][kPhUnitsTall]);
      out[c] = ratio(loop, units * kblocks);
    }
    std::snprintf(line, sizeof line, "      %-42s %12.0f %12.0f\n",
                  tall ? "K loop, units of > 64 rows" : "K loop, units of <= 64 rows", out[0], out[1]);
    log << line;
  }
  std::snprintf(line, sizeof line,
                "    weight producer: total %.1f, waiting for a free stage %.1f, %.1f stages; combine warp: %.1f "
                "blocks, waiting for one %.1f, for its reductions to read it %.1f\n",
                per_cta(2, kPhTotal), per_cta(2, kPhEmptyWait), per_cta(2, kPhStages), per_cta(3, kPhBlocks),
                per_cta(3, kPhCombineWait), per_cta(3, kPhCombineRead));
  log << line;
  // The SM clock while the kernel runs (nvidia-smi's samples, 200 ms apart, showed 1980 MHz while
  // this read 1.66-1.76 GHz; docs/perf.md, thirty-ninth session).
  std::snprintf(line, sizeof line, "    weight producer: %.2f us per CTA by the global timer, so %.3f GHz (cycles / ns)\n",
                per_cta(2, kPhNanos) / 1000.0, ratio(double(v[2][kPhTotal]), double(v[2][kPhNanos])));
  log << line;
#endif
}

}  // namespace loom
