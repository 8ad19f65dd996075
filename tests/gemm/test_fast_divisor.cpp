#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "gemm/fast_divisor.hpp"

namespace loom {
namespace {

void expect_divides(uint32_t n, uint32_t d) {
  const FastDivisor f(d);
  ASSERT_EQ(f.div(n), n / d) << n << " / " << d;
}

TEST(GemmFastDivisor, EverySmallDividendBySmallDivisors) {
  for (uint32_t d = 1; d <= 1024; ++d)
    for (uint32_t n = 0; n <= 70000; n += (d < 64 ? 1 : 7)) expect_divides(n, d);
}

TEST(GemmFastDivisor, EdgesOfTheRange) {
  const uint32_t edges[] = {0u, 1u, 2u, 3u, 0x7fffffffu, 0x80000000u, 0xfffffffeu, 0xffffffffu};
  const uint32_t divisors[] = {1u, 2u, 3u, 7u, 132u, 255u, 256u, 4096u, 65535u, 65536u, 0x7fffffffu,
                               0x80000000u, 0xfffffffeu, 0xffffffffu};
  for (uint32_t d : divisors) {
    for (uint32_t n : edges) expect_divides(n, d);
    // Around every multiple's boundary near the top of the range and near d itself.
    for (uint32_t n : {d - 1, d, d + 1, 0xffffffffu - d, 0xffffffffu / d * d, 0xffffffffu / d * d - 1})
      expect_divides(n, d);
  }
}

TEST(GemmFastDivisor, RandomPairs) {
  std::mt19937_64 rng(20261201);
  for (int i = 0; i < 2000000; ++i) {
    const uint32_t n = uint32_t(rng());
    uint32_t d = uint32_t(rng() >> (rng() % 32));  // divisors of every magnitude
    if (d == 0) d = 1;
    expect_divides(n, d);
  }
}

}  // namespace
}  // namespace loom
