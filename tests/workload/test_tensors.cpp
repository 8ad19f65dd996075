// Hidden states and expert weights: shapes, value ranges, FP8 block layout, determinism.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/bf16.hpp"
#include "test_seed.hpp"
#include "workload/workload.hpp"

namespace loom {
namespace {

Shape make_shape(int64_t T, int64_t H, int64_t I, int64_t E, int64_t k, Mode mode, DType dtype) {
  Shape s;
  s.tokens = T;
  s.hidden = H;
  s.inter = I;
  s.experts = E;
  s.topk = k;
  s.mode = mode;
  s.dtype = dtype;
  return s;
}

bool same_bits(const std::vector<bf16>& a, const std::vector<bf16>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(bf16)) == 0);
}
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

bool same_weights(const LayerWeights& a, const LayerWeights& b) {
  return a.w1_q == b.w1_q && a.w2_q == b.w2_q && same_bits(a.w1_scales, b.w1_scales) &&
         same_bits(a.w2_scales, b.w2_scales) && same_bits(a.w1, b.w1) && same_bits(a.w2, b.w2);
}

int64_t ceil128(int64_t n) { return (n + 127) / 128; }

// hidden: [T, H] bf16, finite, never zero, rows of different magnitude around N(0, 1) x [0.5, 2].
TEST(WorkloadHidden, ShapeAndValues) {
  LOOM_FRESH_SEED();
  const int64_t T = 64, H = 272;
  const std::vector<bf16> h = make_hidden(make_shape(T, H, 16, 4, 2, Mode::single, DType::fp8), seed);
  ASSERT_EQ(int64_t(h.size()), T * H);
  double lo_rms = 1e9, hi_rms = 0;
  for (int64_t t = 0; t < T; ++t) {
    double sq = 0;
    for (int64_t i = 0; i < H; ++i) {
      const bf16 v = h[size_t(t * H + i)];
      ASSERT_NE(v.bits & 0x7fff, 0) << "zero at " << t << "," << i;
      const float f = bf16_to_float(v);
      ASSERT_TRUE(std::isfinite(f));
      sq += double(f) * f;
    }
    const double rms = std::sqrt(sq / double(H));
    lo_rms = std::min(lo_rms, rms);
    hi_rms = std::max(hi_rms, rms);
  }
  // The rms of 272 normals is within ~4% of the row's magnitude (one sd); the bounds allow 30%.
  EXPECT_GT(lo_rms, 0.5 * 0.7);
  EXPECT_LT(hi_rms, 2.0 * 1.3);
  // 64 log-uniform magnitudes over a factor 4 all within a factor 1.3: probability ~1e-20.
  EXPECT_GT(hi_rms / lo_rms, 1.3);
}

// Same seed, same bytes; another seed, other bytes; fewer tokens give the first rows (per-token
// streams, so thread chunking cannot matter); T = 0 is empty.
TEST(WorkloadHidden, DeterministicAndPrefixStable) {
  LOOM_FRESH_SEED();
  const Shape shape = make_shape(200, 128, 16, 4, 2, Mode::ffn, DType::bf16);
  const std::vector<bf16> a = make_hidden(shape, seed);
  EXPECT_TRUE(same_bits(a, make_hidden(shape, seed)));
  EXPECT_FALSE(same_bits(a, make_hidden(shape, seed + 1)));
  Shape few = shape;
  few.tokens = 3;
  const std::vector<bf16> b = make_hidden(few, seed);
  ASSERT_EQ(b.size(), 3u * 128);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), b.size() * sizeof(bf16)), 0);
  few.tokens = 0;
  EXPECT_TRUE(make_hidden(few, seed).empty());
}

// Each quantisation block of one expert's [rows, cols] codes (rows split into segments of
// segment_rows first) holds a code of magnitude 448 (0x7e / 0xfe): its largest |w| divided by
// the block's own scale amax/448. A block that straddled two segments, or a missing block, would
// leave one side without it. No code is NaN (0x7f / 0xff).
void expect_blocks_reach_448(const uint8_t* q, int64_t rows, int64_t cols, int64_t segment_rows) {
  for (int64_t s0 = 0; s0 < rows; s0 += segment_rows) {
    for (int64_t r0 = s0; r0 < s0 + segment_rows; r0 += 128) {
      const int64_t r1 = std::min(r0 + 128, s0 + segment_rows);
      for (int64_t c0 = 0; c0 < cols; c0 += 128) {
        const int64_t c1 = std::min(c0 + 128, cols);
        bool hit = false;
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = c0; c < c1; ++c) {
            const uint8_t m = q[r * cols + c] & 0x7f;
            ASSERT_NE(m, 0x7f) << "NaN code at " << r << "," << c;
            hit |= m == 0x7e;
          }
        EXPECT_TRUE(hit) << "block rows [" << r0 << "," << r1 << ") cols [" << c0 << "," << c1 << ")";
      }
    }
  }
}

// The block amax (448 * scale) of U(-1, 1)/sqrt(cols) x [0.25, 4] x [0.5, 2] (per block) weights:
// at most 8/sqrt(cols), and at least 0.9 x 0.125/sqrt(cols) (the smallest block here has >= 1024
// draws; P(max|U| < 0.9) = 0.9^1024).
void expect_scales_in_range(const std::vector<float>& scales, int64_t cols) {
  const double top = 8.0 / std::sqrt(double(cols)), bottom = 0.9 * 0.125 / std::sqrt(double(cols));
  for (const float s : scales) {
    ASSERT_TRUE(std::isfinite(s));
    ASSERT_GT(s, 0.0f);
    EXPECT_LE(448.0 * s, top * 1.0001);
    EXPECT_GE(448.0 * s, bottom);
  }
}

// single fp8: w1 [E, N, K] codes and [E, ceil(N/128), ceil(K/128)] positive scales, partial
// blocks included (N = 192, K = 272); codes vary; magnitudes differ between experts.
TEST(WorkloadWeights, Fp8SingleShapesAndScales) {
  LOOM_FRESH_SEED();
  const int64_t E = 16, N = 192, K = 272;
  const LayerWeights w = make_weights(make_shape(0, K, N, E, 4, Mode::single, DType::fp8), seed);
  EXPECT_EQ(w.shape.experts, E);
  ASSERT_EQ(int64_t(w.w1_q.size()), E * N * K);
  ASSERT_EQ(int64_t(w.w1_scales.size()), E * ceil128(N) * ceil128(K));
  EXPECT_TRUE(w.w2_q.empty());
  EXPECT_TRUE(w.w2_scales.empty());
  EXPECT_TRUE(w.w1.empty());
  EXPECT_TRUE(w.w2.empty());
  expect_scales_in_range(w.w1_scales, K);
  EXPECT_NE(std::count(w.w1_q.begin(), w.w1_q.end(), w.w1_q[0]), int64_t(w.w1_q.size()));
  std::vector<float> expert_amax(static_cast<size_t>(E), 0.0f);
  const int64_t per_expert_scales = ceil128(N) * ceil128(K);
  for (int64_t e = 0; e < E; ++e) {
    SCOPED_TRACE("expert " + std::to_string(e));
    expect_blocks_reach_448(w.w1_q.data() + e * N * K, N, K, N);
    for (int64_t i = 0; i < per_expert_scales; ++i)
      expert_amax[size_t(e)] = std::max(expert_amax[size_t(e)], w.w1_scales[size_t(e * per_expert_scales + i)]);
  }
  // 16 log-uniform magnitudes over a factor 16 all within a factor 1.5: probability < 1e-11.
  EXPECT_GT(*std::max_element(expert_amax.begin(), expert_amax.end()) /
                *std::min_element(expert_amax.begin(), expert_amax.end()),
            1.5f);
}

// ffn fp8: w13 [E, 2I, H] with gate and up quantised as separate row segments, scales
// [E, 2 ceil(I/128), ceil(H/128)]; w2 [E, H, I] with scales [E, ceil(H/128), ceil(I/128)].
// I = 192 puts a gate/up boundary inside what would be one 128-row block if the halves were joined.
TEST(WorkloadWeights, Fp8FfnGateAndUpAreSeparateBlocks) {
  LOOM_FRESH_SEED();
  const int64_t E = 3, H = 256, I = 192;
  const LayerWeights w = make_weights(make_shape(5, H, I, E, 2, Mode::ffn, DType::fp8), seed);
  ASSERT_EQ(int64_t(w.w1_q.size()), E * 2 * I * H);
  ASSERT_EQ(int64_t(w.w1_scales.size()), E * 2 * ceil128(I) * ceil128(H));
  ASSERT_EQ(int64_t(w.w2_q.size()), E * H * I);
  ASSERT_EQ(int64_t(w.w2_scales.size()), E * ceil128(H) * ceil128(I));
  EXPECT_TRUE(w.w1.empty());
  EXPECT_TRUE(w.w2.empty());
  expect_scales_in_range(w.w1_scales, H);
  expect_scales_in_range(w.w2_scales, I);
  for (int64_t e = 0; e < E; ++e) {
    SCOPED_TRACE("expert " + std::to_string(e));
    expect_blocks_reach_448(w.w1_q.data() + e * 2 * I * H, 2 * I, H, I);
    expect_blocks_reach_448(w.w2_q.data() + e * H * I, H, I, H);
    // The blocks of one matrix have scales of their own (a GEMM reading another block's scale
    // must show): eight log-uniform factors over [0.5, 2] all within 1.2x has probability < 1e-5.
    const auto first = w.w1_scales.begin() + e * 2 * ceil128(I) * ceil128(H);
    const auto [lo, hi] = std::minmax_element(first, first + 2 * ceil128(I) * ceil128(H));
    EXPECT_GT(*hi / *lo, 1.2f);
  }
}

// bf16: w1 (and w2 in ffn) of the right sizes, no fp8 arrays, values non-zero and within the
// magnitude bound 8/sqrt(K) (plus bf16 rounding).
TEST(WorkloadWeights, Bf16Shapes) {
  LOOM_FRESH_SEED();
  const int64_t E = 3, H = 64, I = 48;
  const LayerWeights single = make_weights(make_shape(0, H, I, E, 1, Mode::single, DType::bf16), seed);
  const LayerWeights ffn = make_weights(make_shape(0, H, I, E, 1, Mode::ffn, DType::bf16), seed);
  ASSERT_EQ(int64_t(single.w1.size()), E * I * H);
  EXPECT_TRUE(single.w2.empty());
  ASSERT_EQ(int64_t(ffn.w1.size()), E * 2 * I * H);
  ASSERT_EQ(int64_t(ffn.w2.size()), E * H * I);
  for (const LayerWeights* w : {&single, &ffn}) {
    EXPECT_TRUE(w->w1_q.empty() && w->w2_q.empty() && w->w1_scales.empty() && w->w2_scales.empty());
    auto check = [](const std::vector<bf16>& v, int64_t cols) {
      const float bound = float(8.0 / std::sqrt(double(cols)) * (1 + 1.0 / 256));
      for (const bf16 x : v) {
        const float f = bf16_to_float(x);
        ASSERT_NE(f, 0.0f);
        ASSERT_LE(std::fabs(f), bound);
      }
    };
    check(w->w1, H);
    check(w->w2, I);
  }
}

// Same seed, same bytes; another seed, other bytes; fewer experts give the first experts'
// weights (per-expert streams, so thread chunking cannot matter).
TEST(WorkloadWeights, DeterministicAndPrefixStable) {
  LOOM_FRESH_SEED();
  for (const DType dtype : {DType::fp8, DType::bf16}) {
    for (const Mode mode : {Mode::single, Mode::ffn}) {
      SCOPED_TRACE(std::string(to_string(dtype)) + " " + to_string(mode));
      const Shape shape = make_shape(8, 144, 80, 5, 2, mode, dtype);
      const LayerWeights a = make_weights(shape, seed);
      EXPECT_TRUE(same_weights(a, make_weights(shape, seed)));
      EXPECT_FALSE(same_weights(a, make_weights(shape, seed + 1)));
      Shape fewer = shape;
      fewer.experts = 2;
      const LayerWeights b = make_weights(fewer, seed);
      auto prefix = [](const auto& part, const auto& whole) {
        return part.size() * 5 == whole.size() * 2 &&
               (part.empty() || std::memcmp(part.data(), whole.data(), part.size() * sizeof(part[0])) == 0);
      };
      EXPECT_TRUE(prefix(b.w1_q, a.w1_q));
      EXPECT_TRUE(prefix(b.w1_scales, a.w1_scales));
      EXPECT_TRUE(prefix(b.w2_q, a.w2_q));
      EXPECT_TRUE(prefix(b.w2_scales, a.w2_scales));
      EXPECT_TRUE(prefix(b.w1, a.w1));
      EXPECT_TRUE(prefix(b.w2, a.w2));
    }
  }
}

// Normal weight values: heavy tails, so far fewer codes in a block's top half than uniform values
// give (uniform: about half; normal at sigma = max/8.4: a few per cent).
TEST(WorkloadWeights, NormalValuesHaveHeavierTails) {
  LOOM_FRESH_SEED();
  const Shape s = make_shape(0, 512, 256, 4, 2, Mode::single, DType::fp8);
  auto top_half_share = [](const LayerWeights& w) {
    int64_t top = 0;
    for (const uint8_t q : w.w1_q) top += (q & 0x7f) >= 0x76;  // |code| >= 224 = 448 / 2
    return double(top) / double(w.w1_q.size());
  };
  const double uniform = top_half_share(make_weights(s, seed));
  const double normal = top_half_share(make_weights(s, seed, WeightValues::normal));
  EXPECT_GT(uniform, 0.35);
  EXPECT_LT(normal, 0.15);
  EXPECT_GT(normal, 0.0);
}

}  // namespace
}  // namespace loom
