// What a layer run must do: FLOPs on compact routed rows (never padded rows) and the bytes that
// must move (weights of every expert with at least one route, activations in and out).
#pragma once

#include <cstdint>
#include <vector>

#include "loom/types.hpp"

namespace loom::bench {

inline constexpr double kPeakBf16Tflops = 989.0;   // H100/H200 SXM datasheet, dense
inline constexpr double kPeakFp8Tflops = 1979.0;   // dense

struct Work {
  double flops = 0;              // single: 2*T*k*N*K; ffn: 6*T*k*H*I
  int64_t experts_hit = 0;       // experts with >= 1 route
  int64_t weight_bytes = 0;      // their weights, block scales included
  int64_t activation_bytes = 0;  // hidden + routing inputs in, output out
  int64_t glue_bytes = 0;        // what the routing, dispatch and quantisation move (glue_bytes)
  int64_t bytes() const { return weight_bytes + activation_bytes; }
};

// counts: per-expert routes [E]. from_logits: routing input is router logits (else top-k ids/weights).
Work layer_work(const Shape& shape, const std::vector<int32_t>& counts, bool from_logits);

// The bytes the glue (routing, dispatch, quantisation) must move: router logits (or the top-k ids
// and weights) and the bf16 hidden states read; the top-k ids and weights (from logits), the
// dispatch layout (offsets; per route its sorted row, token and weight) and the FP8 activation rows
// with their 1x128 scales written, one row per token or, where the GEMM reads expert-sorted rows,
// one per route.
int64_t glue_bytes(const Shape& shape, bool from_logits, bool sorted_rows);

// One expert's weight bytes (fp8 codes plus fp32 block scales, or bf16), both matrices in ffn mode.
int64_t expert_weight_bytes(const Shape& shape);

double peak_tflops(DType dtype);

}  // namespace loom::bench
