#include "quant/quant_ref.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>

#include "common/parallel.hpp"
#include "loom/types.hpp"
#include "contract/device_layout.hpp"
#include "quant/fp8_e4m3.hpp"

// Bit-exact fp32 rules: every float result below is one IEEE operation (division, comparison),
// never a fused or reassociated chain, so no compiler contraction can change it. x / scale is a true
// division: -O3 without -ffast-math (-freciprocal-math) never rewrites it as x * (1 / scale).

namespace loom {

float quant_scale(float amax) { return std::max(amax, 1e-10f) / kE4M3Max; }

uint8_t quant_value(float x, float scale) {
  float y = x / scale;
  // Written as two comparisons (not std::clamp) so a NaN fails both and reaches the encoder.
  if (y > kE4M3Max) y = kE4M3Max;
  if (y < -kE4M3Max) y = -kE4M3Max;
  return e4m3_from_float(y);
}

namespace {

// Largest |x| over rows [r0, r1) x cols [c0, c1); NaN never wins (it fails `>`).
template <class Load>
float block_amax(int64_t r0, int64_t r1, int64_t c0, int64_t c1, Load load) {
  float amax = 0.0f;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) {
      const float a = std::fabs(load(r, c));
      if (a > amax) amax = a;
    }
  return amax;
}

template <class T>
float to_f32(T v) {
  if constexpr (std::is_same_v<T, bf16>)
    return bf16_to_float(v);
  else
    return v;
}

template <class T>
void quantize_rows(const T* x, int64_t rows, int64_t cols, uint8_t* q, float* scales) {
  if (rows < 0 || cols < 0) throw Error("quantize_1x128_ref: negative shape");
  const int64_t nb = quant_blocks(cols);
  parallel_for(
      rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const T* xr = x + r * cols;
          for (int64_t b = 0; b < nb; ++b) {
            // The last group of a row may be shorter than 128: its scale sees only its own elements.
            const int64_t c0 = b * kQuantBlock, c1 = std::min(cols, c0 + kQuantBlock);
            const float scale =
                quant_scale(block_amax(0, 1, c0, c1, [&](int64_t, int64_t c) { return to_f32(xr[c]); }));
            scales[r * nb + b] = scale;
            for (int64_t c = c0; c < c1; ++c) q[r * cols + c] = quant_value(to_f32(xr[c]), scale);
          }
        }
      },
      16);
}

}  // namespace

void quantize_1x128_ref(const float* x, int64_t rows, int64_t cols, uint8_t* q, float* scales) {
  quantize_rows(x, rows, cols, q, scales);
}

void quantize_1x128_ref(const bf16* x, int64_t rows, int64_t cols, uint8_t* q, float* scales) {
  quantize_rows(x, rows, cols, q, scales);
}

int64_t weight_row_blocks(int64_t rows, int64_t segment_rows) {
  if (segment_rows <= 0 || rows < 0 || rows % segment_rows != 0)
    throw Error("weight rows = " + std::to_string(rows) + " are not a whole number of segments of " +
                std::to_string(segment_rows));
  return (rows / segment_rows) * quant_blocks(segment_rows);
}

int64_t weight_row_block(int64_t row, int64_t segment_rows) {
  // A segment starts a fresh run of blocks, so a block never spans two segments (gate and up).
  return (row / segment_rows) * quant_blocks(segment_rows) + (row % segment_rows) / kQuantBlock;
}

void quantize_128x128_ref(const float* w, int64_t rows, int64_t cols, int64_t segment_rows, uint8_t* q,
                          float* scales) {
  if (cols < 0) throw Error("quantize_128x128_ref: negative shape");
  const int64_t row_blocks = weight_row_blocks(rows, segment_rows);
  const int64_t seg_blocks = quant_blocks(segment_rows);
  const int64_t col_blocks = quant_blocks(cols);
  parallel_for(row_blocks * col_blocks, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t rb = i / col_blocks, cb = i % col_blocks;
      const int64_t seg = rb / seg_blocks, rb_in_seg = rb % seg_blocks;
      const int64_t r0 = seg * segment_rows + rb_in_seg * kQuantBlock;
      const int64_t r1 = seg * segment_rows + std::min(segment_rows, (rb_in_seg + 1) * kQuantBlock);
      const int64_t c0 = cb * kQuantBlock, c1 = std::min(cols, c0 + kQuantBlock);
      const float scale = quant_scale(block_amax(r0, r1, c0, c1, [&](int64_t r, int64_t c) { return w[r * cols + c]; }));
      scales[rb * col_blocks + cb] = scale;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) q[r * cols + c] = quant_value(w[r * cols + c], scale);
    }
  });
}

void to_fragment_order(const uint8_t* q, int64_t rows, int64_t cols, uint8_t* out) {
  if (cols % kQuantBlock != 0) throw Error("to_fragment_order: cols must be a multiple of 128");
  for (int64_t base = 0; base < rows * cols; base += kQuantBlock)
    for (int w = 0; w < 32; ++w) std::memcpy(out + base + 4 * fragment_word(w), q + base + 4 * w, 4);
}

}  // namespace loom
