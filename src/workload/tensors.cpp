// Hidden states and expert weights from a seed.
#include <cmath>
#include <vector>

#include "common/parallel.hpp"
#include "quant/quant_ref.hpp"
#include "workload/workload.hpp"
#include "workload/workload_rng.hpp"

namespace loom {

namespace {

using namespace workload_detail;

// exp(U(log lo, log hi)): spreads magnitudes evenly over octaves.
double log_uniform(Rng& r, double lo, double hi) { return std::exp(r.uniform(std::log(lo), std::log(hi))); }

// One expert's matrix [rows, cols]: U(-1, 1) / sqrt(cols) times a per-(expert, matrix) magnitude
// in [0.25, 4], so block scales differ between experts and GEMM outputs stay O(1), times a factor
// in [0.5, 2] per 128 x 128 block, so the block scales within one matrix differ too (a kernel that
// took another block's scale would be off by up to 4x there, not by the 1e-4 that the maxima of
// equal uniform blocks differ by). Two 24-bit uniforms per 64-bit draw keep this near memory speed.
template <class Out, class Convert>
void fill_expert(Out* out, int64_t rows, int64_t cols, uint64_t seed, Stream matrix, int64_t expert, WeightValues values,
                 Convert convert) {
  Rng r(seed, stream_id(matrix, uint64_t(expert)));
  const float a = float(log_uniform(r, 0.25, 4.0) / std::sqrt(double(cols)));
  constexpr int64_t kBlock = 128;
  const int64_t col_blocks = (cols + kBlock - 1) / kBlock, row_blocks = (rows + kBlock - 1) / kBlock;
  std::vector<float> block_scale(static_cast<size_t>(row_blocks * col_blocks));
  for (float& f : block_scale) f = a * float(log_uniform(r, 0.5, 2.0));
  // cols is even (a multiple of 16), so a pair never spans two rows or two column blocks.
  Normal normal(r);
  for (int64_t row = 0; row < rows; ++row) {
    const float* f = block_scale.data() + (row / kBlock) * col_blocks;
    Out* o = out + row * cols;
    for (int64_t c = 0; c < cols; c += 2) {
      const float m = f[c / kBlock];
      if (values == WeightValues::normal) {  // N(0, 1/4): a block's maximum lands near its magnitude too
        o[c] = convert(m * 0.5f * float(normal()));
        o[c + 1] = convert(m * 0.5f * float(normal()));
        continue;
      }
      const uint64_t bits = r.next();
      o[c] = convert(m * signed_unit24(uint32_t(bits)));
      o[c + 1] = convert(m * signed_unit24(uint32_t(bits >> 32)));
    }
  }
}

// fp8: generate one expert at a time into a per-thread fp32 buffer and quantise it, so the fp32
// weights of all experts never exist at once.
void make_fp8(int64_t experts, int64_t rows, int64_t cols, int64_t segment_rows, uint64_t seed, Stream matrix,
              WeightValues values, std::vector<uint8_t>& q, std::vector<float>& scales) {
  const int64_t per_expert = rows * cols;
  const int64_t scales_per_expert = weight_row_blocks(rows, segment_rows) * quant_blocks(cols);
  q.assign(size_t(experts * per_expert), 0);
  scales.assign(size_t(experts * scales_per_expert), 0.0f);
  parallel_for(experts, [&](int64_t begin, int64_t end) {
    std::vector<float> w(static_cast<size_t>(per_expert));
    for (int64_t e = begin; e < end; ++e) {
      fill_expert(w.data(), rows, cols, seed, matrix, e, values, [](float x) { return x; });
      quantize_128x128_ref(w.data(), rows, cols, segment_rows, q.data() + e * per_expert,
                           scales.data() + e * scales_per_expert);
    }
  });
}

void make_bf16(int64_t experts, int64_t rows, int64_t cols, uint64_t seed, Stream matrix, WeightValues values,
               std::vector<bf16>& w) {
  const int64_t per_expert = rows * cols;
  w.resize(size_t(experts * per_expert));
  parallel_for(experts, [&](int64_t begin, int64_t end) {
    for (int64_t e = begin; e < end; ++e)
      fill_expert(w.data() + e * per_expert, rows, cols, seed, matrix, e, values,
                  [](float x) { return float_to_bf16(x); });
  });
}

}  // namespace

std::vector<bf16> make_hidden(const Shape& shape, uint64_t seed) {
  validate(shape);
  const int64_t T = shape.tokens, H = shape.hidden;
  std::vector<bf16> h(static_cast<size_t>(T * H));
  parallel_for(
      T,
      [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          Rng r(seed, stream_id(Stream::hidden, uint64_t(t)));
          // Rows of different size exercise per-token activation scales.
          const double magnitude = log_uniform(r, 0.5, 2.0);
          Normal normal(r);
          bf16* row = h.data() + t * H;
          for (int64_t i = 0; i < H; ++i) row[i] = float_to_bf16(float(magnitude * normal()));
        }
      },
      4);
  return h;
}

LayerWeights make_weights(const Shape& shape, uint64_t seed, WeightValues values) {
  validate(shape);
  const int64_t E = shape.experts, H = shape.hidden, I = shape.inter;
  LayerWeights lw;
  lw.shape = shape;
  const bool fp8 = shape.dtype == DType::fp8;
  if (shape.mode == Mode::single) {
    // w1 [E, N=inter, K=hidden]
    if (fp8)
      make_fp8(E, I, H, I, seed, Stream::w1, values, lw.w1_q, lw.w1_scales);
    else
      make_bf16(E, I, H, seed, Stream::w1, values, lw.w1);
    return lw;
  }
  // w13 [E, 2I, H] with gate and up quantised as separate row segments; w2 [E, H, I].
  if (fp8) {
    make_fp8(E, 2 * I, H, I, seed, Stream::w1, values, lw.w1_q, lw.w1_scales);
    make_fp8(E, H, I, H, seed, Stream::w2, values, lw.w2_q, lw.w2_scales);
  } else {
    make_bf16(E, 2 * I, H, seed, Stream::w1, values, lw.w1);
    make_bf16(E, H, I, seed, Stream::w2, values, lw.w2);
  }
  return lw;
}

}  // namespace loom
