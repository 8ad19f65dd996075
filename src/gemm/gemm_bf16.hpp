// The BF16 grouped GEMM over expert segments (issue 47): bf16 weights and activations, fp32
// accumulation over all of K (no scales, no promotion). An expert's rows on the MMA's M side in
// 128-row tiles (two consumer warpgroups of 64), 256 weight rows on N, both operands by TMA from
// shared memory: A from an expert-sorted bf16 copy of the rows, B from the weights. Two epilogues:
//   act    ffn GEMM 1 on w13 (N = 2I): a tile holds gate block b and up block b (128 rows each);
//          it writes SiLU(gate)*up in bf16, the intermediate [rows, I] in sorted-row order
//   rows   the top-k weight times each sorted row's output, fp32 or bf16 route rows [rows, N] for
//          the combine kernel (ffn GEMM 2; deterministic: every value written once)
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/bf16.hpp"
#include "common/device_info.hpp"

namespace loom {

// Tile geometry: 64 bf16 of K per stage (one 128-byte swizzled row), 128 rows x 256 weight rows.
inline constexpr int kBf16BlockK = 64;
inline constexpr int kBf16TileRows = 128;
inline constexpr int kBf16TileCols = 256;

enum class Bf16Epilogue { act, rows };

struct GemmBf16Params {
  const bf16* weights = nullptr;    // [E, N, K], K-major
  const bf16* x = nullptr;          // [x_rows, K]: the expert-sorted rows (expert e's at offsets[e]..)
  int64_t x_rows = 0;               // >= offsets[E]; rows past the routed ones are never written out
  const int32_t* offsets = nullptr; // [E+1]
  Bf16Epilogue epilogue = Bf16Epilogue::rows;
  // rows: out[r, n] = row_weight[r] * (x[r] . W[e(r), n]) for the sorted rows r < offsets[E],
  // [x_rows, N] fp32, or bf16 with store_bf16 (each value rounded to nearest even); row_weight null:
  // weight 1. act: out is the intermediate [x_rows, inter] bf16 (row_weight not read).
  const float* row_weight = nullptr;
  void* out = nullptr;
  bool store_bf16 = false;
  int inter = 0;                    // act: I (N = 2I; w13's gate rows 0..I-1, up rows I..2I-1)
  int experts = 0, n = 0, k = 0;
  // Weight rows on the MMA's M side and 64 sorted rows of an expert on N (decode: an expert's few
  // rows cost a 64-wide MMA and its weights stream in 64-row units over every SM); false: 128
  // sorted rows on M, 256 weight rows on N (prefill).
  bool weights_on_m = false;
};

// Throws loom::Error for what the kernel cannot take (shapes, alignment, null pointers).
void check_gemm_bf16(const GemmBf16Params& p);

// Launches the kernel, one persistent CTA per SM of `device` (the lab's variants, CTA pairs and A by
// token, measured slower: lab/bf16_variants/). Throws loom::Error for what it cannot
// take (shapes, alignment, null pointers) and on launch failure.
void launch_gemm_bf16(const GemmBf16Params& p, const DeviceInfo& device, cudaStream_t stream, bool pdl);

}  // namespace loom
