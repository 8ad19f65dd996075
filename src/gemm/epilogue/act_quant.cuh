// Epilogue of the tokens-on-M kernel for ffn GEMM 1 (TokensOnMConfig::act): a wide unit's two
// warpgroups hold the same 64 rows, warpgroup 0 over gate block b and warpgroup 1 over up block b
// (the same 128 columns of I), each thread the same fragment positions. Each warpgroup computes
// half of the block's columns (its half of the fragment's column groups): it hands the other
// warpgroup the operand values of the other half in shared memory and takes the other operand's
// values of its own half. Then act = SiLU(gate)*up in fp32, the row's amax over the block (the
// two halves' maxima met in shared memory), the 1x128 scale, the E4M3 codes (bit for bit
// quantize_1x128_ref of those fp32 values: the IEEE quotient's code, by the scale's reciprocal and
// one correction, divide_by_scale), and the codes and scales into the intermediate's sorted rows,
// as GEMM 2 reads them.
#pragma once

#include <cstdint>

#include "contract/device_layout.hpp"
#include "gemm/epilogue/combine_staged.cuh"
#include "ptx/barrier.cuh"
#include "quant/quant_gather_device.cuh"
#include "quant/scale_divide.hpp"

namespace loom::gemm::tokens_on_m {

// Named barriers of the exchange (ids 1 and 2 are free in the tokens-on-M kernel): the halves
// staged, and the row maxima staged. After the second, both warpgroups have read the staged
// halves, so the next unit may overwrite them; the maxima are read before the next unit's first
// barrier, which both warpgroups must reach before either writes maxima again.
inline constexpr uint32_t kActFullBarrier = 1, kActAmaxBarrier = 2;
// The staged halves: [warpgroup h][32 values][128 threads], the other operand's values of the
// columns warpgroup h computes (thread-major: conflict-free); in the first staged block.
static_assert(2 * 32 * 128 <= 64 * kOutStride, "both halves fit one staged block");
// The row maxima: [warpgroup][64 rows], in the second.
static_assert(2 * 64 <= 64 * kOutStride, "the maxima fit the other staged block");

// Warpgroup kMine's half: fragment column groups j in [8 kMine, 8 kMine + 8) of its 16, acc
// positions 32 kMine .. + 31 (acc[4j + e]: row_a (e = 0, 1) or row_b (e = 2, 3), I column
// 128 b + 8 j + 2 q + (e & 1)). row0 / rows: the unit's first sorted row and its rows; b: the I
// block.
template <int kMine, class S, class A>
__device__ __forceinline__ void act_half(S& s, const A& a, const float (&acc)[64], int row0, int rows, int b,
                                         int row_a, int row_b) {
  constexpr int kOther = 1 - kMine;
  float* halves = &s.epi.out[0].v[0][0];
  float* maxima = &s.epi.out[1].v[0][0];
  const int t = threadIdx.x % 128, q = threadIdx.x % 4;
#pragma unroll
  for (int i = 0; i < 32; ++i) halves[(kOther * 32 + i) * 128 + t] = acc[32 * kOther + i];
  ptx::named_barrier_sync_unaligned(kActFullBarrier, 256);
  // x[i]: acc position 32 kMine + i, column 128 b + 8 (8 kMine + i / 4) + 2 q + (i & 1); columns
  // past I (a partial last block) are 0: amax-neutral, never stored.
  float x[32];
  float amax_a = 0.0f, amax_b = 0.0f;
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const float mine = acc[32 * kMine + i], theirs = halves[(kMine * 32 + i) * 128 + t];
    const float gate = kMine == 0 ? mine : theirs, up = kMine == 0 ? theirs : mine;
    const int col = 128 * b + 8 * (8 * kMine + i / 4) + 2 * q + (i & 1);
    const float v = col < a.inter ? quant_detail::silu_mul(gate, up) : 0.0f;
    x[i] = v;
    // fmaxf skips a NaN (as the reference's comparisons do).
    if (i % 4 < 2)
      amax_a = fmaxf(amax_a, fabsf(v));
    else
      amax_b = fmaxf(amax_b, fabsf(v));
  }
#pragma unroll
  for (int off = 1; off <= 2; off *= 2) {
    amax_a = fmaxf(amax_a, __shfl_xor_sync(0xffffffffu, amax_a, off));
    amax_b = fmaxf(amax_b, __shfl_xor_sync(0xffffffffu, amax_b, off));
  }
  if (q == 0) {
    maxima[kMine * 64 + row_a] = amax_a;
    maxima[kMine * 64 + row_b] = amax_b;
  }
  ptx::named_barrier_sync_unaligned(kActAmaxBarrier, 256);
  amax_a = fmaxf(amax_a, maxima[kOther * 64 + row_a]);
  amax_b = fmaxf(amax_b, maxima[kOther * 64 + row_b]);
  using quant_detail::kE4M3MaxF, quant_detail::kScaleFloor;
  const float scale_a = __fdiv_rn(fmaxf(amax_a, kScaleFloor), kE4M3MaxF);
  const float scale_b = __fdiv_rn(fmaxf(amax_b, kScaleFloor), kE4M3MaxF);
  if (a.act_values != nullptr)
#pragma unroll
    for (int i = 0; i < 32; i += 2) {
      const int row = i % 4 < 2 ? row_a : row_b, col = 128 * b + 8 * (8 * kMine + i / 4) + 2 * q;
      if (row < rows && col < a.inter)
        *reinterpret_cast<float2*>(a.act_values + int64_t(row0 + row) * a.inter + col) = make_float2(x[i], x[i + 1]);
    }
  // x / scale: by the reciprocal and one correction (no per-element range check, so the 32
  // quotients interleave); an infinite scale (an infinite act value) divides.
  if (scale_a < INFINITY && scale_b < INFINITY) {
    const float rcp_a = __frcp_rn(scale_a), rcp_b = __frcp_rn(scale_b);
#pragma unroll
    for (int i = 0; i < 32; ++i)
      x[i] = i % 4 < 2 ? divide_by_scale(x[i], scale_a, rcp_a) : divide_by_scale(x[i], scale_b, rcp_b);
  } else {
#pragma unroll
    for (int i = 0; i < 32; ++i) x[i] = __fdiv_rn(x[i], i % 4 < 2 ? scale_a : scale_b);
  }
  // Codes: lanes q and q ^ 1 pair up their 2-byte codes into 4-byte words, even q for row_a and odd
  // q for row_b: word w = 2 j + q / 2 of the row's 128-byte group.
  const bool even = q % 2 == 0;
  const int row = even ? row_a : row_b;
  const bool row_ok = row < rows;
  uint8_t* group = a.act_codes + int64_t(row0 + row) * a.inter + 128 * b;
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) {
    const uint32_t pa = quant_detail::e4m3x2(x[4 * jj + 0], x[4 * jj + 1]);
    const uint32_t pb = quant_detail::e4m3x2(x[4 * jj + 2], x[4 * jj + 3]);
    const uint32_t got = __shfl_xor_sync(0xffffffffu, even ? pb : pa, 1);  // even: the partner's pa; odd: its pb
    const uint32_t word = even ? pa | (got << 16) : got | (pb << 16);
    const int w = 2 * (8 * kMine + jj) + q / 2;
    if (row_ok && 128 * b + 4 * w < a.inter)
      reinterpret_cast<uint32_t*>(group)[a.act_fragments ? fragment_word(w) : w] = word;
  }
  const ScaleLayout layout = a.act_quads ? ScaleLayout::row_quads : ScaleLayout::group_major;
  if (kMine == 0 && q < 2 && row_ok) a.act_scales[scale_index(layout, b, row0 + row, a.act_rows)] = even ? scale_a : scale_b;
}

// Both consumer warpgroups, with the unit's record read (row0, rows, b) and released.
template <class S, class A>
__device__ __forceinline__ void act_epilogue(S& s, const A& a, const float (&acc)[64], int consumer, int row0,
                                             int rows, int b, int row_a, int row_b) {
  if (consumer == 0)
    act_half<0>(s, a, acc, row0, rows, b, row_a, row_b);
  else
    act_half<1>(s, a, acc, row0, rows, b, row_a, row_b);
}

}  // namespace loom::gemm::tokens_on_m
