// Host-side bfloat16: storage type and exact conversions (round to nearest even, NaN stays NaN).
#pragma once

#include <cmath>
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

// Round a double to bf16 in one step (no double rounding through fp32): round to fp32 with the
// inexact bit folded into the last place ("round to odd"), then to bf16 by nearest even. fp32 keeps
// 16 bits below bf16's 8, enough for the odd bit to break every would-be tie the right way.
inline float round_double_to_bf16(double v) {
  float f = float(v);
  if (!std::isnan(v) && double(f) != v) {
    if (std::fabs(double(f)) > std::fabs(v)) f = std::nextafter(f, 0.0f);  // towards zero
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u |= 1u;
    std::memcpy(&f, &u, 4);
  }
  return round_to_bf16(f);
}

}  // namespace loom
