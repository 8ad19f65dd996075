#include "quant/fp8_e4m3.hpp"

#include <cmath>
#include <cstring>

namespace loom {

namespace {

uint32_t float_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

float bits_float(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// v >> s rounded to nearest, ties to even (s in [1, 31]).
uint32_t shift_right_rne(uint32_t v, uint32_t s) {
  const uint32_t kept = v >> s;
  const uint32_t rest = v & ((1u << s) - 1u);
  const uint32_t half = 1u << (s - 1u);
  return kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
}

// Float exponent field of 2^-6, the smallest normal E4M3 magnitude.
constexpr uint32_t kMinNormalExp = 127 - 6;
// E4M3 exponent bias 7 vs float bias 127: a normal float's bits minus (120 << 23) put the E4M3
// exponent where the float exponent was.
constexpr uint32_t kRebias = (127u - 7u) << 23;

}  // namespace

uint8_t e4m3_from_float(float x) {
  const uint32_t u = float_bits(x);
  const uint32_t a = u & 0x7fffffffu;
  // NaN of either sign becomes the positive NaN 0x7f: CUDA's conversion drops the NaN's sign.
  if (a > 0x7f800000u) return 0x7f;
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  uint32_t mag;
  if ((a >> 23) >= kMinNormalExp) {
    // Normal range: keep the top 3 of the 23 mantissa bits. A carry out of the mantissa bumps the
    // exponent, which is exactly the next code up.
    mag = shift_right_rne(a - kRebias, 20);
    // Past 0x7e (448) lies only NaN: saturate. Covers +-inf and everything above 464, the
    // midpoint between 448 and the 480 that E4M3 lacks (464 itself ties down to the even 0x7e).
    if (mag > 0x7eu) mag = 0x7eu;
  } else {
    // Subnormal range, |x| < 2^-6: the code is |x| / 2^-9 rounded to an integer in [0, 8]
    // (8 is the smallest normal, 0x08). |x| = m * 2^(e - 150) with m the 24-bit significand.
    const uint32_t e = a >> 23;
    const uint32_t m = e == 0 ? a : ((a & 0x7fffffu) | 0x800000u);
    const uint32_t s = 141u - (e == 0 ? 1u : e);  // |x| / 2^-9 = m >> s; s >= 21
    mag = s >= 32u ? 0u : shift_right_rne(m, s);  // m < 2^24, so s >= 25 always rounds to 0
  }
  return uint8_t(sign | mag);  // values rounding to zero keep their sign (0x80)
}

float e4m3_to_float(uint8_t code) {
  const uint32_t sign = uint32_t(code & 0x80u) << 24;
  const uint32_t e = (code >> 3) & 0xfu;
  const uint32_t m = code & 0x7u;
  if (e == 0xfu && m == 0x7u) return bits_float(sign | 0x7fc00000u);  // 0x7f / 0xff: NaN
  if (e == 0) {
    const float v = std::ldexp(float(m), -9);  // subnormal: m * 2^-9, exact
    return sign ? -v : v;
  }
  return bits_float(sign | ((e + 120u) << 23) | (m << 20));
}

float e4m3_half_ulp(float x) {
  const float a = std::fabs(x);
  if (std::isnan(a)) return a;
  if (a >= 256.0f) return 16.0f;  // the top binade [256, 448]; saturation keeps larger |x| at 448
  // Below 2^-6 the codes are evenly spaced 2^-9 apart; above, a binade [2^p, 2^(p+1)) holds 8 codes.
  if (!(a >= 0x1p-6f)) return 0x1p-10f;
  int p;
  std::frexp(a, &p);  // a = f * 2^p with f in [0.5, 1): binade 2^(p-1)
  return std::ldexp(1.0f, p - 1 - 4);
}

}  // namespace loom
