// CPU reference of the grouped GEMM over expert segments, accumulating in double, plus the two
// elementwise stages that sit around it (SiLU(gate)*up and the weighted combine).
#pragma once

#include <cstdint>
#include <vector>

#include "common/bf16.hpp"
#include "dispatch/dispatch_ref.hpp"
#include "loom/types.hpp"
#include "route/route_ref.hpp"

namespace loom {

// Expert-sorted activation rows [rows, cols]: fp8 codes with 1x128 scales [rows, quant_blocks(cols)]
// (dtype fp8), or bf16 values (dtype bf16).
struct ActivationRows {
  DType dtype = DType::fp8;
  int64_t rows = 0, cols = 0;
  const uint8_t* q = nullptr;
  const float* scales = nullptr;
  const bf16* x = nullptr;
};

// Per-expert weights [E, rows, cols], K-major. fp8: codes plus 128x128 block scales
// [E, weight_row_blocks(rows, segment_rows), quant_blocks(cols)]; bf16: values.
struct ExpertWeights {
  DType dtype = DType::fp8;
  int64_t experts = 0, rows = 0, cols = 0;
  int64_t segment_rows = 0;  // see quantize_128x128_ref; = rows unless gate/up halves
  const uint8_t* q = nullptr;
  const float* scales = nullptr;
  const bf16* w = nullptr;
};

// out[r, n] = sum_k A[r, k] * W[e(r), n, k] for every sorted row r, e(r) the expert whose segment
// [offsets[e], offsets[e+1]) holds r. Operands are dequantised exactly (code * scale) and multiplied
// and summed in double. out: [offsets[E], w.rows].
void grouped_gemm_ref(const ActivationRows& a, const int32_t* offsets, const ExpertWeights& w, double* out);

// act[r, i] = silu(h[r, i]) * h[r, I + i] in double, rounded to float; h: [rows, 2I], act: [rows, I].
void silu_mul_ref(const double* h, int64_t rows, int64_t inter, float* act);

// out[t, n] = sum over slots j of weights[t, j] * y[route_row[t*k + j], n], in slot order, in double.
// Dropped routes add nothing. y: [rows, cols], out: [T, cols].
void combine_ref(const double* y, int64_t cols, const Dispatch& d, const TopK& topk, double* out);

}  // namespace loom
