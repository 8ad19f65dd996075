#include "bench/metrics.hpp"

#include "quant/quant_ref.hpp"

namespace loom::bench {

namespace {
int64_t matrix_bytes(DType dtype, int64_t rows, int64_t cols, int64_t segment_rows) {
  if (dtype == DType::bf16) return 2 * rows * cols;
  return rows * cols + 4 * weight_row_blocks(rows, segment_rows) * quant_blocks(cols);
}
}  // namespace

int64_t expert_weight_bytes(const Shape& s) {
  if (s.mode == Mode::single) return matrix_bytes(s.dtype, s.inter, s.hidden, s.inter);
  return matrix_bytes(s.dtype, 2 * s.inter, s.hidden, s.inter) + matrix_bytes(s.dtype, s.hidden, s.inter, s.hidden);
}

Work layer_work(const Shape& s, const std::vector<int32_t>& counts, bool from_logits) {
  Work w;
  const double rows = double(s.routes());
  w.flops = s.mode == Mode::single ? 2.0 * rows * double(s.inter) * double(s.hidden)
                                   : 6.0 * rows * double(s.hidden) * double(s.inter);
  for (int32_t c : counts) w.experts_hit += c > 0;
  w.weight_bytes = w.experts_hit * expert_weight_bytes(s);
  const int64_t in = 2 * s.tokens * s.hidden + (from_logits ? 4 * s.tokens * s.experts : 8 * s.routes());
  const int64_t out = s.mode == Mode::single ? 4 * s.tokens * s.inter : 2 * s.tokens * s.hidden;
  w.activation_bytes = in + out;
  return w;
}

int64_t glue_bytes(const Shape& s, bool from_logits, bool sorted_rows) {
  const int64_t R = s.routes(), rows = sorted_rows ? R : s.tokens;
  const int64_t routing = from_logits ? 4 * s.tokens * s.experts + 8 * R : 8 * R;
  const int64_t layout = 4 * (s.experts + 1) + 12 * R;
  // hidden read once; written as e4m3 codes with their scales, or (bf16) as the sorted rows
  // themselves (bf16 without sorted rows: GEMM 1 reads hidden by token, the glue moves none of it)
  const bool bf16 = s.dtype == DType::bf16;
  const int64_t activations = bf16 ? (sorted_rows ? 2 * s.tokens * s.hidden + 2 * rows * s.hidden : 0)
                                   : 2 * s.tokens * s.hidden + rows * s.hidden + 4 * rows * quant_blocks(s.hidden);
  return routing + layout + activations;
}

double peak_tflops(DType dtype) { return dtype == DType::fp8 ? kPeakFp8Tflops : kPeakBf16Tflops; }

}  // namespace loom::bench
