// Random streams of the workload generator (private to src/workload).
//
// Every generated object draws from its own Rng(seed, stream), the stream naming what is drawn and
// for which token / expert / sample. Work is split over threads by token or expert, never by draw,
// so the output is the same whatever the thread count, and a smaller T (or E) gives a prefix of
// the larger one's data.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/rng.hpp"

namespace loom::workload_detail {

enum class Stream : uint64_t {
  logits = 1,  // per token: random router logits
  bias,        // sigmoid expert bias
  plan,        // balanced/hot/concentrated/replay: chosen experts, expert order, token order
  token,       // per token: slot shuffle, zipf draws, route weights
  hidden,      // per token: hidden row
  w1,          // per expert: w1 (single) or w13 (ffn)
  w2,          // per expert: w2 (ffn)
  inclusion,   // per sample: zipf_inclusion
};

// index < 2^48 always holds: T <= 2^22, E <= 4096, and zipf_inclusion samples are checked.
inline uint64_t stream_id(Stream s, uint64_t index) { return (uint64_t(s) << 48) | index; }
inline constexpr uint64_t kMaxStreamIndex = (uint64_t(1) << 48) - 1;

// Uniform in (0, 1), never 0 or 1: an odd multiple of 2^-53 (52 random bits plus a half step,
// exact in double), so logs are always finite.
inline double open_unit(Rng& r) { return (double(r.next() >> 12) + 0.5) * 0x1.0p-52; }

// Uniform in (-1, 1) from 24 random bits, never 0: an odd multiple of 2^-24, exact in float.
inline float signed_unit24(uint32_t bits) {
  return float(int32_t((bits & 0xffffffu) << 1) + 1 - 0x1000000) * 0x1.0p-24f;
}

// Standard normal pairs by the polar method (one log and one sqrt per two values, no trig).
// Neither value is ever exactly zero: u and v are odd multiples of 2^-52 in (-1, 1).
class Normal {
 public:
  explicit Normal(Rng& r) : r_(r) {}
  double operator()() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u, v, s;
    do {
      u = 2.0 * open_unit(r_) - 1.0;
      v = 2.0 * open_unit(r_) - 1.0;
      s = u * u + v * v;
    } while (s >= 1.0);
    const double f = std::sqrt(-2.0 * std::log(s) / s);
    spare_ = v * f;
    has_spare_ = true;
    return u * f;
  }

 private:
  Rng& r_;
  double spare_ = 0;
  bool has_spare_ = false;
};

// Fisher-Yates shuffle of p[0, n).
template <class T>
void shuffle(T* p, int64_t n, Rng& r) {
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = int64_t(r.below(uint64_t(i) + 1));
    std::swap(p[i], p[j]);
  }
}

}  // namespace loom::workload_detail
