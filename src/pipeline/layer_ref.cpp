#include "pipeline/layer_ref.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "common/parallel.hpp"
#include "dispatch/dispatch_ref.hpp"
#include "quant/quant_ref.hpp"

namespace loom {

namespace {

int64_t matrix_bytes(const ExpertWeights& v) {
  if (v.dtype == DType::bf16) return v.rows * v.cols * int64_t(sizeof(bf16));
  return v.rows * v.cols + weight_row_blocks(v.rows, v.segment_rows) * quant_blocks(v.cols) * int64_t(sizeof(float));
}

void check_size(const char* what, size_t got, int64_t want) {
  if (int64_t(got) != want)
    throw Error(std::string("layer_ref: ") + what + " holds " + std::to_string(got) + " elements, expected " +
                std::to_string(want));
}

void check_weights(const LayerWeights& w) {
  const Shape& s = w.shape;
  auto check_matrix = [&](const ExpertWeights& v, const char* name, const std::vector<uint8_t>& q,
                          const std::vector<float>& sc, const std::vector<bf16>& b) {
    const int64_t elems = s.experts * v.rows * v.cols;
    if (s.dtype == DType::fp8) {
      check_size((std::string(name) + "_q").c_str(), q.size(), elems);
      check_size((std::string(name) + "_scales").c_str(), sc.size(),
                 s.experts * weight_row_blocks(v.rows, v.segment_rows) * quant_blocks(v.cols));
    } else {
      check_size(name, b.size(), elems);
    }
  };
  check_matrix(w.w1_view(), "w1", w.w1_q, w.w1_scales, w.w1);
  if (s.mode == Mode::ffn) check_matrix(w.w2_view(), "w2", w.w2_q, w.w2_scales, w.w2);
}

// Expert-sorted activations for one GEMM: fp8 codes and scales, or bf16 values.
struct SortedRows {
  std::vector<uint8_t> q;
  std::vector<float> scales;
  std::vector<bf16> x;
  ActivationRows view(DType dtype, int64_t rows, int64_t cols) const {
    ActivationRows a;
    a.dtype = dtype;
    a.rows = rows;
    a.cols = cols;
    a.q = q.data();
    a.scales = scales.data();
    a.x = x.data();
    return a;
  }
};

}  // namespace

ExpertWeights LayerWeights::w1_view() const {
  ExpertWeights v;
  v.dtype = shape.dtype;
  v.experts = shape.experts;
  v.rows = shape.mode == Mode::single ? shape.inter : 2 * shape.inter;
  v.cols = shape.hidden;
  v.segment_rows = shape.inter;  // single: the whole matrix; ffn: gate and up blocked apart
  v.q = w1_q.data();
  v.scales = w1_scales.data();
  v.w = w1.data();
  return v;
}

ExpertWeights LayerWeights::w2_view() const {
  if (shape.mode != Mode::ffn) throw Error("w2_view: single mode has no second weight matrix");
  ExpertWeights v;
  v.dtype = shape.dtype;
  v.experts = shape.experts;
  v.rows = shape.hidden;
  v.cols = shape.inter;
  v.segment_rows = shape.hidden;
  v.q = w2_q.data();
  v.scales = w2_scales.data();
  v.w = w2.data();
  return v;
}

int64_t LayerWeights::expert_bytes() const {
  return matrix_bytes(w1_view()) + (shape.mode == Mode::ffn ? matrix_bytes(w2_view()) : 0);
}

std::vector<float> LayerResult::rounded() const {
  std::vector<float> r(out.size());
  for (size_t i = 0; i < out.size(); ++i) r[i] = mode == Mode::single ? float(out[i]) : round_double_to_bf16(out[i]);
  return r;
}

LayerResult layer_ref(const LayerWeights& w, const bf16* hidden, const TopK& topk, const RouteIntermediate* given,
                      bool bf16_route_rows) {
  Shape s = w.shape;
  s.tokens = topk.tokens;
  validate(s);
  if (topk.topk != s.topk)
    throw Error("layer_ref: top-k carries k = " + std::to_string(topk.topk) + ", the weights' shape k = " +
                std::to_string(s.topk));
  check_size("topk.ids", topk.ids.size(), s.tokens * s.topk);
  check_size("topk.weights", topk.weights.size(), s.tokens * s.topk);
  check_weights(w);
  if (s.tokens > 0 && !hidden) throw Error("layer_ref: hidden is null");
  if (bf16_route_rows && s.mode != Mode::ffn) throw Error("layer_ref: bf16 route rows are ffn only");
  if (given) {
    if (s.mode != Mode::ffn || s.dtype != DType::fp8) throw Error("layer_ref: a given intermediate is ffn fp8 only");
    check_size("given.codes", given->codes.size(), s.tokens * s.topk * s.inter);
    check_size("given.scales", given->scales.size(), s.tokens * s.topk * quant_blocks(s.inter));
  }

  const int64_t T = s.tokens, H = s.hidden, I = s.inter, E = s.experts, k = s.topk;
  const bool fp8 = s.dtype == DType::fp8;
  LayerResult result;
  result.mode = s.mode;
  result.out.assign(size_t(T * s.out_cols()), 0.0);
  if (T == 0) return result;

  const Dispatch d = dispatch_ref(topk.ids.data(), T, k, E);
  const int64_t R = d.offsets[size_t(E)];

  // Gather: each token is quantised once (its 1x128 groups do not depend on the expert), and every
  // route of the token copies the same codes and scales into its sorted row.
  SortedRows a1;
  const int64_t hb = quant_blocks(H);
  if (fp8) {
    std::vector<uint8_t> tq(size_t(T * H));
    std::vector<float> ts(size_t(T * hb));
    quantize_1x128_ref(hidden, T, H, tq.data(), ts.data());
    a1.q.resize(size_t(R * H));
    a1.scales.resize(size_t(R * hb));
    parallel_for(R, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t t = d.row_route[size_t(r)] / k;
        std::copy_n(tq.begin() + t * H, H, a1.q.begin() + r * H);
        std::copy_n(ts.begin() + t * hb, hb, a1.scales.begin() + r * hb);
      }
    });
  } else {
    a1.x.resize(size_t(R * H));
    parallel_for(R, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) std::copy_n(hidden + (d.row_route[size_t(r)] / k) * H, H, a1.x.begin() + r * H);
    });
  }

  const ExpertWeights w1 = w.w1_view();
  std::vector<double> h(size_t(R * w1.rows));
  grouped_gemm_ref(a1.view(s.dtype, R, H), d.offsets.data(), w1, h.data());

  if (s.mode == Mode::single) {
    combine_ref(h.data(), I, d, topk, result.out.data());
    return result;
  }

  // ffn: act from the unrounded GEMM-1 output, rounded once to fp32; then fp8 re-quantises it per
  // 1x128 group along I, bf16 rounds it (fp32 -> bf16) for GEMM 2.
  std::vector<float> act(size_t(R * I));
  silu_mul_ref(h.data(), R, I, act.data());
  h = {};
  result.act.assign(size_t(T * k * I), 0.0f);
  for (int64_t r = 0; r < R; ++r)
    std::copy_n(act.begin() + r * I, I, result.act.begin() + d.row_route[size_t(r)] * I);
  SortedRows a2;
  const int64_t ib = quant_blocks(I);
  if (fp8 && given) {
    a2.q.resize(size_t(R * I));
    a2.scales.resize(size_t(R * ib));
    for (int64_t r = 0; r < R; ++r) {
      const int64_t route = d.row_route[size_t(r)];
      std::copy_n(given->codes.begin() + route * I, I, a2.q.begin() + r * I);
      std::copy_n(given->scales.begin() + route * ib, ib, a2.scales.begin() + r * ib);
    }
  } else if (fp8) {
    a2.q.resize(size_t(R * I));
    a2.scales.resize(size_t(R * ib));
    quantize_1x128_ref(act.data(), R, I, a2.q.data(), a2.scales.data());
  } else {
    a2.x.resize(size_t(R * I));
    for (size_t i = 0; i < act.size(); ++i) a2.x[i] = float_to_bf16(act[i]);
  }
  std::vector<double> y(size_t(R * H));
  grouped_gemm_ref(a2.view(s.dtype, R, I), d.offsets.data(), w.w2_view(), y.data());
  if (!bf16_route_rows) {
    combine_ref(y.data(), H, d, topk, result.out.data());
    return result;
  }
  // The deterministic combine's rows: weighted and rounded to bf16 each, then summed with weight 1.
  parallel_for(R, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const double wt = double(topk.weights[size_t(d.row_route[size_t(r)])]);
      for (int64_t n = 0; n < H; ++n) y[size_t(r * H + n)] = double(round_double_to_bf16(wt * y[size_t(r * H + n)]));
    }
  });
  TopK unit = topk;
  std::fill(unit.weights.begin(), unit.weights.end(), 1.0f);
  combine_ref(y.data(), H, d, unit, result.out.data());
  return result;
}

ErrorStats relative_error(const float* got, const double* ref, int64_t rows, int64_t cols) {
  ErrorStats st;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  double diff_all = 0, ref_all = 0, got_all = 0;
  bool nan = false;
  for (int64_t r = 0; r < rows; ++r) {
    double diff_row = 0, ref_row = 0, got_row = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double g = double(got[r * cols + c]), x = ref[r * cols + c];
      diff_row += (g - x) * (g - x);
      ref_row += x * x;
      got_row += g * g;
    }
    // A NaN on either side (or inf - inf) poisons the sum: report it as +inf so that it fails every
    // tolerance instead of slipping through comparisons that are false for NaN.
    const bool nan_row = std::isnan(diff_row);
    const double err = nan_row ? kInf : ref_row > 0 ? std::sqrt(diff_row / ref_row) : std::sqrt(got_row);
    if (st.worst_row_index < 0 || err > st.worst_row) {
      st.worst_row = err;
      st.worst_row_index = r;
    }
    nan = nan || nan_row;
    diff_all += diff_row;
    ref_all += ref_row;
    got_all += got_row;
  }
  st.overall = nan ? kInf : ref_all > 0 ? std::sqrt(diff_all / ref_all) : std::sqrt(got_all);
  return st;
}

}  // namespace loom
