// Epilogues of the BF16 tokens-on-M kernel, from a consumer warpgroup's m64n256 accumulator
// (thread layout as in ptx/wgmma.cuh: acc[4j + 0..1] row r's columns 8j + 2q, + 1, acc[4j + 2..3]
// row r + 8's). Each thread writes its own pairs of columns; rows past the expert's end and
// columns past N (or I) are not written.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "quant/quant_gather_device.cuh"

namespace loom::gemm::bf16_tokens_on_m {

__device__ __forceinline__ void store_bf16_pair(void* out, int64_t index, float v0, float v1) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(v0, v1);
  *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(out) + index) = v;
}

// ffn GEMM 1: columns 0..127 of the tile are gate block b's, 128..255 up block b's, so a thread
// holds each gate value and its up value. act = SiLU(gate) * up in fp32, rounded once to bf16, at
// the intermediate's row `row` (and row8 for the second row), columns 128 b + 8j + 2q.
__device__ __forceinline__ void store_act(void* out, int inter, const float (&acc)[128], int64_t row, bool ok,
                                          int64_t row8, bool ok8, int b, int q) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int col = 128 * b + 8 * j + 2 * q;
    if (col >= inter) continue;  // inter is even: the pair's second column is in too
    if (ok)
      store_bf16_pair(out, row * inter + col, quant_detail::silu_mul(acc[4 * j], acc[4 * j + 64]),
                      quant_detail::silu_mul(acc[4 * j + 1], acc[4 * j + 65]));
    if (ok8)
      store_bf16_pair(out, row8 * inter + col, quant_detail::silu_mul(acc[4 * j + 2], acc[4 * j + 66]),
                      quant_detail::silu_mul(acc[4 * j + 3], acc[4 * j + 67]));
  }
}

// The weighted route rows: out[row, col] = weight * acc, fp32 or bf16, columns col0 + 8j + 2q.
__device__ __forceinline__ void store_rows(void* out, int n, int bf16, const float (&acc)[128], int64_t row, bool ok,
                                           float weight, int64_t row8, bool ok8, float weight8, int col0, int q) {
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const int col = col0 + 8 * j + 2 * q;
    if (col >= n) continue;  // n is even: the pair's second column is in too
    if (bf16) {
      if (ok) store_bf16_pair(out, row * n + col, weight * acc[4 * j], weight * acc[4 * j + 1]);
      if (ok8) store_bf16_pair(out, row8 * n + col, weight8 * acc[4 * j + 2], weight8 * acc[4 * j + 3]);
    } else {
      float* o = static_cast<float*>(out);
      if (ok) *reinterpret_cast<float2*>(o + row * n + col) = make_float2(weight * acc[4 * j], weight * acc[4 * j + 1]);
      if (ok8)
        *reinterpret_cast<float2*>(o + row8 * n + col) = make_float2(weight8 * acc[4 * j + 2], weight8 * acc[4 * j + 3]);
    }
  }
}

// Staged: a warpgroup's 64 full rows of bf16 output go to shared memory in boxes of 64 rows x 64
// columns, 128-byte swizzled as a TMA store reads them (a row's 16-byte chunk c at c ^ (row % 8):
// the 8 rows a warp writes at once fall in 8 distinct chunks, no bank conflicts), and leave by TMA
// stores while the consumers go on to the next unit's MMAs.
inline constexpr int kOutBoxCols = 64;
inline constexpr int kOutBoxBytes = 64 * kOutBoxCols * 2;
static_assert(kOutBoxCols * 2 == 128, "an output box row is one 128-byte swizzle row");

// Row r (0..63 of the warpgroup's rows), columns col and col + 1 (col even, of the tile's output).
__device__ __forceinline__ void stage_bf16_pair(uint8_t* staging, int r, int col, float v0, float v1) {
  const int box = col / kOutBoxCols, chunk = col % kOutBoxCols / 8;
  uint8_t* dst = staging + box * kOutBoxBytes + r * 128 + ((chunk ^ (r % 8)) << 4) + (col % 8) * 2;
  *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(v0, v1);
}

// store_act's values into the staging boxes (two: the tile's 128 intermediate columns).
__device__ __forceinline__ void stage_act(uint8_t* staging, const float (&acc)[128], int r, int q) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int col = 8 * j + 2 * q;
    stage_bf16_pair(staging, r, col, quant_detail::silu_mul(acc[4 * j], acc[4 * j + 64]),
                    quant_detail::silu_mul(acc[4 * j + 1], acc[4 * j + 65]));
    stage_bf16_pair(staging, r + 8, col, quant_detail::silu_mul(acc[4 * j + 2], acc[4 * j + 66]),
                    quant_detail::silu_mul(acc[4 * j + 3], acc[4 * j + 67]));
  }
}

// store_rows' bf16 values into the staging boxes (four: the tile's 256 columns).
__device__ __forceinline__ void stage_rows(uint8_t* staging, const float (&acc)[128], int r, float weight,
                                           float weight8, int q) {
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const int col = 8 * j + 2 * q;
    stage_bf16_pair(staging, r, col, weight * acc[4 * j], weight * acc[4 * j + 1]);
    stage_bf16_pair(staging, r + 8, col, weight8 * acc[4 * j + 2], weight8 * acc[4 * j + 3]);
  }
}

}  // namespace loom::gemm::bf16_tokens_on_m
