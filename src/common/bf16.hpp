// Host-side bfloat16: storage type and exact conversions (round to nearest even, NaN stays NaN).
#pragma once

#include <cstdint>
#include <cstring>

namespace loom {

struct bf16 {
  uint16_t bits = 0;
};
static_assert(sizeof(bf16) == 2);

inline float bf16_to_float(bf16 v) {
  const uint32_t u = uint32_t(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40u)};  // quiet NaN
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);                             // ties to even
  return bf16{uint16_t((u + rounding) >> 16)};
}

inline float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

}  // namespace loom
