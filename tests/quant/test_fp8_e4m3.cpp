// FP8 E4M3 codec: every code, hand-checked ties and saturation, and bit-for-bit agreement with
// CUDA's own host conversion (the GPU kernels' rounding) over a dense sweep of floats.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <vector>

#include "common/parallel.hpp"
#include "common/rng.hpp"
#include "quant/fp8_e4m3.hpp"
#include "test_seed.hpp"

namespace loom {
namespace {

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

uint8_t cuda_e4m3(float x) { return uint8_t(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)); }

// The E4M3 value of a code straight from the format's definition (bias 7, subnormals m * 2^-9).
double e4m3_definition(uint8_t c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  const double mag = e == 0 ? std::ldexp(double(m), -9) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

// Checks our encoder against CUDA's on `xs`; reports the first few mismatches.
void expect_same_as_cuda(const std::vector<float>& xs) {
  int shown = 0;
  for (float x : xs) {
    const uint8_t want = cuda_e4m3(x), got = e4m3_from_float(x);
    if (want != got && shown++ < 10)
      ADD_FAILURE() << "x = " << x << " (bits 0x" << std::hex << bits_of(x) << "): loom 0x" << int(got)
                    << ", CUDA 0x" << int(want);
  }
}

TEST(Fp8E4M3, DecodeMatchesDefinitionAndCuda) {
  for (int c = 0; c < 256; ++c) {
    const float v = e4m3_to_float(uint8_t(c));
    const __half h = __half(__nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(c), __NV_E4M3));
    const float cuda = __half2float(h);
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(v)) << c;
      EXPECT_TRUE(std::isnan(cuda)) << c;
      continue;
    }
    EXPECT_EQ(double(v), e4m3_definition(uint8_t(c))) << c;
    EXPECT_EQ(bits_of(v), bits_of(cuda)) << c;  // -0 included
  }
  EXPECT_EQ(e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xfe), -448.0f);
  EXPECT_EQ(e4m3_to_float(0x08), 0x1p-6f);  // smallest normal
  EXPECT_EQ(e4m3_to_float(0x01), 0x1p-9f);  // smallest subnormal
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_TRUE(std::signbit(e4m3_to_float(0x80)));
}

TEST(Fp8E4M3, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const float v = e4m3_to_float(uint8_t(c));
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(v)) << c;
      EXPECT_EQ(e4m3_from_float(v), 0x7f) << c;  // NaN encodes as 0x7f whatever its sign
      continue;
    }
    EXPECT_EQ(e4m3_from_float(v), c) << "code " << c << " value " << v;
  }
  EXPECT_EQ(e4m3_from_float(-0.0f), 0x80);
  EXPECT_EQ(e4m3_from_float(0.0f), 0x00);
}

TEST(Fp8E4M3, SaturatesToMaxFinite) {
  EXPECT_EQ(e4m3_from_float(1e6f), 0x7e);
  EXPECT_EQ(e4m3_from_float(-1e6f), 0xfe);
  EXPECT_EQ(e4m3_from_float(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(e4m3_from_float(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(e4m3_from_float(std::numeric_limits<float>::max()), 0x7e);
  EXPECT_EQ(e4m3_from_float(448.0f), 0x7e);
  EXPECT_EQ(e4m3_from_float(449.0f), 0x7e);
  EXPECT_EQ(e4m3_from_float(464.0f), 0x7e);  // the tie between 448 and the missing 480: even is 448
  EXPECT_EQ(e4m3_from_float(std::nextafter(464.0f, 1e9f)), 0x7e);  // would round to 480: saturate
  EXPECT_EQ(e4m3_from_float(480.0f), 0x7e);
  EXPECT_EQ(e4m3_from_float(-480.0f), 0xfe);
  EXPECT_EQ(e4m3_from_float(std::nextafter(416.0f, 0.0f)), 0x7d);  // 416 = midpoint of 384 and 448
}

TEST(Fp8E4M3, TiesRoundToEvenByHand) {
  // Normal binade [1, 2): codes 0x38 = 1, 0x39 = 1.125, 0x3a = 1.25.
  EXPECT_EQ(e4m3_from_float(1.0625f), 0x38);                          // tie -> even mantissa 0
  EXPECT_EQ(e4m3_from_float(std::nextafter(1.0625f, 2.0f)), 0x39);    // just past the tie
  EXPECT_EQ(e4m3_from_float(std::nextafter(1.0625f, 0.0f)), 0x38);
  EXPECT_EQ(e4m3_from_float(1.1875f), 0x3a);                          // tie 1.125|1.25 -> even 1.25
  EXPECT_EQ(e4m3_from_float(-1.0625f), 0xb8);
  // Binade [16, 32): 0x58 = 16, 0x59 = 18, 0x5a = 20.
  EXPECT_EQ(e4m3_from_float(17.0f), 0x58);
  EXPECT_EQ(e4m3_from_float(19.0f), 0x5a);
  // Carry across a binade: 1.9375 is midway between 1.875 (0x3f) and 2 (0x40); 2 is even.
  EXPECT_EQ(e4m3_from_float(1.9375f), 0x40);
  // Subnormals, step 2^-9: ties at odd multiples of 2^-10.
  EXPECT_EQ(e4m3_from_float(0x1p-10f), 0x00);         // 0.5 step -> 0
  EXPECT_EQ(e4m3_from_float(-0x1p-10f), 0x80);        // ... keeping its sign
  EXPECT_EQ(e4m3_from_float(std::nextafter(0x1p-10f, 1.0f)), 0x01);
  EXPECT_EQ(e4m3_from_float(3 * 0x1p-10f), 0x02);     // 1.5 steps -> 2
  EXPECT_EQ(e4m3_from_float(5 * 0x1p-10f), 0x02);     // 2.5 steps -> 2
  EXPECT_EQ(e4m3_from_float(7 * 0x1p-10f), 0x04);     // 3.5 steps -> 4
  EXPECT_EQ(e4m3_from_float(15 * 0x1p-10f), 0x08);    // 7.5 steps -> 8 = smallest normal 2^-6
  // Below the smallest subnormal's half: zero of the right sign.
  EXPECT_EQ(e4m3_from_float(1e-30f), 0x00);
  EXPECT_EQ(e4m3_from_float(-1e-30f), 0x80);
  EXPECT_EQ(e4m3_from_float(-std::numeric_limits<float>::denorm_min()), 0x80);
}

TEST(Fp8E4M3, NanEncodesAs7f) {
  const float qnan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(e4m3_from_float(qnan), 0x7f);
  EXPECT_EQ(e4m3_from_float(-qnan), 0x7f);  // CUDA drops the NaN's sign; so do we (docs/numerics.md)
  EXPECT_EQ(cuda_e4m3(-qnan), 0x7f);
  EXPECT_EQ(e4m3_from_float(float_of(0x7f800001u)), 0x7f);  // signalling payload
  EXPECT_EQ(e4m3_from_float(float_of(0xffffffffu)), 0x7f);
}

TEST(Fp8E4M3, HalfUlp) {
  EXPECT_EQ(e4m3_half_ulp(1.0f), 1.0f / 16);
  EXPECT_EQ(e4m3_half_ulp(-1.5f), 1.0f / 16);
  EXPECT_EQ(e4m3_half_ulp(448.0f), 16.0f);
  EXPECT_EQ(e4m3_half_ulp(300.0f), 16.0f);
  EXPECT_EQ(e4m3_half_ulp(0.0f), 0x1p-10f);
  EXPECT_EQ(e4m3_half_ulp(0.01f), 0x1p-10f);   // subnormal range: step 2^-9
  EXPECT_EQ(e4m3_half_ulp(0x1p-6f), 0x1p-10f);  // smallest normal binade has the same step
  EXPECT_EQ(e4m3_half_ulp(0x1p-5f), 0x1p-9f);
  // Against the code table: at each code, half the gap to the next one up.
  for (int c = 0; c < 0x7e; ++c) {
    const double lo = e4m3_definition(uint8_t(c)), hi = e4m3_definition(uint8_t(c + 1));
    EXPECT_EQ(double(e4m3_half_ulp(float(lo))), (hi - lo) / 2) << c;
    // Inside the gap, the nearest-rounding error never exceeds the half ulp.
    const float mid = float((lo + hi) / 2), x = std::nextafter(mid, 0.0f);
    EXPECT_LE(std::fabs(double(x) - double(e4m3_to_float(e4m3_from_float(x)))), double(e4m3_half_ulp(x))) << c;
  }
}

// Floats stepping by a prime stride across all 2^32 bit patterns (both signs, NaN, inf, subnormals),
// from a fresh offset each run so successive runs cover different floats.
TEST(Fp8E4M3, MatchesCudaOnDenseSweep) {
  LOOM_FRESH_SEED();
  constexpr uint64_t kStride = 11;
  const uint64_t start = Rng(seed).below(kStride);
  const uint64_t n = ((uint64_t(1) << 32) - start + kStride - 1) / kStride;
  std::atomic<int64_t> mismatches{0};
  std::mutex m;
  uint32_t first_bad = 0;
  parallel_for(int64_t(n), [&](int64_t i0, int64_t i1) {
    int64_t bad = 0;
    uint32_t first = 0;
    for (int64_t i = i0; i < i1; ++i) {
      const float x = float_of(uint32_t(start + uint64_t(i) * kStride));
      if (e4m3_from_float(x) != cuda_e4m3(x) && bad++ == 0) first = bits_of(x);
    }
    if (bad) {
      std::lock_guard<std::mutex> lock(m);
      if (mismatches == 0) first_bad = first;
      mismatches += bad;
    }
  });
  EXPECT_EQ(mismatches.load(), 0) << "first mismatch at float bits 0x" << std::hex << first_bad;
}

// Every code value and every midpoint between neighbouring codes (including 464, between 448 and
// the missing 480), each with the 64 floats on either side, both signs; plus the special values.
TEST(Fp8E4M3, MatchesCudaAtEveryBoundary) {
  std::vector<double> anchors;
  for (int c = 0; c <= 0x7e; ++c) {
    const double v = e4m3_definition(uint8_t(c));
    const double next = c < 0x7e ? e4m3_definition(uint8_t(c + 1)) : 480.0;
    anchors.push_back(v);
    anchors.push_back((v + next) / 2);  // exact in float: one bit below the code's last
  }
  for (double a : {480.0, 496.0, 512.0, 0x1p-10, 0x1p-11, 0x1p-12}) anchors.push_back(a);
  std::vector<float> xs;
  for (double a : anchors)
    for (int sign : {1, -1}) {
      const float f = float(sign * a);
      ASSERT_EQ(double(f), sign * a);
      const uint32_t u = bits_of(f);
      for (int64_t d = -64; d <= 64; ++d) {
        const int64_t b = int64_t(u & 0x7fffffffu) + d;
        if (b < 0) continue;
        xs.push_back(float_of(uint32_t(b) | (u & 0x80000000u)));
      }
    }
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (float s : {1.0f, -1.0f})
    for (float v : {0.0f, std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                    std::numeric_limits<float>::max(), inf, nan, 448.0f, 464.0f, 480.0f, 1e6f})
      xs.push_back(s * v);
  expect_same_as_cuda(xs);
}

}  // namespace
}  // namespace loom
