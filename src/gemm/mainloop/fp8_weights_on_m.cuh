// Mainloop with weight rows on the MMA's M side ("swap AB"): 64 weight rows per consumer warpgroup,
// 128 per CTA, and an expert's token rows on the N side in chunks of 16, 32, 64 or 128 picked at
// run time to fit the expert's rows, so an expert with 4 routed rows does not pad a 64-row MMA.
//
// Per 128-wide K block (one stage of the ring: the 128 x 128 weight tile and the chunk's
// activation tile): four wgmma m64nWk32 into a block accumulator, then on the CUDA cores
// final += block * weight_scale * activation_scale(column), the promotion that bounds the tensor
// cores' reduced-precision FP8 accumulation. Two block accumulators alternate, so the MMAs of
// block kb + 1 run while block kb is promoted.
//
// The token source says where a block's activation scales are (Source::scale_read, block_scale);
// the epilogue takes the finished chunk (Epilogue::finish).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "diag/chain_trace.cuh"
#include "gemm/kernel/grouped_gemm_sm90.cuh"
#include "gemm/promote_rows.cuh"
#include "gemm/ring_cursor.cuh"
#include "gemm/scheduler/expert_walk.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"

namespace loom::gemm {

inline constexpr int kBlockK = 128;    // K per pipeline stage: exactly one scale block
inline constexpr int kBlockM = 128;    // weight rows per unit: two consumer warpgroups of 64
inline constexpr int kMaxChunk = 128;  // widest token chunk (the MMA's N)
inline constexpr int kWidthCount = 4;  // chunk widths 16, 32, 64, 128
inline constexpr int kWTileBytes = kBlockM * kBlockK;
static_assert(kWTileBytes % 1024 == 0, "128-byte-swizzled TMA tiles must start on 1024-byte boundaries");
static_assert(kBlockK == 128, "one pipeline stage must be exactly one 128-wide scale block");
static_assert((16 << (kWidthCount - 1)) == kMaxChunk, "widths 16..kMaxChunk double each step");

__host__ __device__ constexpr int width_index(int rows) { return rows <= 16 ? 0 : rows <= 32 ? 1 : rows <= 64 ? 2 : 3; }

// The shared storage of a weights-on-M kernel, composed of its parts' storage as members (not as
// base classes: a conversion to a base class is null-checked in the generated code, and the
// select hides from the compiler that the address is in shared memory, so accesses through it
// become generic loads and stores with 64-bit addresses). First the ring's tiles, 1024-byte
// aligned: per stage the weight tile and an activation tile of the kernel's widest chunk.
template <int kStagesT, int kXRows, class SourceStorage, class EpilogueStorage, class WalkStorageT>
struct alignas(1024) WeightsOnMStorage {
  static constexpr int kStages = kStagesT;
  static_assert(kXRows % 8 == 0 && kXRows * kBlockK % 1024 == 0, "whole 1024-byte swizzle atoms per tile");
  uint8_t w[kStages][kWTileBytes];
  uint8_t x[kStages][kXRows * kBlockK];
  SourceStorage src;
  EpilogueStorage epi;
  uint64_t full[kStages];   // the producer's loads have landed
  uint64_t empty[kStages];  // every consumer warp is done with the stage
  WalkStorageT walk;
};

template <class S>
__device__ __forceinline__ void init_stage_barriers(S& s, uint32_t full_arrivals) {
  for (int i = 0; i < S::kStages; ++i) {
    ptx::mbar_init(&s.full[i], full_arrivals);
    ptx::mbar_init(&s.empty[i], kConsumerWarps * kReleaseArrivalsPerWarp);
  }
}

// One weight tile (128 rows of the expert's [N, K] block from `row`, K block kb) by TMA, with the
// L2 evict-first hint when the weight stream outgrows L2 (WeightsOnMConfig::weights_evict_first).
// Holds references to the kernel's parameters, not copies: a copy would keep a register of the
// producer's small budget for the whole walk.
struct WeightTiles {
  const CUtensorMap& map;
  const int& evict_first;
  uint64_t policy;
  bool first = true;  // trace builds: the first load is stamped

  __device__ WeightTiles(const CUtensorMap& m, const int& evict) : map(m), evict_first(evict) {
    policy = ptx::l2_policy_evict_first();
  }
  __device__ __forceinline__ void load(uint8_t* dst, int kb, int row, uint64_t* bar) {
#ifdef LOOM_CHAIN_TRACE
    if (first) LOOM_TRACE(kGemmFirstTma);
    first = false;
#endif
    if (evict_first)
      ptx::tma_load_2d_hint(dst, &map, kb * kBlockK, row, bar, policy);
    else
      ptx::tma_load_2d(dst, &map, kb * kBlockK, row, bar);
  }
};

// Waits for a stage and issues its four k32 MMAs into `acc` (overwriting it: scale-d = 0 first).
// gather: the activation tile arrived through cp.async (generic proxy); wgmma reads it through the
// async proxy.
template <int W, class S>
__device__ __forceinline__ void issue_block(S& s, float (&acc)[W / 2], uint32_t stage, uint32_t phase,
                                            int consumer, bool gather) {
  ptx::mbar_wait(&s.full[stage], phase);
  if (threadIdx.x == 128) LOOM_TRACE(kGemmStageFull);
  if (gather) ptx::fence_proxy_async_shared();
  const uint64_t desc_a = ptx::smem_desc_k_major_sw128(&s.w[stage][consumer * 64 * kBlockK]);
  const uint64_t desc_b = ptx::smem_desc_k_major_sw128(&s.x[stage][0]);
#pragma unroll
  for (int i = 0; i < W / 2; ++i) ptx::fence_operand(acc[i]);
  ptx::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kBlockK / 32; ++ks) {
    // +32 bytes along K per k32 step = +2 in the descriptor's 16-byte address units.
    ptx::WgmmaE4M3<W>::mma(acc, desc_a + 2 * ks, desc_b + 2 * ks, ks > 0 ? 1 : 0);
  }
  ptx::wgmma_commit_group();
}

// Where a block's activation scales are: in the block's stage (buf = stage), or in a scale slot the
// block waits for (parity `phase`) when `wait` (Source::scale_read).
struct ScaleRead {
  uint32_t buf, phase;
  bool wait;
};

// Once `acc`'s group is done (kPending newer groups may stay in flight): read the block's
// activation scales, release the stage, promote final += acc * weight_scale * activation_scale.
template <int W, int kPending, class Src, class S>
__device__ __forceinline__ void promote_block(S& s, float (&acc)[W / 2], float (&final_acc)[W / 2],
                                              uint32_t stage, const ScaleRead& sr, int kb, int scale_shift, float sw) {
  const int lane = threadIdx.x % 32, q = lane % 4;
  ptx::wgmma_wait_group<kPending>();
#pragma unroll
  for (int i = 0; i < W / 2; ++i) ptx::fence_operand(acc[i]);
  Src::wait_scales(s, sr);
  float sa[W / 4];
#pragma unroll
  for (int j = 0; j < W / 8; ++j) {
    sa[2 * j] = Src::block_scale(s, sr.buf, 8 * j + 2 * q, kb, scale_shift) * sw;
    sa[2 * j + 1] = Src::block_scale(s, sr.buf, 8 * j + 2 * q + 1, kb, scale_shift) * sw;
  }
  // This thread's shared-memory reads of this stage (wgmma operands, scales) are done: free it.
  release_slot(&s.empty[stage]);
  promote_columns<W>(final_acc, acc, sa);
}

// The consumer state that runs on across chunks: the stage ring's cursor, the source's (scale
// slots) and the epilogue's (staging handshake).
template <int kStages, class Src, class Epi>
struct ConsumerCursors {
  PipelineState<kStages> ps;
  typename Src::ConsumerState src;
  typename Epi::ConsumerState epi;
};

// One chunk (up to W of an expert's rows against 128 weight rows) on one consumer warpgroup: the K
// loop with per-block promotion, then the weighted epilogue.
template <int W, class Src, class Epi, class S, class Cursors, class A>
__device__ __forceinline__ void consume_chunk(S& s, Cursors& cur_state, const A& a, const Unit& unit, int row0,
                                              int chunk_rows, int consumer) {
  const int e = unit.expert, nb = unit.nb;
  using Mma = ptx::WgmmaE4M3<W>;
  constexpr int kRegs = Mma::kRegs;
  constexpr bool gather = Src::kGathered;
  const int lane = threadIdx.x % 32;
  // This thread's row of the chunk: its weight and token, loaded now so the latency hides behind
  // the K loop (loading them in the epilogue put a round trip on every chunk).
  const int wg_row = threadIdx.x % 128;
  // No row weights (ffn GEMM 1's stored rows): weight 1.
  const float row_w = wg_row >= chunk_rows ? 0.0f : a.row_weight ? __ldcg(a.row_weight + row0 + wg_row) : 1.0f;
  const int32_t row_t = wg_row < chunk_rows && a.atomic ? __ldcg(a.row_token + row0 + wg_row) : 0;
  const int scale_shift = Src::scale_shift(row0);
  float final_acc[kRegs];
  const float* wscale = a.weight_scales + (int64_t(e) * a.nblocks + nb) * a.kblocks;
  // The unit's weight scales, 32 K blocks at a time, one per lane: a global load per stage would
  // put its latency on every stage's critical path.
  float sw_lane = unit.kb_begin + lane < unit.kb_end ? __ldg(wscale + unit.kb_begin + lane) : 0.0f;
  auto weight_scale = [&](int kb) {
    const int i = kb - unit.kb_begin;
    if (i > 0 && i % 32 == 0) sw_lane = kb + lane < unit.kb_end ? __ldg(wscale + kb + lane) : 0.0f;
    return __shfl_sync(0xffffffffu, sw_lane, i % 32);
  };
#pragma unroll
  for (int i = 0; i < kRegs; ++i) final_acc[i] = 0.0f;
  // Two block accumulators: the MMAs of K block kb+1 run while block kb is promoted. Unrolled by
  // two so each accumulator is a compile-time choice (register arrays stay registers). At W=128
  // the three accumulators take 192 of the consumer's 224 registers; they fit (no spills) since
  // shared memory is addressed as such (shared_storage).
  float acc0[kRegs], acc1[kRegs];
#pragma unroll
  for (int i = 0; i < kRegs; ++i) acc0[i] = 0.0f, acc1[i] = 0.0f;
  int kb = unit.kb_begin;
  auto& ps = cur_state.ps;
  using Ring = std::remove_reference_t<decltype(ps)>;
  Ring cur = ps;
  issue_block<W>(s, acc0, cur.stage, cur.phase, consumer, gather);
  while (true) {
    Ring next = cur;
    next.advance();
    if (kb + 1 < unit.kb_end) {
      issue_block<W>(s, acc1, next.stage, next.phase, consumer, gather);
      promote_block<W, 1, Src>(s, acc0, final_acc, cur.stage, Src::scale_read(cur_state.src, cur.stage, kb, unit), kb,
                               scale_shift, weight_scale(kb));
      Src::scale_done(s, cur_state.src, kb, unit);
    } else {
      promote_block<W, 0, Src>(s, acc0, final_acc, cur.stage, Src::scale_read(cur_state.src, cur.stage, kb, unit), kb,
                               scale_shift, weight_scale(kb));
      Src::scale_done(s, cur_state.src, kb, unit);
      cur = next;
      break;
    }
    ++kb;
    cur = next;
    next.advance();
    if (kb + 1 < unit.kb_end) {
      issue_block<W>(s, acc0, next.stage, next.phase, consumer, gather);
      promote_block<W, 1, Src>(s, acc1, final_acc, cur.stage, Src::scale_read(cur_state.src, cur.stage, kb, unit), kb,
                               scale_shift, weight_scale(kb));
      Src::scale_done(s, cur_state.src, kb, unit);
    } else {
      promote_block<W, 0, Src>(s, acc1, final_acc, cur.stage, Src::scale_read(cur_state.src, cur.stage, kb, unit), kb,
                               scale_shift, weight_scale(kb));
      Src::scale_done(s, cur_state.src, kb, unit);
      cur = next;
      break;
    }
    ++kb;
    cur = next;
  }
  ps = cur;
  Epi::template finish<W>(s, cur_state.epi, a, final_acc, row0, chunk_rows, nb, consumer, row_w, row_t);
}

}  // namespace loom::gemm
