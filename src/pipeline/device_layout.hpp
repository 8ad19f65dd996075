// The device-side buffers of one layer run and what each kernel reads and writes. One convention,
// written down once; every kernel, launcher and test uses these names.
//
//   route      logits[T,E] (+bias[E])         -> topk_ids[T,k], topk_weights[T,k], nan_flags[T]
//   dispatch   topk_ids, topk_weights, nan_flags -> offsets[E+1], route_row[T*k],
//                                                  row_token[R], row_weight[R], status
//   quantize   hidden[T,H] bf16, route_row      -> a_sorted[R_pad,H] fp8, a_scales[ceil(H/128), R_pad];
//                                                  zeroes out[T,N] (fast combine accumulates into it)
//   gemm       a_sorted, a_scales, offsets, row_token, row_weight, weights
//                -> fast: out[T,N] += w * (x . W^T) (atomic vector reductions)
//                -> deterministic: y[R,N] = w * (x . W^T) (plain stores, no atomics)
//   combine    y, route_row (deterministic only) -> out[t,:] = sum over slots j, in order, of y[route_row[t,j],:]
//
// R = T*k (compact routed rows; the rows of expert e are [offsets[e], offsets[e+1]), stable order:
// ascending token, then slot). R_pad = R rounded up to a multiple of 4 (16-byte scale rows for TMA).
#pragma once

#include <cstdint>

#include "loom/status.hpp"  // LayerStatus: written by the dispatch kernel every run (plain stores)

namespace loom {

inline constexpr int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
inline constexpr int64_t padded_rows(int64_t routes) { return round_up(routes, 4); }

}  // namespace loom
