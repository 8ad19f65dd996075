// n / d for 32-bit unsigned n by a divisor fixed at launch: one high multiply by m = floor((2^32 - 1)
// / d), computed on the host, and one correction. A plain 32-bit division is ~20 instructions
// around a reciprocal; the small batches' GEMM does four in a row between its PDL wait and its first
// unit (journal, thirty-third session).
//
// Exact for every n < 2^32 and d >= 1: m d > 2^32 - 1 - d, so n m / 2^32 > n / d - 1, and
// m d <= 2^32 - 1, so n m / 2^32 < n / d; the high product is floor(n / d) or one less.
// GemmFastDivisor.* checks it.
#pragma once

#include <cstdint>

#include "common/host_device.hpp"

namespace loom {

struct FastDivisor {
  uint32_t d = 1, m = 0xffffffffu;

  FastDivisor() = default;
  // d >= 1 (the caller's to check).
  explicit FastDivisor(uint32_t divisor) : d(divisor), m(0xffffffffu / divisor) {}

  LOOM_HOST_DEVICE uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    uint32_t q = __umulhi(n, m);
#else
    uint32_t q = uint32_t((uint64_t(n) * m) >> 32);
#endif
    if (n - q * d >= d) ++q;
    return q;
  }
};

}  // namespace loom
