// CPU reference of FP8 quantisation, in fp32 exactly as the GPU kernels compute it:
//   scale = max(amax, 1e-10f) / 448.0f          (IEEE division, round to nearest)
//   q     = e4m3(clamp(x / scale, -448, 448))   (IEEE division; NaN passes the clamp and stays NaN)
// amax is the largest |x| over the block, NaN elements ignored.
// Blocks run along the row (1x128, activations) or over 128x128 tiles (weights); a last partial
// block (a width that is a multiple of 16 but not of 128) is a shorter block with its own scale.
#pragma once

#include <cstdint>

#include "common/bf16.hpp"

namespace loom {

inline constexpr int64_t kQuantBlock = 128;
inline constexpr int64_t quant_blocks(int64_t n) { return (n + kQuantBlock - 1) / kQuantBlock; }

float quant_scale(float amax);                // max(amax, 1e-10f) / 448.0f
uint8_t quant_value(float x, float scale);    // e4m3(clamp(x / scale, -448, 448))

// Activations: x [rows, cols] -> q [rows, cols], scales [rows, quant_blocks(cols)] (row-major).
void quantize_1x128_ref(const float* x, int64_t rows, int64_t cols, uint8_t* q, float* scales);
void quantize_1x128_ref(const bf16* x, int64_t rows, int64_t cols, uint8_t* q, float* scales);

// Codes [rows, cols] (cols a multiple of 128) in the wgmma A-fragment order of fragment_word
// (device_layout.hpp): inside each 128-byte group, 4-byte word w moves to fragment_word(w).
void to_fragment_order(const uint8_t* q, int64_t rows, int64_t cols, uint8_t* out);

// Weights of one expert: w [rows, cols] -> q [rows, cols], scales [row_blocks, quant_blocks(cols)].
// Rows form independent segments of `segment_rows` rows (w13: gate rows then up rows, segment_rows =
// I, so no block spans both); pass segment_rows = rows for a plain matrix.
// row_blocks = (rows / segment_rows) * quant_blocks(segment_rows); rows % segment_rows must be 0.
int64_t weight_row_blocks(int64_t rows, int64_t segment_rows);
int64_t weight_row_block(int64_t row, int64_t segment_rows);  // block index holding `row`
void quantize_128x128_ref(const float* w, int64_t rows, int64_t cols, int64_t segment_rows, uint8_t* q,
                          float* scales);

}  // namespace loom
