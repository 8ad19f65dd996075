// Epilogue of the tokens-on-M kernel for ffn GEMM 1 (TokensOnMConfig::act): a wide unit's two
// warpgroups hold the same 64 rows, warpgroup 0 over gate block b and warpgroup 1 over up block b
// (the same 128 columns of I), each thread the same fragment positions. Warpgroup 1 hands its up
// values over in shared memory; warpgroup 0 computes act = SiLU(gate)*up in fp32, the row's amax
// over the block (its 128 columns are the quad's 4 lanes x 32), the 1x128 scale, the E4M3 codes
// (bit for bit quantize_1x128_ref of those fp32 values: IEEE division by the scale), and writes
// codes and scales into the intermediate's sorted rows, as GEMM 2 reads them.
#pragma once

#include <cstdint>

#include "contract/device_layout.hpp"
#include "gemm/epilogue/combine_staged.cuh"
#include "ptx/barrier.cuh"
#include "quant/quant_gather_device.cuh"

namespace loom::gemm::tokens_on_m {

// Named barriers of the hand-over (ids 1 and 2 are free in the tokens-on-M kernel): the up values
// staged, and read (both warpgroups sync on each: warpgroup 1 is already waiting on the second when
// warpgroup 0 reaches it, so a sync costs warpgroup 0 what an arrive would, and racecheck, which
// does not take barrier.arrive as ordering the reads before it, sees the hand-over).
inline constexpr uint32_t kActFullBarrier = 1, kActEmptyBarrier = 2;
static_assert(64 * 128 <= 64 * kOutStride, "the up values fit one staged block");

// Warpgroup 1: its up values into the staging block, thread-major (conflict-free), then the
// hand-over. Its reads of the unit's record are done before.
template <class S>
__device__ __forceinline__ void act_hand_over(S& s, const float (&up)[64]) {
  float* stage = &s.epi.out[0].v[0][0];
  const int wg_thread = threadIdx.x % 128;
#pragma unroll
  for (int i = 0; i < 64; ++i) stage[i * 128 + wg_thread] = up[i];
  ptx::named_barrier_sync_unaligned(kActFullBarrier, 256);
  // Warpgroup 0 has read them before this returns: the next unit may overwrite the block.
  ptx::named_barrier_sync_unaligned(kActEmptyBarrier, 256);
}

// Warpgroup 0: the unit's intermediate from its gate values and the staged up values. row0 / rows:
// the unit's first sorted row and its rows; b: the I block.
template <class S, class A>
__device__ __forceinline__ void act_quantize(S& s, const A& a, const float (&gate)[64], int row0, int rows, int b,
                                             int row_a, int row_b) {
  const float* stage = &s.epi.out[0].v[0][0];
  const int wg_thread = threadIdx.x % 128, q = threadIdx.x % 4;
  ptx::named_barrier_sync_unaligned(kActFullBarrier, 256);
  float x[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) x[i] = stage[i * 128 + wg_thread];
  ptx::named_barrier_sync_unaligned(kActEmptyBarrier, 256);
  // x[4j + e]: row_a (e = 0, 1) or row_b (e = 2, 3), I column 128 b + 8 j + 2 q + (e & 1); columns
  // past I (a partial last block) are 0: amax-neutral, never stored.
  float amax_a = 0.0f, amax_b = 0.0f;
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = 128 * b + 8 * j + 2 * q + (e & 1);
      const float v = col < a.inter ? quant_detail::silu_mul(gate[4 * j + e], x[4 * j + e]) : 0.0f;
      x[4 * j + e] = v;
      // fmaxf skips a NaN (as the reference's comparisons do).
      if (e < 2)
        amax_a = fmaxf(amax_a, fabsf(v));
      else
        amax_b = fmaxf(amax_b, fabsf(v));
    }
#pragma unroll
  for (int off = 1; off <= 2; off *= 2) {
    amax_a = fmaxf(amax_a, __shfl_xor_sync(0xffffffffu, amax_a, off));
    amax_b = fmaxf(amax_b, __shfl_xor_sync(0xffffffffu, amax_b, off));
  }
  using quant_detail::kE4M3MaxF, quant_detail::kScaleFloor;
  const float scale_a = __fdiv_rn(fmaxf(amax_a, kScaleFloor), kE4M3MaxF);
  const float scale_b = __fdiv_rn(fmaxf(amax_b, kScaleFloor), kE4M3MaxF);
  if (a.act_values != nullptr)
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int row = e < 2 ? row_a : row_b, col = 128 * b + 8 * j + 2 * q;
        if (row < rows && col < a.inter)
          *reinterpret_cast<float2*>(a.act_values + int64_t(row0 + row) * a.inter + col) =
              make_float2(x[4 * j + e], x[4 * j + e + 1]);
      }
  // Codes: lanes q and q ^ 1 pair up their 2-byte codes into 4-byte words, even q for row_a and odd
  // q for row_b: word w = 2 j + q / 2 of the row's 128-byte group.
  const bool even = q % 2 == 0;
  const int row = even ? row_a : row_b;
  const bool row_ok = row < rows;
  uint8_t* group = a.act_codes + int64_t(row0 + row) * a.inter + 128 * b;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const uint32_t pa = quant_detail::e4m3x2(__fdiv_rn(x[4 * j + 0], scale_a), __fdiv_rn(x[4 * j + 1], scale_a));
    const uint32_t pb = quant_detail::e4m3x2(__fdiv_rn(x[4 * j + 2], scale_b), __fdiv_rn(x[4 * j + 3], scale_b));
    const uint32_t got = __shfl_xor_sync(0xffffffffu, even ? pb : pa, 1);  // even: the partner's pa; odd: its pb
    const uint32_t word = even ? pa | (got << 16) : got | (pb << 16);
    const int w = 2 * j + q / 2;
    if (row_ok && 128 * b + 4 * w < a.inter)
      reinterpret_cast<uint32_t*>(group)[a.act_fragments ? fragment_word(w) : w] = word;
  }
  const ScaleLayout layout = a.act_quads ? ScaleLayout::row_quads : ScaleLayout::group_major;
  if (q < 2 && row_ok) a.act_scales[scale_index(layout, b, row0 + row, a.act_rows)] = even ? scale_a : scale_b;
}

}  // namespace loom::gemm::tokens_on_m
