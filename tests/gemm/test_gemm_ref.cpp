// Grouped GEMM reference (fp8 and bf16) against hand values and a naive long-double triple loop,
// plus SiLU*mul and the slot-ordered combine.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "common/bf16.hpp"
#include "common/rng.hpp"
#include "dispatch/dispatch_ref.hpp"
#include "gemm/gemm_ref.hpp"
#include "quant/quant_ref.hpp"
#include "route/route_ref.hpp"
#include "test_seed.hpp"

namespace loom {
namespace {

// E4M3 value from the format's definition (not the library's decoder).
long double e4m3_value(uint8_t c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  if (e == 15 && m == 7) return std::numeric_limits<long double>::quiet_NaN();
  const long double mag = e == 0 ? std::ldexp((long double)m, -9) : std::ldexp(1.0L + m / 8.0L, e - 7);
  return s ? -mag : mag;
}

uint8_t random_code(Rng& rng) {
  for (;;) {
    const uint8_t c = uint8_t(rng.below(256));
    if ((c & 0x7f) != 0x7f) return c;  // no NaN codes in random operands
  }
}

std::vector<int32_t> offsets_from_counts(const std::vector<int32_t>& counts) {
  std::vector<int32_t> off(counts.size() + 1, 0);
  for (size_t e = 0; e < counts.size(); ++e) off[e + 1] = off[e] + counts[e];
  return off;
}

TEST(GemmRef, TinyHandCaseFp8) {
  // E = 2, K = 32, N = 16. Expert 0 holds sorted rows 0 and 1, expert 1 row 2.
  const int64_t K = 32, N = 16;
  std::vector<uint8_t> aq(3 * K);
  std::vector<float> as = {0.5f, 2.0f, 0.25f};  // one 1x128 group per row (K < 128)
  for (int64_t k = 0; k < K; ++k) {
    aq[size_t(k)] = 0x38;                              // row 0: all 1.0
    aq[size_t(K + k)] = k < 16 ? 0x40 : 0xb8;          // row 1: 2.0 then -1.0
    const uint8_t pattern[4] = {0x38, 0x40, 0xb8, 0x30};  // 1, 2, -1, 0.5
    aq[size_t(2 * K + k)] = pattern[k % 4];           // row 2
  }
  std::vector<uint8_t> wq(2 * N * K, 0x00);
  std::vector<float> ws = {3.0f, 1.0f};  // one 128x128 block per expert
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      wq[size_t(n * K + k)] = 0x38;                                // expert 0: all 1.0 (x3)
      wq[size_t((N + n) * K + k)] = k == n ? 0x40 : 0x00;          // expert 1: 2 * identity
    }
  ActivationRows a{DType::fp8, 3, K, aq.data(), as.data(), nullptr};
  ExpertWeights w{DType::fp8, 2, N, K, N, wq.data(), ws.data(), nullptr};
  const std::vector<int32_t> off = {0, 2, 3};
  std::vector<double> out(3 * N, -1.0);
  grouped_gemm_ref(a, off.data(), w, out.data());
  const double row2[4] = {1, 2, -1, 0.5};
  for (int64_t n = 0; n < N; ++n) {
    EXPECT_EQ(out[size_t(n)], 32 * 0.5 * 3) << n;                       // 48
    EXPECT_EQ(out[size_t(N + n)], (16 * 2.0 - 16 * 1.0) * 2.0 * 3) << n;  // 96
    EXPECT_EQ(out[size_t(2 * N + n)], row2[n % 4] * 0.25 * 2.0) << n;    // a[n] * 2
  }
}

TEST(GemmRef, HandCaseScalesPerBlockAndSegment) {
  // K = 256: two K blocks with their own scales. N = 16 rows in two segments of 8 (gate | up),
  // whose blocks carry different scales.
  const int64_t K = 256, N = 16;
  std::vector<uint8_t> aq(K, 0x38);            // 1.0
  std::vector<float> as = {1.0f, 4.0f};        // K block 0, K block 1
  std::vector<uint8_t> wq(N * K, 0x38);        // 1.0
  // scales [row_blocks = 2][col_blocks = 2]: gate (2, 0.5), up (10, 0.25)
  std::vector<float> ws = {2.0f, 0.5f, 10.0f, 0.25f};
  ActivationRows a{DType::fp8, 1, K, aq.data(), as.data(), nullptr};
  ExpertWeights w{DType::fp8, 1, N, K, 8, wq.data(), ws.data(), nullptr};
  const std::vector<int32_t> off = {0, 1};
  std::vector<double> out(N);
  grouped_gemm_ref(a, off.data(), w, out.data());
  for (int64_t n = 0; n < N; ++n) {
    const double want = n < 8 ? 128 * 1.0 * 2 + 128 * 4.0 * 0.5 : 128 * 1.0 * 10 + 128 * 4.0 * 0.25;
    EXPECT_EQ(out[size_t(n)], want) << n;  // 512 (gate), 1408 (up)
  }
}

struct RandomProblem {
  int64_t E, N, K, segment;
  std::vector<int32_t> offsets;
  std::vector<uint8_t> aq, wq;
  std::vector<float> as, ws;
  std::vector<bf16> ax, wx;
};

RandomProblem make_problem(Rng& rng, DType dtype) {
  RandomProblem p;
  p.E = 1 + int64_t(rng.below(6));
  p.K = 16 * (1 + int64_t(rng.below(25)));  // up to 400: partial K blocks
  p.N = 2 * (1 + int64_t(rng.below(100)));  // any even width: exercises ragged output panels
  p.segment = rng.below(2) ? p.N / 2 : p.N;
  std::vector<int32_t> counts(size_t(p.E));
  for (auto& c : counts) c = int32_t(rng.below(30));
  counts[size_t(rng.below(uint64_t(p.E)))] = 0;  // at least one idle expert
  counts[size_t(rng.below(uint64_t(p.E)))] = 1 + int32_t(rng.below(70));
  p.offsets = offsets_from_counts(counts);
  const int64_t R = p.offsets.back();
  if (dtype == DType::fp8) {
    p.aq.resize(size_t(R * p.K));
    for (auto& c : p.aq) c = random_code(rng);
    p.as.resize(size_t(R * quant_blocks(p.K)));
    for (auto& s : p.as) s = float(std::exp(rng.uniform(-8, 2)));
    p.wq.resize(size_t(p.E * p.N * p.K));
    for (auto& c : p.wq) c = random_code(rng);
    p.ws.resize(size_t(p.E * weight_row_blocks(p.N, p.segment) * quant_blocks(p.K)));
    for (auto& s : p.ws) s = float(std::exp(rng.uniform(-8, 2)));
  } else {
    p.ax.resize(size_t(R * p.K));
    for (auto& v : p.ax) v = float_to_bf16(float(rng.normal()));
    p.wx.resize(size_t(p.E * p.N * p.K));
    for (auto& v : p.wx) v = float_to_bf16(float(rng.normal() * 0.05));
  }
  return p;
}

// out[r, n] by the definition, in long double; returns also sum |terms| for the tolerance.
void naive_gemm(const RandomProblem& p, DType dtype, std::vector<long double>& ref, std::vector<long double>& mag) {
  const int64_t R = p.offsets.back(), kb = quant_blocks(p.K);
  const int64_t rb_per_seg = (p.segment + 127) / 128;
  const int64_t row_blocks = (p.N / p.segment) * rb_per_seg;
  ref.assign(size_t(R * p.N), 0.0L);
  mag.assign(size_t(R * p.N), 0.0L);
  for (int64_t e = 0; e < p.E; ++e)
    for (int64_t r = p.offsets[size_t(e)]; r < p.offsets[size_t(e + 1)]; ++r)
      for (int64_t n = 0; n < p.N; ++n) {
        const int64_t wrb = (n / p.segment) * rb_per_seg + (n % p.segment) / 128;
        long double acc = 0, m = 0;
        for (int64_t k = 0; k < p.K; ++k) {
          long double av, wv;
          if (dtype == DType::fp8) {
            av = e4m3_value(p.aq[size_t(r * p.K + k)]) * p.as[size_t(r * kb + k / 128)];
            wv = e4m3_value(p.wq[size_t((e * p.N + n) * p.K + k)]) *
                 p.ws[size_t((e * row_blocks + wrb) * kb + k / 128)];
          } else {
            av = bf16_to_float(p.ax[size_t(r * p.K + k)]);
            wv = bf16_to_float(p.wx[size_t((e * p.N + n) * p.K + k)]);
          }
          acc += av * wv;
          m += std::fabs(av * wv);
        }
        ref[size_t(r * p.N + n)] = acc;
        mag[size_t(r * p.N + n)] = m;
      }
}

void check_random(DType dtype) {
  LOOM_FRESH_SEED();
  Rng rng(seed);
  for (int trial = 0; trial < 8; ++trial) {
    const RandomProblem p = make_problem(rng, dtype);
    SCOPED_TRACE("E=" + std::to_string(p.E) + " N=" + std::to_string(p.N) + " K=" + std::to_string(p.K) +
                 " segment=" + std::to_string(p.segment) + " rows=" + std::to_string(p.offsets.back()));
    const int64_t R = p.offsets.back();
    ActivationRows a{dtype, R, p.K, p.aq.data(), p.as.data(), p.ax.data()};
    ExpertWeights w{dtype, p.E, p.N, p.K, p.segment, p.wq.data(), p.ws.data(), p.wx.data()};
    std::vector<double> out(size_t(R * p.N + 3), -12345.0);  // 3 sentinels past the end
    grouped_gemm_ref(a, p.offsets.data(), w, out.data());
    std::vector<long double> ref, mag;
    naive_gemm(p, dtype, ref, mag);
    for (int64_t i = 0; i < R * p.N; ++i) {
      // Double accumulation in k order: error <= K * 2^-53 * sum |terms|.
      const long double tol = mag[size_t(i)] * p.K * 0x1p-52L + 1e-300L;
      ASSERT_LE(std::fabs(out[size_t(i)] - ref[size_t(i)]), tol)
          << "row " << i / p.N << " col " << i % p.N << " got " << out[size_t(i)] << " want " << double(ref[size_t(i)]);
    }
    for (int64_t i = R * p.N; i < R * p.N + 3; ++i) EXPECT_EQ(out[size_t(i)], -12345.0);
  }
}

TEST(GemmRef, Fp8MatchesNaiveLongDouble) { check_random(DType::fp8); }
TEST(GemmRef, Bf16MatchesNaiveLongDouble) { check_random(DType::bf16); }

TEST(GemmRef, ExpertsWithNoRows) {
  LOOM_FRESH_SEED();
  Rng rng(seed);
  // Experts 0, 2, 4 idle (first, middle, last). Their weights are all NaN codes: any leak of an idle
  // expert's (or a neighbour's) weights into another expert's rows would show as NaN.
  const int64_t E = 5, N = 32, K = 160;
  const std::vector<int32_t> counts = {0, 3, 0, 2, 0};
  const auto off = offsets_from_counts(counts);
  const int64_t R = off.back();
  std::vector<uint8_t> aq(size_t(R * K)), wq(size_t(E * N * K), 0x7f);
  for (auto& c : aq) c = random_code(rng);
  for (int64_t e : {1, 3})
    for (int64_t i = 0; i < N * K; ++i) wq[size_t(e * N * K + i)] = random_code(rng);
  std::vector<float> as(size_t(R * 2), 0.5f), ws(size_t(E * 1 * 2), 0.25f);
  ActivationRows a{DType::fp8, R, K, aq.data(), as.data(), nullptr};
  ExpertWeights w{DType::fp8, E, N, K, N, wq.data(), ws.data(), nullptr};
  std::vector<double> out(size_t(R * N));
  grouped_gemm_ref(a, off.data(), w, out.data());
  for (int64_t r = 0; r < R; ++r) {
    const int64_t e = r < 3 ? 1 : 3;
    for (int64_t n = 0; n < N; ++n) {
      long double want = 0;
      for (int64_t k = 0; k < K; ++k)
        want += e4m3_value(aq[size_t(r * K + k)]) * 0.5L * e4m3_value(wq[size_t((e * N + n) * K + k)]) * 0.25L;
      ASSERT_NEAR(out[size_t(r * N + n)], double(want), 1e-9 * (1 + std::fabs(double(want)))) << r << "," << n;
    }
  }
  // No rows at all: nothing is read, even with null activations.
  const std::vector<int32_t> none(E + 1, 0);
  ActivationRows empty{DType::fp8, 0, K, nullptr, nullptr, nullptr};
  EXPECT_NO_THROW(grouped_gemm_ref(empty, none.data(), w, nullptr));
  // Mismatched K is an error, not a silent misread.
  ActivationRows bad{DType::fp8, R, K - 16, aq.data(), as.data(), nullptr};
  EXPECT_THROW(grouped_gemm_ref(bad, off.data(), w, out.data()), Error);
}

TEST(GemmRef, SiluMulHandValues) {
  // h rows of [gate(4) | up(4)]; act = silu(gate) * up = gate / (1 + e^-gate) * up.
  const double inf_neg = -800.0;  // e^800 overflows: silu -> -0, never NaN
  const std::vector<double> h = {0.0, 1.0, -1.0, 20.0, /* up */ 3.0, 2.0, -4.0, 0.5,
                                 inf_neg, 2.5, std::nan(""), -0.5, /* up */ 7.0, 1.0, 1.0, 1e30};
  std::vector<float> act(8);
  silu_mul_ref(h.data(), 2, 4, act.data());
  const double s1 = 0.7310585786300049;   // silu(1) = 1 / (1 + e^-1)
  const double sm1 = -0.2689414213699951;  // silu(-1)
  // Products formed in double and rounded once to fp32.
  EXPECT_EQ(act[0], 0.0f);
  EXPECT_EQ(act[1], float(s1 * 2.0));
  EXPECT_EQ(act[2], float(sm1 * -4.0));
  EXPECT_EQ(act[3], float(20.0 / (1.0 + 2.061153622438558e-09) * 0.5));  // e^-20
  EXPECT_EQ(act[4], 0.0f);
  EXPECT_FALSE(std::isnan(act[4]));
  EXPECT_EQ(act[5], float(2.5 / (1.0 + 0.0820849986238988)));  // e^-2.5
  EXPECT_TRUE(std::isnan(act[6]));
  EXPECT_EQ(act[7], float(-0.5 / (1.0 + 1.6487212707001282) * 1e30));  // e^0.5; 1.9e29 fits fp32
}

// Random values against long double: the double computation rounded once to fp32 is the correctly
// rounded result except when the exact value lies within ~2^-52 of an fp32 midpoint (odds ~2^-28).
TEST(GemmRef, SiluMulRoundsOnceToFp32) {
  LOOM_FRESH_SEED();
  Rng rng(seed);
  const int64_t rows = 37, I = 48;
  std::vector<double> h(size_t(rows * 2 * I));
  for (auto& v : h) v = rng.normal() * 4.0;
  std::vector<float> act(size_t(rows * I));
  silu_mul_ref(h.data(), rows, I, act.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < I; ++i) {
      const long double g = h[size_t(r * 2 * I + i)], u = h[size_t(r * 2 * I + I + i)];
      ASSERT_EQ(act[size_t(r * I + i)], float(g / (1.0L + std::exp(-g)) * u)) << r << "," << i;
    }
}

TEST(GemmRef, CombineInSlotOrderWithDroppedRoutes) {
  // T = 2, k = 3, E = 3. Token 0 routes to experts 2, 0 and 7 (out of range: dropped);
  // token 1 to experts 1, 2, 0.
  TopK topk;
  topk.tokens = 2;
  topk.topk = 3;
  topk.ids = {2, 0, 7, 1, 2, 0};
  topk.weights = {0.5f, 0.25f, 0.125f, 1.0f, 1.0f, 1.0f};
  const Dispatch d = dispatch_ref(topk.ids.data(), 2, 3, 3);
  // Sorted rows: expert 0 {t0 s1, t1 s2}, expert 1 {t1 s0}, expert 2 {t0 s0, t1 s1}.
  ASSERT_EQ(d.route_row, (std::vector<int32_t>{3, 0, -1, 2, 4, 1}));
  const int64_t cols = 3;
  std::vector<double> y(5 * cols);
  auto row = [&](int r) { return y.data() + r * cols; };
  // Token 0: slot 0 -> row 3, slot 1 -> row 0.
  row(3)[0] = 2.0, row(3)[1] = -4.0, row(3)[2] = 8.0;
  row(0)[0] = 16.0, row(0)[1] = 1.0, row(0)[2] = -2.0;
  // Token 1: slot 0 -> row 2 (1e16), slot 1 -> row 4 (1), slot 2 -> row 1 (-1e16). In slot order,
  // (1e16 + 1) - 1e16 = 0 in double (1 is below half an ulp of 1e16); in row order the sum is 1.
  for (int c = 0; c < cols; ++c) row(2)[c] = 1e16, row(4)[c] = 1.0, row(1)[c] = -1e16;
  std::vector<double> out(2 * cols, 99.0);
  combine_ref(y.data(), cols, d, topk, out.data());
  EXPECT_EQ(out[0], 0.5 * 2.0 + 0.25 * 16.0);   // 5
  EXPECT_EQ(out[1], 0.5 * -4.0 + 0.25 * 1.0);   // -1.75
  EXPECT_EQ(out[2], 0.5 * 8.0 + 0.25 * -2.0);   // 3.5
  for (int c = 0; c < cols; ++c) EXPECT_EQ(out[size_t(cols + c)], 0.0) << c;
}

}  // namespace
}  // namespace loom
