// FP8 quantisation reference: the scale formula, 1x128 activation groups (partial ones included),
// 128x128 weight blocks that never span a segment, NaN handling, and the rounding-error bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <limits>
#include <vector>

#include "common/bf16.hpp"
#include "common/parallel.hpp"
#include "common/rng.hpp"
#include "loom/types.hpp"
#include "quant/fp8_e4m3.hpp"
#include "quant/quant_ref.hpp"
#include "quant/scale_divide.hpp"
#include "test_seed.hpp"

namespace loom {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The spec, written out here: amax over the non-NaN elements, scale = max(amax, 1e-10) / 448.
float spec_scale(const std::vector<float>& elems) {
  float amax = 0.0f;
  for (float v : elems)
    if (!std::isnan(v)) amax = std::max(amax, std::fabs(v));
  return std::max(amax, 1e-10f) / 448.0f;
}

uint8_t spec_code(float x, float scale) {
  const float y = x / scale;
  if (std::isnan(y)) return e4m3_from_float(y);
  return e4m3_from_float(std::min(448.0f, std::max(-448.0f, y)));
}

std::vector<float> random_row(Rng& rng, int64_t n, double magnitude) {
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = float(rng.normal() * magnitude);
  return v;
}

TEST(QuantRef, ScaleAndValueFormula) {
  EXPECT_EQ(quant_scale(448.0f), 1.0f);
  EXPECT_EQ(quant_scale(3.5f), 0x1p-7f);
  EXPECT_EQ(quant_scale(0.0f), 1e-10f / 448.0f);  // the floor keeps all-zero groups finite
  EXPECT_EQ(quant_scale(1e-12f), 1e-10f / 448.0f);
  EXPECT_EQ(quant_value(1.0f, 0x1p-7f), 0x70);       // 128 = 2^7: exponent field 14
  EXPECT_EQ(quant_value(-3.5f, 0x1p-7f), 0xfe);      // -448
  EXPECT_EQ(quant_value(1e30f, 0x1p-7f), 0x7e);      // clamped
  EXPECT_EQ(quant_value(-1e30f, 0x1p-7f), 0xfe);
  EXPECT_EQ(quant_value(kNaN, 0x1p-7f), 0x7f);       // NaN passes the clamp
  EXPECT_EQ(quant_value(-0.0f, 1.0f), 0x80);
}

// x / scale must be an IEEE division: find x, s with fl(x / s) = 17 exactly (a tie that goes to 16)
// while fl(x * fl(1 / s)) lands off the tie; a reciprocal-multiply would encode 18 or differ.
TEST(QuantRef, DividesRatherThanMultipliesByReciprocal) {
  int found = 0;
  for (int i = 1; i < 100000 && found < 20; ++i) {
    const float s = quant_scale(1.0f + float(i) * 1e-4f);
    const float inv = 1.0f / s;
    for (float target : {17.0f, 19.0f, 1.0625f, 0x1p-10f * 3}) {
      const float x = target * s;
      if (x / s != target || x * inv == target) continue;
      ++found;
      EXPECT_EQ(quant_value(x, s), e4m3_from_float(target)) << "x=" << x << " s=" << s;
    }
  }
  EXPECT_GT(found, 0);
}

// The kernels divide by the group's reciprocal with one correction (divide_by_scale). Exhaustive:
// every finite bf16 amax (its scale) against every bf16 x with |x| <= amax, signed zeros and
// subnormals included. The codes must equal the IEEE quotient's; the fp32 results may differ only
// below 2^-40, with the same sign (both encode as +-0).
TEST(QuantRef, ReciprocalDivisionKeepsEveryCode) {
  auto bits_to_float = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  };
  std::atomic<int64_t> pairs{0}, code_mismatches{0}, large_differences{0};
  constexpr int64_t kMagnitudes = 0x7f80;  // bf16 magnitudes below +inf
  parallel_for(kMagnitudes, [&](int64_t a0, int64_t a1) {
    int64_t n = 0, bad_codes = 0, large = 0;
    for (int64_t a = a0; a < a1; ++a) {
      const float scale = quant_scale(bits_to_float(uint32_t(a) << 16));
      const float rcp = 1.0f / scale;
      for (uint32_t sign = 0; sign < 2; ++sign)
        for (uint32_t m = 0; m <= uint32_t(a); ++m) {
          const float x = bits_to_float(((sign << 15) | m) << 16);
          const float exact = x / scale, fast = divide_by_scale(x, scale, rcp);
          ++n;
          if (std::memcmp(&exact, &fast, sizeof exact) == 0) continue;
          if (quant_value(x, scale) != e4m3_from_float(fast > 448.0f ? 448.0f : fast < -448.0f ? -448.0f : fast))
            ++bad_codes;
          if (std::fabs(exact) >= 0x1p-40f || std::fabs(fast) >= 0x1p-40f || std::signbit(exact) != std::signbit(fast))
            ++large;
        }
    }
    pairs += n;
    code_mismatches += bad_codes;
    large_differences += large;
  });
  // sum over magnitudes a of 2 (a + 1): every pair was visited.
  EXPECT_EQ(pairs.load(), kMagnitudes * (kMagnitudes + 1));
  EXPECT_EQ(code_mismatches.load(), 0);
  EXPECT_EQ(large_differences.load(), 0);
}

// divide_by_scale on fp32 values (GEMM 1's SiLU*up epilogue quantises fp32 act values so): the
// same quotient as the IEEE division, bit for bit (|quotient| >= 2^-40), for scales over the whole
// range of amax and x at and around every E4M3 value and rounding midpoint times the scale (the
// places where a one-ulp difference would change a code), plus random x within the group's amax.
TEST(QuantRef, ReciprocalDivisionKeepsFp32Quotients) {
  LOOM_FRESH_SEED();
  constexpr int kScales = 4096;
  std::vector<float> amaxes(kScales);
  Rng rng(seed);
  for (float& a : amaxes) a = float(std::ldexp(rng.uniform(1.0, 2.0), int(rng.next() % 100) - 60));
  // E4M3 magnitudes and the midpoints between neighbours (where round-to-nearest decides).
  std::vector<float> points;
  for (int c = 0; c < 0x7f; ++c) {
    points.push_back(e4m3_to_float(uint8_t(c)));
    points.push_back(0.5f * (e4m3_to_float(uint8_t(c)) + e4m3_to_float(uint8_t(c + 1))));
  }
  std::atomic<int64_t> pairs{0}, mismatches{0};
  parallel_for(kScales, [&](int64_t i0, int64_t i1) {
    int64_t n = 0, bad = 0;
    Rng local(seed ^ uint64_t(i0 + 1) * 0x9e3779b97f4a7c15ull);
    for (int64_t i = i0; i < i1; ++i) {
      const float amax = amaxes[size_t(i)], scale = quant_scale(amax), rcp = 1.0f / scale;
      auto check = [&](float x) {
        if (!(std::fabs(x) <= amax)) return;
        const float exact = x / scale, fast = divide_by_scale(x, scale, rcp);
        ++n;
        if (std::memcmp(&exact, &fast, sizeof exact) != 0 && (std::fabs(exact) >= 0x1p-40f || std::signbit(exact) != std::signbit(fast)))
          ++bad;
      };
      for (float pt : points)
        for (float sign : {1.0f, -1.0f}) {
          float x = sign * pt * scale;
          for (int step = 0; step < 4; ++step) x = std::nextafter(x, 0.0f);
          for (int step = 0; step < 9; ++step, x = std::nextafter(x, sign * INFINITY)) check(x);
        }
      for (int r = 0; r < 1024; ++r) check(float(local.uniform(-1.0, 1.0)) * amax);
    }
    pairs += n;
    mismatches += bad;
  });
  EXPECT_GT(pairs.load(), int64_t(kScales) * 1024);
  EXPECT_EQ(mismatches.load(), 0) << "of " << pairs.load() << " pairs";
}

TEST(QuantRef, HandWorkedRow) {
  // amax 3.5 = 448 * 2^-7, so scale = 2^-7 exactly and x / scale = 128 x exactly.
  std::vector<float> x(128);
  // Pattern (c % 7 - 3) / 8 -> scaled -48..48, all exact codes.
  const uint8_t pattern_codes[7] = {0xe4, 0xe0, 0xd8, 0x00, 0x58, 0x60, 0x64};
  for (int c = 0; c < 128; ++c) x[size_t(c)] = float(c % 7 - 3) / 8.0f;
  x[0] = 3.5f;              // 448 -> 0x7e
  x[1] = -1.0f;             // -128 -> 0xf0
  x[2] = 17.0f / 128;       // 17: tie 16|18 -> 16 = 0x58
  x[3] = 19.0f / 128;       // 19: tie 18|20 -> 20 = 0x5a
  x[4] = 0x1p-17f * 3;      // 3 * 2^-10: subnormal tie 1|2 steps -> 0x02
  x[5] = 1e-3f;             // 0.128 -> 0.125 = 0x20
  x[6] = -0x1p-18f;         // 2^-11: below half the smallest subnormal -> -0 = 0x80
  const uint8_t head[7] = {0x7e, 0xf0, 0x58, 0x5a, 0x02, 0x20, 0x80};
  std::vector<uint8_t> q(128);
  float scale = 0;
  quantize_1x128_ref(x.data(), 1, 128, q.data(), &scale);
  EXPECT_EQ(scale, 0x1p-7f);
  for (int c = 0; c < 128; ++c) {
    const uint8_t want = c < 7 ? head[c] : pattern_codes[c % 7];
    EXPECT_EQ(q[size_t(c)], want) << "column " << c;
  }

  // amax 1: scale = fl(1/448) is inexact, so 1 / scale lands a hair off 448 and the clamp decides.
  std::vector<float> y(128, 0.5f);
  y[7] = -1.0f;
  quantize_1x128_ref(y.data(), 1, 128, q.data(), &scale);
  EXPECT_EQ(scale, 1.0f / 448.0f);
  EXPECT_EQ(q[7], 0xfe);
  EXPECT_EQ(q[0], 0x76);  // 0.5 / fl(1/448) = 224 (1 +- 2^-24) -> 224 = 1.75 * 2^7
}

TEST(QuantRef, PartialGroupsHaveTheirOwnScale) {
  LOOM_FRESH_SEED();
  Rng rng(seed);
  for (int64_t cols : {192, 80, 320, 16, 128, 256}) {
    SCOPED_TRACE("cols=" + std::to_string(cols));
    const int64_t rows = 3, nb = quant_blocks(cols);
    EXPECT_EQ(nb, (cols + 127) / 128);
    std::vector<float> x;
    for (int64_t r = 0; r < rows; ++r) {
      // The last (maybe partial) group is 100x smaller: a scale taken over the whole row would show.
      auto row = random_row(rng, cols, 1.0);
      for (int64_t c = (nb - 1) * 128; c < cols && nb > 1; ++c) row[size_t(c)] *= 0.01f;
      x.insert(x.end(), row.begin(), row.end());
    }
    // Sentinels past the end: the reference writes exactly rows * cols codes and rows * nb scales.
    std::vector<uint8_t> q(size_t(rows * cols + 8), 0xaa);
    std::vector<float> s(size_t(rows * nb + 4), -7.0f);
    quantize_1x128_ref(x.data(), rows, cols, q.data(), s.data());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t c0 = b * 128, c1 = std::min(cols, c0 + 128);
        const std::vector<float> group(x.begin() + r * cols + c0, x.begin() + r * cols + c1);
        const float want = spec_scale(group);
        ASSERT_EQ(s[size_t(r * nb + b)], want) << "row " << r << " group " << b;
        for (int64_t c = c0; c < c1; ++c)
          ASSERT_EQ(q[size_t(r * cols + c)], spec_code(x[size_t(r * cols + c)], want)) << r << "," << c;
      }
    for (size_t i = size_t(rows * cols); i < q.size(); ++i) EXPECT_EQ(q[i], 0xaa);
    for (size_t i = size_t(rows * nb); i < s.size(); ++i) EXPECT_EQ(s[i], -7.0f);
    if (nb > 1) {  // the short last group really is scaled on its own
      const std::vector<float> row0(x.begin(), x.begin() + cols);
      EXPECT_LT(s[size_t(nb - 1)], spec_scale(row0));
    }
  }
}

TEST(QuantRef, NanStaysNanAndDoesNotMoveTheScale) {
  LOOM_FRESH_SEED();
  Rng rng(seed);
  const int64_t cols = 192;
  auto x = random_row(rng, cols, 2.0);
  std::vector<uint8_t> q_clean(cols), q(cols);
  float s_clean[2], s[2];
  quantize_1x128_ref(x.data(), 1, cols, q_clean.data(), s_clean);
  const int64_t at = int64_t(rng.below(uint64_t(cols)));
  x[size_t(at)] = (rng.below(2) ? 1.0f : -1.0f) * kNaN;
  quantize_1x128_ref(x.data(), 1, cols, q.data(), s);
  EXPECT_EQ(q[size_t(at)], 0x7f);
  EXPECT_TRUE(std::isnan(e4m3_to_float(q[size_t(at)])));
  // The group's scale is that of its other elements.
  const int64_t b = at / 128;
  std::vector<float> others(x.begin() + b * 128, x.begin() + std::min<int64_t>(cols, b * 128 + 128));
  EXPECT_EQ(s[b], spec_scale(others));
  for (int64_t c = 0; c < cols; ++c)
    if (c != at && (s[b] == s_clean[b] || c / 128 != b)) {
      EXPECT_EQ(q[size_t(c)], q_clean[size_t(c)]) << c;
    }

  // An all-NaN group: amax 0, so the floor scale; codes NaN.
  std::vector<float> nan_row(16, kNaN);
  quantize_1x128_ref(nan_row.data(), 1, 16, q.data(), s);
  EXPECT_EQ(s[0], 1e-10f / 448.0f);
  for (int c = 0; c < 16; ++c) EXPECT_EQ(q[size_t(c)], 0x7f);
}

// Every element's code is the nearest E4M3 value to its scaled value: error <= half an ulp there,
// and the group's largest element maps to +-448.
TEST(QuantRef, ErrorWithinHalfUlpProperty) {
  LOOM_FRESH_SEED();
  Rng rng(seed);
  for (int trial = 0; trial < 6; ++trial) {
    const int64_t rows = 1 + int64_t(rng.below(40));
    const int64_t cols = 16 * (1 + int64_t(rng.below(40)));
    SCOPED_TRACE("rows=" + std::to_string(rows) + " cols=" + std::to_string(cols));
    std::vector<float> x;
    for (int64_t r = 0; r < rows; ++r) {
      const auto row = random_row(rng, cols, std::pow(10.0, rng.uniform(-6, 4)));  // wide dynamic range
      x.insert(x.end(), row.begin(), row.end());
    }
    const int64_t nb = quant_blocks(cols);
    std::vector<uint8_t> q(size_t(rows * cols));
    std::vector<float> s(size_t(rows * nb));
    quantize_1x128_ref(x.data(), rows, cols, q.data(), s.data());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b < nb; ++b) {
        const float scale = s[size_t(r * nb + b)];
        float amax = 0;
        for (int64_t c = b * 128; c < std::min(cols, b * 128 + 128); ++c) amax = std::max(amax, std::fabs(x[size_t(r * cols + c)]));
        for (int64_t c = b * 128; c < std::min(cols, b * 128 + 128); ++c) {
          const float xv = x[size_t(r * cols + c)];
          const float y = std::min(448.0f, std::max(-448.0f, xv / scale));
          ASSERT_LE(std::fabs(y), 448.0f);
          const float back = e4m3_to_float(q[size_t(r * cols + c)]);
          ASSERT_LE(std::fabs(double(back) - double(y)), double(e4m3_half_ulp(y))) << r << "," << c;
          // In the original units: the half ulp plus the fp32 division's own rounding.
          const double err = std::fabs(double(back) * scale - double(xv));
          ASSERT_LE(err, (double(e4m3_half_ulp(y)) + std::fabs(double(y)) * 0x1p-23) * scale) << r << "," << c;
          if (std::fabs(xv) == amax) {
            ASSERT_EQ(q[size_t(r * cols + c)] & 0x7f, 0x7e);
          }
        }
      }

    // The bf16 overload quantises the same values the same way.
    std::vector<bf16> xb(x.size());
    std::vector<float> xr(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      xb[i] = float_to_bf16(x[i]);
      xr[i] = bf16_to_float(xb[i]);
    }
    std::vector<uint8_t> qb(q.size()), qr(q.size());
    std::vector<float> sb(s.size()), sr(s.size());
    quantize_1x128_ref(xb.data(), rows, cols, qb.data(), sb.data());
    quantize_1x128_ref(xr.data(), rows, cols, qr.data(), sr.data());
    EXPECT_EQ(qb, qr);
    EXPECT_EQ(sb, sr);
  }
}

// Checks quantize_128x128_ref on [rows, cols] split into segments, block by block, against the
// spec computed here from the block's own elements.
void check_weight_blocks(const std::vector<float>& w, int64_t rows, int64_t cols, int64_t segment_rows,
                         std::vector<float>* scales_out = nullptr) {
  const int64_t seg_blocks = (segment_rows + 127) / 128, col_blocks = (cols + 127) / 128;
  const int64_t row_blocks = (rows / segment_rows) * seg_blocks;
  ASSERT_EQ(weight_row_blocks(rows, segment_rows), row_blocks);
  std::vector<uint8_t> q(size_t(rows * cols + 8), 0xaa);
  std::vector<float> s(size_t(row_blocks * col_blocks + 4), -7.0f);
  quantize_128x128_ref(w.data(), rows, cols, segment_rows, q.data(), s.data());
  int64_t rb = 0;
  for (int64_t seg = 0; seg < rows / segment_rows; ++seg)
    for (int64_t r0 = seg * segment_rows; r0 < (seg + 1) * segment_rows; r0 += 128, ++rb) {
      const int64_t r1 = std::min((seg + 1) * segment_rows, r0 + 128);
      for (int64_t r = r0; r < r1; ++r) ASSERT_EQ(weight_row_block(r, segment_rows), rb) << "row " << r;
      for (int64_t cb = 0; cb < col_blocks; ++cb) {
        const int64_t c0 = cb * 128, c1 = std::min(cols, c0 + 128);
        std::vector<float> block;
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = c0; c < c1; ++c) block.push_back(w[size_t(r * cols + c)]);
        const float want = spec_scale(block);
        ASSERT_EQ(s[size_t(rb * col_blocks + cb)], want) << "block " << rb << "," << cb;
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = c0; c < c1; ++c)
            ASSERT_EQ(q[size_t(r * cols + c)], spec_code(w[size_t(r * cols + c)], want)) << r << "," << c;
      }
    }
  ASSERT_EQ(rb, row_blocks);
  for (size_t i = size_t(rows * cols); i < q.size(); ++i) EXPECT_EQ(q[i], 0xaa);
  for (size_t i = size_t(row_blocks * col_blocks); i < s.size(); ++i) EXPECT_EQ(s[i], -7.0f);
  if (scales_out) scales_out->assign(s.begin(), s.begin() + row_blocks * col_blocks);
}

TEST(QuantRef, WeightGateAndUpNeverShareABlock) {
  LOOM_FRESH_SEED();
  Rng rng(seed);
  // w13 with I = 80: gate rows 0..79, up rows 80..159, cols 192 (two column blocks, one partial).
  // The up half is 1000x larger; if a block spanned both halves the gate scales would show it.
  const int64_t I = 80, rows = 2 * I, cols = 192;
  std::vector<float> w(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) w[size_t(r * cols + c)] = float(rng.normal() * (r < I ? 0.01 : 10.0));
  std::vector<float> s;
  check_weight_blocks(w, rows, cols, I, &s);
  ASSERT_EQ(s.size(), 4u);  // 2 row blocks (gate, up) x 2 column blocks
  for (int cb = 0; cb < 2; ++cb) {
    EXPECT_LT(s[size_t(cb)], 0.2f / 448.0f) << "gate block sees the up half";
    EXPECT_GT(s[size_t(2 + cb)], 10.0f / 448.0f);
  }
  EXPECT_EQ(weight_row_block(79, I), 0);
  EXPECT_EQ(weight_row_block(80, I), 1);
  // One segment for the whole matrix would mix them: a different (larger) gate scale.
  std::vector<uint8_t> q(size_t(rows * cols));
  std::vector<float> s_one(size_t(2 * 2));
  quantize_128x128_ref(w.data(), rows, cols, rows, q.data(), s_one.data());
  EXPECT_GT(s_one[0], s[0]);
}

TEST(QuantRef, WeightPartialBlocks) {
  LOOM_FRESH_SEED();
  Rng rng(seed);
  struct Case { int64_t rows, cols, segment; };
  for (const Case& k : {Case{400, 320, 200}, Case{272, 144, 272}, Case{160, 192, 80}, Case{128, 128, 128},
                        Case{48, 16, 16}, Case{512, 256, 256}}) {
    SCOPED_TRACE("rows=" + std::to_string(k.rows) + " cols=" + std::to_string(k.cols) +
                 " segment=" + std::to_string(k.segment));
    std::vector<float> w(size_t(k.rows * k.cols));
    for (auto& v : w) v = float(rng.normal() * std::pow(10.0, rng.uniform(-2, 2)));
    // A NaN weight is ignored by its block's amax and stays NaN.
    w[size_t(rng.below(w.size()))] = kNaN;
    check_weight_blocks(w, k.rows, k.cols, k.segment);
  }
  EXPECT_THROW(weight_row_blocks(100, 80), Error);
  EXPECT_THROW(weight_row_blocks(160, 0), Error);
}

TEST(QuantRef, FragmentOrderMovesWordsWithinEachGroup) {
  // Two rows of two 128-byte groups, byte i = i % 251: word w of each group lands at
  // 16 (w / 16) + 4 (w % 4) + 2 (w / 8 % 2) + w / 4 % 2.
  std::vector<uint8_t> q(512), out(512, 0);
  for (size_t i = 0; i < q.size(); ++i) q[i] = uint8_t(i % 251);
  to_fragment_order(q.data(), 2, 256, out.data());
  for (int group = 0; group < 4; ++group)
    for (int w = 0; w < 32; ++w)
      for (int b = 0; b < 4; ++b)
        EXPECT_EQ(out[size_t(group * 128 + 4 * (16 * (w / 16) + 4 * (w % 4) + 2 * (w / 8 % 2) + w / 4 % 2) + b)],
                  q[size_t(group * 128 + 4 * w + b)]);
  // Hand-checked: word 1 (k32 step 0, quad lane 1) opens lane 1's first 16 bytes; word 4 (step 0,
  // upper half, lane 0) follows word 0; word 16 (step 2, lane 0) opens the second 64 bytes.
  EXPECT_EQ(out[16], q[4]);
  EXPECT_EQ(out[4], q[16]);
  EXPECT_EQ(out[64], q[64]);
  EXPECT_EQ(out[68], q[80]);
  EXPECT_THROW(to_fragment_order(q.data(), 1, 192, out.data()), Error);
}

}  // namespace
}  // namespace loom
