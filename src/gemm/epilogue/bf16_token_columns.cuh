// Epilogues of the BF16 weights-on-M kernel, from the consumer warpgroup's m64n64 accumulator whose
// rows are weight rows and whose columns are the chunk's sorted rows (thread layout as in
// ptx/wgmma.cuh: acc[4j + 0..1] weight row r's columns 8j + 2q, + 1; acc[4j + 2..3] row r + 8's).
// Each thread writes single elements: a column c of the tile is sorted row row0 + c of the output.
// Chunk columns past the expert's rows and weight rows past N (or I) are not written.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "quant/quant_gather_device.cuh"

namespace loom::gemm::bf16_weights_on_m {

// ffn GEMM 1: the tile's rows 16w..16w+7 are gate rows of intermediate columns col0 + 8w..+7 and
// rows 16w+8..16w+15 their up rows, so a thread's rows r and r + 8 are one column's gate and up.
// act[row0 + c, col] = SiLU(gate) * up in fp32, rounded once to bf16.
__device__ __forceinline__ void store_act_columns(void* out, int inter, const float (&acc)[32], int64_t row0,
                                                  int rows, int col, int q) {
  if (col >= inter) return;
  __nv_bfloat16* o = static_cast<__nv_bfloat16*>(out);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int c = 8 * j + 2 * q;
    if (c < rows) o[(row0 + c) * inter + col] = __float2bfloat16_rn(quant_detail::silu_mul(acc[4 * j], acc[4 * j + 2]));
    if (c + 1 < rows)
      o[(row0 + c + 1) * inter + col] = __float2bfloat16_rn(quant_detail::silu_mul(acc[4 * j + 1], acc[4 * j + 3]));
  }
}

// The weighted route rows: out[row0 + c, n] = row_weight[row0 + c] * acc for the thread's weight rows
// n and n + 8 (n8), fp32 or bf16.
__device__ __forceinline__ void store_rows_columns(void* out, int n_total, int bf16, const float* row_weight,
                                                   const float (&acc)[32], int64_t row0, int rows, int n, int q) {
  const bool ok = n < n_total, ok8 = n + 8 < n_total;
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int c = 8 * j + 2 * q + h;
      if (c >= rows) continue;
      const int64_t row = row0 + c;
      const float w = row_weight ? __ldcg(row_weight + row) : 1.0f;
      const float v = w * acc[4 * j + h], v8 = w * acc[4 * j + 2 + h];
      if (bf16) {
        __nv_bfloat16* o = static_cast<__nv_bfloat16*>(out);
        if (ok) o[row * n_total + n] = __float2bfloat16_rn(v);
        if (ok8) o[row * n_total + n + 8] = __float2bfloat16_rn(v8);
      } else {
        float* o = static_cast<float*>(out);
        if (ok) o[row * n_total + n] = v;
        if (ok8) o[row * n_total + n + 8] = v8;
      }
    }
}

}  // namespace loom::gemm::bf16_weights_on_m
