// Host-side FP8 E4M3 (OCP "fn" variant): 1 sign, 4 exponent (bias 7), 3 mantissa bits; max 448;
// no infinities; 0x7f / 0xff are NaN. Encoding rounds to nearest even and saturates to +-448
// (like cvt.rn.satfinite.e4m3x2.f32); NaN encodes as 0x7f; -0 and negative values that round to
// zero keep their sign (0x80).
#pragma once

#include <cstdint>

namespace loom {

inline constexpr float kE4M3Max = 448.0f;

uint8_t e4m3_from_float(float x);
float e4m3_to_float(uint8_t code);

// Half the distance between neighbouring E4M3 values around |x| (|x| <= 448): the largest
// round-to-nearest error at x.
float e4m3_half_ulp(float x);

}  // namespace loom
