// The whole-layer reference: hand-workable cases in both modes and dtypes, random shapes (partial
// 128 blocks, dropped routes) against a naive per-token long-double layer written here, the final
// rounding, the error metric, and a qwen35-layer-sized run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/bf16.hpp"
#include "common/rng.hpp"
#include "pipeline/layer_ref.hpp"
#include "quant/fp8_e4m3.hpp"
#include "quant/quant_ref.hpp"
#include "test_seed.hpp"

namespace loom {
namespace {

using ld = long double;

ld e4m3_value(uint8_t c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  if (e == 15 && m == 7) return std::numeric_limits<ld>::quiet_NaN();
  const ld mag = e == 0 ? std::ldexp((ld)m, -9) : std::ldexp(1.0L + m / 8.0L, e - 7);
  return s ? -mag : mag;
}

// ---- building inputs ----------------------------------------------------------------------------

std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = float_to_bf16(v[i]);
  return r;
}

// Fills the weights of `w.shape` from float matrices w1 [E, R1, H] and (ffn) w2 [E, H, I].
void set_weights(LayerWeights& w, const std::vector<float>& w1, const std::vector<float>& w2) {
  const Shape& s = w.shape;
  const bool ffn = s.mode == Mode::ffn;
  const int64_t r1 = ffn ? 2 * s.inter : s.inter;
  if (s.dtype == DType::bf16) {
    w.w1 = to_bf16(w1);
    if (ffn) w.w2 = to_bf16(w2);
    return;
  }
  const int64_t rb1 = weight_row_blocks(r1, s.inter) * quant_blocks(s.hidden);
  w.w1_q.resize(w1.size());
  w.w1_scales.resize(size_t(s.experts * rb1));
  for (int64_t e = 0; e < s.experts; ++e)
    quantize_128x128_ref(w1.data() + e * r1 * s.hidden, r1, s.hidden, s.inter, w.w1_q.data() + e * r1 * s.hidden,
                         w.w1_scales.data() + e * rb1);
  if (!ffn) return;
  const int64_t rb2 = quant_blocks(s.hidden) * quant_blocks(s.inter);
  w.w2_q.resize(w2.size());
  w.w2_scales.resize(size_t(s.experts * rb2));
  for (int64_t e = 0; e < s.experts; ++e)
    quantize_128x128_ref(w2.data() + e * s.hidden * s.inter, s.hidden, s.inter, s.hidden,
                         w.w2_q.data() + e * s.hidden * s.inter, w.w2_scales.data() + e * rb2);
}

// ---- the naive layer: per token, per slot, in long double ---------------------------------------

// Row n of expert e of a weight matrix [E, rows, cols], dequantised or widened.
std::vector<ld> weight_row(const Shape& s, const std::vector<uint8_t>& q, const std::vector<float>& sc,
                           const std::vector<bf16>& b, int64_t e, int64_t n, int64_t rows, int64_t cols,
                           int64_t segment) {
  std::vector<ld> r(static_cast<size_t>(cols));
  if (s.dtype == DType::bf16) {
    for (int64_t c = 0; c < cols; ++c) r[size_t(c)] = bf16_to_float(b[size_t((e * rows + n) * cols + c)]);
    return r;
  }
  const int64_t per_seg = (segment + 127) / 128, cb = (cols + 127) / 128;
  const int64_t row_blocks = (rows / segment) * per_seg;
  const int64_t rb = (n / segment) * per_seg + (n % segment) / 128;
  for (int64_t c = 0; c < cols; ++c)
    r[size_t(c)] = e4m3_value(q[size_t((e * rows + n) * cols + c)]) * sc[size_t((e * row_blocks + rb) * cb + c / 128)];
  return r;
}

// Activations as the layer's GEMM sees them: fp8 1x128 quantise-dequantise, or bf16 values.
std::vector<ld> as_operand(DType dtype, const std::vector<float>& x) {
  const int64_t n = int64_t(x.size());
  std::vector<ld> r(x.size());
  if (dtype == DType::bf16) {
    for (size_t i = 0; i < x.size(); ++i) r[i] = round_to_bf16(x[i]);
    return r;
  }
  std::vector<uint8_t> q(x.size());
  std::vector<float> sc(size_t(quant_blocks(n)));
  quantize_1x128_ref(x.data(), 1, n, q.data(), sc.data());
  for (int64_t i = 0; i < n; ++i) r[size_t(i)] = e4m3_value(q[size_t(i)]) * sc[size_t(i / 128)];
  return r;
}

std::vector<ld> naive_layer(const LayerWeights& w, const std::vector<bf16>& hidden, const TopK& topk) {
  const Shape& s = w.shape;
  const int64_t T = topk.tokens, k = topk.topk, H = s.hidden, I = s.inter;
  const bool ffn = s.mode == Mode::ffn;
  const int64_t cols = ffn ? H : I;
  std::vector<ld> out(size_t(T * cols), 0.0L);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> x(static_cast<size_t>(H));
    for (int64_t c = 0; c < H; ++c) x[size_t(c)] = bf16_to_float(hidden[size_t(t * H + c)]);
    const std::vector<ld> a = as_operand(s.dtype, x);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = topk.ids[size_t(t * k + j)];
      if (e < 0 || e >= s.experts) continue;  // dropped
      const ld wt = topk.weights[size_t(t * k + j)];
      const int64_t r1 = ffn ? 2 * I : I;
      std::vector<ld> h(static_cast<size_t>(r1));
      for (int64_t n = 0; n < r1; ++n) {
        const auto wr = weight_row(s, w.w1_q, w.w1_scales, w.w1, e, n, r1, H, I);
        ld acc = 0;
        for (int64_t c = 0; c < H; ++c) acc += a[size_t(c)] * wr[size_t(c)];
        h[size_t(n)] = acc;
      }
      if (!ffn) {
        for (int64_t n = 0; n < I; ++n) out[size_t(t * cols + n)] += wt * h[size_t(n)];
        continue;
      }
      std::vector<float> act(static_cast<size_t>(I));
      for (int64_t i = 0; i < I; ++i) {
        const ld g = h[size_t(i)], u = h[size_t(I + i)];
        act[size_t(i)] = float(g / (1.0L + std::exp(-g)) * u);
      }
      const std::vector<ld> a2 = as_operand(s.dtype, act);
      for (int64_t n = 0; n < H; ++n) {
        const auto wr = weight_row(s, w.w2_q, w.w2_scales, w.w2, e, n, H, I, H);
        ld acc = 0;
        for (int64_t i = 0; i < I; ++i) acc += a2[size_t(i)] * wr[size_t(i)];
        out[size_t(t * cols + n)] += wt * acc;
      }
    }
  }
  return out;
}

// Per row: ||got - want|| <= tol * ||want|| (or <= tol when the row is zero).
void expect_rows_close(const std::vector<double>& got, const std::vector<ld>& want, int64_t cols, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t r = 0; r * cols < got.size(); ++r) {
    ld d = 0, n = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const ld g = got[r * cols + c], x = want[r * cols + c];
      d += (g - x) * (g - x);
      n += x * x;
    }
    EXPECT_LE(double(std::sqrt(d)), tol * double(n > 0 ? std::sqrt(n) : 1.0L)) << "row " << r;
  }
}

// Distinct random experts per token; about one route in ten points out of range (dropped) when asked.
TopK random_topk(Rng& rng, int64_t T, int64_t E, int64_t k, bool drops) {
  TopK tk;
  tk.tokens = T;
  tk.topk = k;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> pool(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) pool[size_t(e)] = int32_t(e);
    for (int64_t j = 0; j < k; ++j) {
      const size_t pick = size_t(j) + size_t(rng.below(uint64_t(E - j)));
      std::swap(pool[size_t(j)], pool[pick]);
      int32_t id = pool[size_t(j)];
      if (drops && rng.below(10) == 0) id = rng.below(2) ? -1 : int32_t(E + rng.below(5));
      tk.ids.push_back(id);
      tk.weights.push_back(float(rng.uniform(0.05, 1.0)));
    }
  }
  return tk;
}

std::vector<float> random_floats(Rng& rng, size_t n, double sigma) {
  std::vector<float> v(n);
  for (auto& x : v) x = float(rng.normal() * sigma);
  return v;
}

// ---- hand cases ---------------------------------------------------------------------------------

// Three tokens with H = 16 whose values (and amax 3.5 or 1.75 = 448 * 2^-j) make every fp8 scale a
// power of two and every scaled value an exact E4M3 code: fp8 and bf16 see the same numbers.
std::vector<float> hand_hidden() {
  std::vector<float> x(3 * 16);
  for (int c = 0; c < 16; ++c) {
    const float p = float((c % 4) + 1) * 0.25f * (c % 2 ? -1.0f : 1.0f);  // 0.25, -0.5, 0.75, -1
    x[size_t(c)] = c == 0 ? 3.5f : p;
    x[size_t(16 + c)] = -x[size_t(c)];
    x[size_t(32 + c)] = x[size_t(c)] / 2;
  }
  return x;
}

TopK hand_topk() {
  TopK tk;
  tk.tokens = 3;
  tk.topk = 2;
  tk.ids = {0, 1, 1, 0, 1, 9};  // token 2's second route (expert 9 of 2) is dropped
  tk.weights = {0.75f, 0.25f, 0.5f, 0.5f, 1.0f, 0.375f};
  return tk;
}

// 16 x 16 blocks: d * identity, or the constant c everywhere.
void put_identity(std::vector<float>& m, int64_t offset, float d) {
  for (int i = 0; i < 16; ++i) m[size_t(offset + i * 16 + i)] = d;
}
void put_constant(std::vector<float>& m, int64_t offset, float c) {
  for (int i = 0; i < 256; ++i) m[size_t(offset + i)] = c;
}

class LayerRefHand : public ::testing::TestWithParam<DType> {};

TEST_P(LayerRefHand, SingleMode) {
  // Expert 0: W = 3.5 I, so y = 3.5 x. Expert 1: W = 1.75 everywhere, so y[n] = 1.75 sum(x).
  LayerWeights w;
  w.shape = Shape{0, 16, 16, 2, 2, Mode::single, GetParam()};
  std::vector<float> w1(2 * 256, 0.0f);
  put_identity(w1, 0, 3.5f);
  put_constant(w1, 256, 1.75f);
  set_weights(w, w1, {});
  const auto x = hand_hidden();
  const auto res = layer_ref(w, to_bf16(x).data(), hand_topk());
  ASSERT_EQ(res.out.size(), 3u * 16);
  for (int t = 0; t < 3; ++t) {
    double sum = 0;
    for (int c = 0; c < 16; ++c) sum += x[size_t(t * 16 + c)];
    for (int n = 0; n < 16; ++n) {
      const double e0 = 3.5 * x[size_t(t * 16 + n)], e1 = 1.75 * sum;
      const double want = t == 0 ? 0.75 * e0 + 0.25 * e1 : t == 1 ? 0.5 * e1 + 0.5 * e0 : 1.0 * e1;
      EXPECT_EQ(res.out[size_t(t * 16 + n)], want) << "token " << t << " col " << n;  // all exact
      EXPECT_EQ(res.rounded()[size_t(t * 16 + n)], float(want));
    }
  }
}

TEST_P(LayerRefHand, FfnMode) {
  // Expert 0: gate = 3.5 I, up = 1.75 * ones, w2 = 3.5 I:
  //   act[i] = silu(3.5 x_i) * 1.75 S (S = sum x), y[n] = 3.5 act'[n].
  // Expert 1: gate = 1.75 * ones, up = 3.5 I, w2 = 1.75 * ones:
  //   act[i] = silu(1.75 S) * 3.5 x_i, y[n] = 1.75 sum_i act'[i].
  // act' is act as GEMM 2 sees it: fp32, then fp8 1x128 or bf16.
  const DType dtype = GetParam();
  LayerWeights w;
  w.shape = Shape{0, 16, 16, 2, 2, Mode::ffn, dtype};
  std::vector<float> w13(2 * 512, 0.0f), w2(2 * 256, 0.0f);
  put_identity(w13, 0, 3.5f);
  put_constant(w13, 256, 1.75f);
  put_constant(w13, 512, 1.75f);
  put_identity(w13, 768, 3.5f);
  put_identity(w2, 0, 3.5f);
  put_constant(w2, 256, 1.75f);
  set_weights(w, w13, w2);
  const auto x = hand_hidden();
  const TopK tk = hand_topk();
  const auto res = layer_ref(w, to_bf16(x).data(), tk);
  auto silu = [](double g) { return g / (1.0 + std::exp(-g)); };
  auto seen = [&](std::vector<float> act) {  // act as GEMM 2's operand
    std::vector<double> r(16);
    const float s = quant_scale([&] {
      float m = 0;
      for (float v : act) m = std::max(m, std::fabs(v));
      return m;
    }());
    for (int i = 0; i < 16; ++i)
      r[size_t(i)] = dtype == DType::bf16 ? double(round_to_bf16(act[size_t(i)]))
                                          : double(e4m3_to_float(quant_value(act[size_t(i)], s))) * s;
    return r;
  };
  const auto rounded = res.rounded();
  for (int t = 0; t < 3; ++t) {
    const float* xt = x.data() + t * 16;
    double S = 0;
    for (int c = 0; c < 16; ++c) S += xt[c];
    std::vector<float> act0(16), act1(16);
    for (int i = 0; i < 16; ++i) {
      act0[size_t(i)] = float(silu(3.5 * xt[i]) * (1.75 * S));
      act1[size_t(i)] = float(silu(1.75 * S) * (3.5 * xt[i]));
    }
    const auto a0 = seen(act0), a1 = seen(act1);
    double sum1 = 0;
    for (double v : a1) sum1 += v;
    for (int n = 0; n < 16; ++n) {
      const double y0 = 3.5 * a0[size_t(n)], y1 = 1.75 * sum1;
      const double want = t == 0 ? 0.75 * y0 + 0.25 * y1 : t == 1 ? 0.5 * y1 + 0.5 * y0 : 1.0 * y1;
      const double got = res.out[size_t(t * 16 + n)];
      EXPECT_NEAR(got, want, 1e-6 * (std::fabs(want) + 1e-3)) << "token " << t << " col " << n;
      // Output bf16: within half a bf16 ulp (2^-8 relative) of the exact value.
      EXPECT_LE(std::fabs(double(rounded[size_t(t * 16 + n)]) - want), std::fabs(want) * 0x1p-8 * 1.0001 + 1e-30);
      uint32_t u;
      std::memcpy(&u, &rounded[size_t(t * 16 + n)], 4);
      EXPECT_EQ(u & 0xffffu, 0u) << "not a bf16 value";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(LayerHand, LayerRefHand, ::testing::Values(DType::fp8, DType::bf16),
                         [](const auto& info) { return std::string(to_string(info.param)); });

// ---- random shapes against the naive layer ------------------------------------------------------

void check_random_layer(Mode mode, DType dtype) {
  LOOM_FRESH_SEED();
  Rng rng(seed);
  struct Dims { int64_t H, I; };
  const Dims dims[] = {{192, 80}, {128, 128}, {16, 48}, {256, 144}, {320, 32}, {80, 192}};
  for (int trial = 0; trial < 3; ++trial) {
    const Dims d = trial == 0 ? dims[0] : dims[rng.below(std::size(dims))];  // always one 192 / 80 case
    const int64_t E = 1 + int64_t(rng.below(7)), k = 1 + int64_t(rng.below(uint64_t(std::min<int64_t>(E, 4))));
    const int64_t T = 1 + int64_t(rng.below(10));
    LayerWeights w;
    w.shape = Shape{0, d.H, d.I, E, k, mode, dtype};
    SCOPED_TRACE(describe(Shape{T, d.H, d.I, E, k, mode, dtype}));
    const int64_t r1 = mode == Mode::ffn ? 2 * d.I : d.I;
    const auto w1 = random_floats(rng, size_t(E * r1 * d.H), 1.0 / std::sqrt(double(d.H)));
    const auto w2 = mode == Mode::ffn ? random_floats(rng, size_t(E * d.H * d.I), 1.0 / std::sqrt(double(d.I)))
                                      : std::vector<float>{};
    set_weights(w, w1, w2);
    const auto hidden = to_bf16(random_floats(rng, size_t(T * d.H), 1.0));
    const TopK tk = random_topk(rng, T, E, k, /*drops=*/true);
    const LayerResult res = layer_ref(w, hidden.data(), tk);
    const auto want = naive_layer(w, hidden, tk);
    const int64_t cols = w.shape.out_cols();
    // single: both sides exact up to double accumulation. ffn: act is rounded to fp32 from double
    // here and from long double in the naive layer, which may differ by one fp32 ulp.
    expect_rows_close(res.out, want, cols, mode == Mode::single ? 1e-12 : 1e-6);
    // The final rounding, checked against the layer's own double output: nearest fp32 (single) or
    // bf16 (ffn), so within half an ulp of that format.
    const auto rounded = res.rounded();
    for (size_t i = 0; i < rounded.size(); ++i) {
      int p;
      std::frexp(res.out[i], &p);  // |out| in [2^(p-1), 2^p)
      const double half_ulp = std::ldexp(1.0, p - (mode == Mode::single ? 25 : 9));
      ASSERT_LE(std::fabs(double(rounded[i]) - res.out[i]), half_ulp) << i;
    }
  }
}

TEST(LayerRef, RandomSingleFp8MatchesNaive) { check_random_layer(Mode::single, DType::fp8); }
TEST(LayerRef, RandomSingleBf16MatchesNaive) { check_random_layer(Mode::single, DType::bf16); }
TEST(LayerRef, RandomFfnFp8MatchesNaive) { check_random_layer(Mode::ffn, DType::fp8); }
TEST(LayerRef, RandomFfnBf16MatchesNaive) { check_random_layer(Mode::ffn, DType::bf16); }

// bf16 route rows (the deterministic combine's): with one route per token the output is that
// route's weighted row rounded to bf16, i.e. the plain reference's output rounded; with more routes
// the rounded rows differ from the exact ones by bf16 rounding only; single mode has no such rows.
TEST(LayerRef, Bf16RouteRowsRoundEachWeightedRow) {
  LOOM_FRESH_SEED();
  Rng rng(seed);
  for (const int64_t k : {1, 3}) {
    SCOPED_TRACE(testing::Message() << "k=" << k);
    const int64_t T = 7, H = 192, I = 80, E = 4;
    LayerWeights w;
    w.shape = Shape{0, H, I, E, k, Mode::ffn, DType::fp8};
    set_weights(w, random_floats(rng, size_t(E * 2 * I * H), 0.07), random_floats(rng, size_t(E * H * I), 0.1));
    const auto hidden = to_bf16(random_floats(rng, size_t(T * H), 1.0));
    const TopK tk = random_topk(rng, T, E, k, /*drops=*/true);
    const LayerResult exact = layer_ref(w, hidden.data(), tk);
    const LayerResult rows = layer_ref(w, hidden.data(), tk, nullptr, true);
    ASSERT_EQ(rows.out.size(), exact.out.size());
    if (k == 1) {
      const std::vector<float> r = exact.rounded();
      for (size_t i = 0; i < r.size(); ++i) ASSERT_EQ(rows.out[i], double(r[i])) << i;
    } else {
      const std::vector<float> got(rows.out.begin(), rows.out.end());
      const ErrorStats e = relative_error(got.data(), exact.out.data(), T, H);
      EXPECT_GT(e.overall, 0.0);   // the rounding shows
      EXPECT_LE(e.overall, 8e-3);  // and is bf16's (2^-8 relative at most per row of k terms)
    }
  }
  LayerWeights s;
  s.shape = Shape{0, 128, 128, 2, 1, Mode::single, DType::fp8};
  set_weights(s, random_floats(rng, size_t(2 * 128 * 128), 0.1), {});
  const auto hidden = to_bf16(random_floats(rng, size_t(2 * 128), 1.0));
  EXPECT_THROW(layer_ref(s, hidden.data(), random_topk(rng, 2, 2, 1, false), nullptr, true), Error);
}

// The token is quantised once: two tokens with identical hidden rows routed to the same expert
// give identical outputs; and the layer output does not depend on the order of tokens.
TEST(LayerRef, TokenOrderDoesNotMatter) {
  LOOM_FRESH_SEED();
  Rng rng(seed);
  const int64_t T = 6, H = 192, I = 80, E = 4, k = 2;
  LayerWeights w;
  w.shape = Shape{0, H, I, E, k, Mode::ffn, DType::fp8};
  set_weights(w, random_floats(rng, size_t(E * 2 * I * H), 0.07), random_floats(rng, size_t(E * H * I), 0.1));
  const auto hidden = to_bf16(random_floats(rng, size_t(T * H), 1.0));
  const TopK tk = random_topk(rng, T, E, k, false);
  const auto res = layer_ref(w, hidden.data(), tk);
  // Reverse the tokens.
  std::vector<bf16> rh(hidden.size());
  TopK rt = tk;
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(hidden.begin() + (T - 1 - t) * H, H, rh.begin() + t * H);
    for (int64_t j = 0; j < k; ++j) {
      rt.ids[size_t(t * k + j)] = tk.ids[size_t((T - 1 - t) * k + j)];
      rt.weights[size_t(t * k + j)] = tk.weights[size_t((T - 1 - t) * k + j)];
    }
  }
  const auto rr = layer_ref(w, rh.data(), rt);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < H; ++n)
      ASSERT_EQ(res.out[size_t(t * H + n)], rr.out[size_t((T - 1 - t) * H + n)]) << t << "," << n;
}

// ---- rounding, views, metric ----------------------------------------------------------------------

TEST(LayerRef, RoundedOutput) {
  LayerResult r;
  // 1 + 2^-8 + 2^-30: just above the midpoint between bf16 1 and 1 + 2^-7. Rounded once it goes up;
  // through fp32 first (1 + 2^-8 exactly, a tie, then even) it would wrongly go down to 1.
  const double v = 1.0 + 0x1p-8 + 0x1p-30;
  r.out = {v, -v, 0.1, 1e300, std::nan(""), -0.0};
  r.mode = Mode::ffn;
  const auto b = r.rounded();
  EXPECT_EQ(b[0], 1.0f + 0x1p-7f);
  EXPECT_EQ(b[1], -1.0f - 0x1p-7f);
  EXPECT_EQ(b[2], 0.10009765625f);  // bf16 nearest to 0.1
  EXPECT_TRUE(std::isinf(b[3]));
  EXPECT_TRUE(std::isnan(b[4]));
  EXPECT_TRUE(std::signbit(b[5]));
  r.mode = Mode::single;
  const auto f = r.rounded();
  EXPECT_EQ(f[0], float(v));
  EXPECT_EQ(f[2], 0.1f);
}

TEST(LayerRef, WeightViewsAndBytes) {
  LayerWeights w;
  w.shape = Shape{0, 2048, 512, 256, 8, Mode::single, DType::fp8};
  ExpertWeights v = w.w1_view();
  EXPECT_EQ(v.rows, 512);
  EXPECT_EQ(v.cols, 2048);
  EXPECT_EQ(v.segment_rows, 512);
  EXPECT_EQ(w.expert_bytes(), 512 * 2048 + 4 * 16 * 4);  // codes + 128x128 scales
  EXPECT_THROW(w.w2_view(), Error);

  w.shape.mode = Mode::ffn;
  v = w.w1_view();
  EXPECT_EQ(v.rows, 1024);
  EXPECT_EQ(v.segment_rows, 512);  // gate and up quantised apart
  const ExpertWeights v2 = w.w2_view();
  EXPECT_EQ(v2.rows, 2048);
  EXPECT_EQ(v2.cols, 512);
  EXPECT_EQ(w.expert_bytes(), (1024 * 2048 + 8 * 16 * 4) + (2048 * 512 + 16 * 4 * 4));

  w.shape = Shape{0, 3072, 1536, 16, 8, Mode::ffn, DType::bf16};
  EXPECT_EQ(w.expert_bytes(), 3 * 3072 * 1536 * 2);
  // Partial blocks round up: I = 80 gives one gate and one up row block.
  w.shape = Shape{0, 192, 80, 4, 2, Mode::ffn, DType::fp8};
  EXPECT_EQ(w.expert_bytes(), (160 * 192 + 2 * 2 * 4) + (192 * 80 + 2 * 1 * 4));
}

TEST(LayerRef, RejectsMismatchedInputs) {
  LOOM_FRESH_SEED();
  Rng rng(seed);
  LayerWeights w;
  w.shape = Shape{0, 32, 16, 3, 2, Mode::single, DType::fp8};
  set_weights(w, random_floats(rng, 3 * 16 * 32, 0.2), {});
  const auto hidden = to_bf16(random_floats(rng, 2 * 32, 1.0));
  TopK tk = random_topk(rng, 2, 3, 2, false);
  EXPECT_NO_THROW(layer_ref(w, hidden.data(), tk));
  TopK wrong_k = random_topk(rng, 2, 3, 1, false);
  EXPECT_THROW(layer_ref(w, hidden.data(), wrong_k), Error);
  LayerWeights short_w = w;
  short_w.w1_scales.pop_back();
  EXPECT_THROW(layer_ref(short_w, hidden.data(), tk), Error);
  TopK empty;
  empty.topk = 2;
  EXPECT_TRUE(layer_ref(w, nullptr, empty).out.empty());
}

TEST(LayerRef, RelativeError) {
  // Row 0 off by 0.125 against norm 3; row 1 off by (0.375, 0, 0.5), norm 0.625, against norm 5.
  const std::vector<double> ref = {1, 2, 2, 3, 0, 4};
  std::vector<float> got = {1.125f, 2, 2, 3.375f, 0, 4.5f};
  ErrorStats e = relative_error(got.data(), ref.data(), 2, 3);
  EXPECT_DOUBLE_EQ(e.overall, std::sqrt((0.125 * 0.125 + 0.625 * 0.625) / 34.0));
  EXPECT_DOUBLE_EQ(e.worst_row, 0.125);
  EXPECT_EQ(e.worst_row_index, 1);

  // NaN anywhere: +inf, and the worst row is the NaN's.
  got[1] = std::nanf("");
  e = relative_error(got.data(), ref.data(), 2, 3);
  EXPECT_TRUE(std::isinf(e.overall));
  EXPECT_TRUE(std::isinf(e.worst_row));
  EXPECT_EQ(e.worst_row_index, 0);

  // A zero reference row: its error is ||got_row||.
  const std::vector<double> zref = {0, 0, 1, 1};
  const std::vector<float> zgot = {3, 4, 1, 1};
  e = relative_error(zgot.data(), zref.data(), 2, 2);
  EXPECT_EQ(e.worst_row, 5.0);
  EXPECT_EQ(e.worst_row_index, 0);
  EXPECT_NEAR(e.overall, std::sqrt(25.0 / 2.0), 1e-12);
  // All zero and exact: 0; nothing at all: 0 with no worst row.
  const std::vector<float> zeros(4, 0.0f);
  const std::vector<double> dzeros(4, 0.0);
  e = relative_error(zeros.data(), dzeros.data(), 2, 2);
  EXPECT_EQ(e.overall, 0.0);
  EXPECT_EQ(e.worst_row, 0.0);
  e = relative_error(nullptr, nullptr, 0, 4);
  EXPECT_EQ(e.overall, 0.0);
  EXPECT_EQ(e.worst_row_index, -1);
  // Infinite output: +inf too.
  const std::vector<float> inf_got = {1, std::numeric_limits<float>::infinity(), 1, 1};
  const std::vector<double> ones(4, 1.0);
  EXPECT_TRUE(std::isinf(relative_error(inf_got.data(), ones.data(), 2, 2).overall));
}

// qwen35-layer shape at T = 16 (E reduced to 64 to keep the test's weights at 200 MB): the reference
// must run in seconds; token 0 is checked against the naive layer. No timing is asserted.
TEST(LayerRef, Qwen35LayerShapeRuns) {
  LOOM_FRESH_SEED();
  Rng rng(seed);
  const int64_t T = 16, H = 2048, I = 512, E = 64, k = 8;
  LayerWeights w;
  w.shape = Shape{0, H, I, E, k, Mode::ffn, DType::fp8};
  // Random codes (never NaN) and scales straight away: quantising 200 M floats would dominate.
  auto fill_codes = [&](std::vector<uint8_t>& q, size_t n) {
    q.resize(n);
    for (size_t i = 0; i < n; i += 8) {
      uint64_t r = rng.next();
      for (size_t b = 0; b < 8 && i + b < n; ++b, r >>= 8) {
        const uint8_t c = uint8_t(r);
        q[i + b] = (c & 0x7f) == 0x7f ? uint8_t(c ^ 1) : c;  // NaN codes become +-448
      }
    }
  };
  fill_codes(w.w1_q, size_t(E * 2 * I * H));
  fill_codes(w.w2_q, size_t(E * H * I));
  w.w1_scales.resize(size_t(E * 8 * 16));
  w.w2_scales.resize(size_t(E * 16 * 4));
  for (auto& s : w.w1_scales) s = float(rng.uniform(0.5, 1.5) / 448 / std::sqrt(double(H)));
  for (auto& s : w.w2_scales) s = float(rng.uniform(0.5, 1.5) / 448 / std::sqrt(double(I)));
  const auto hidden = to_bf16(random_floats(rng, size_t(T * H), 1.0));
  const TopK tk = random_topk(rng, T, E, k, false);
  const LayerResult res = layer_ref(w, hidden.data(), tk);
  ASSERT_EQ(res.out.size(), size_t(T * H));
  for (double v : res.out) ASSERT_TRUE(std::isfinite(v));

  TopK first;
  first.tokens = 1;
  first.topk = k;
  first.ids.assign(tk.ids.begin(), tk.ids.begin() + k);
  first.weights.assign(tk.weights.begin(), tk.weights.begin() + k);
  const std::vector<bf16> h0(hidden.begin(), hidden.begin() + H);
  const auto want = naive_layer(w, h0, first);
  expect_rows_close(std::vector<double>(res.out.begin(), res.out.begin() + H), want, H, 1e-6);
}

}  // namespace
}  // namespace loom
