// CPU reference of the whole MoE layer, in two modes and two dtypes.
//
// Where the FP8 path rounds (the GPU path keeps the same rule; docs/numerics.md):
//  1. hidden (bf16) is quantised per token, 1x128 groups along H (quantize_1x128_ref).
//  2. GEMM products and sums are exact in the reference (double); the GPU accumulates in fp32,
//     promoting each 128-wide K block's partial sum with its two scales.
//  3. ffn: act = silu(gate) * up is computed from the unrounded GEMM-1 output and rounded once to
//     fp32 (not to bf16), then re-quantised per 1x128 group along I for GEMM 2.
//  4. combine: sum over slots of weight * expert output, in slot order; single mode returns it as
//     fp32, ffn mode rounds it once to bf16.
// The BF16 path: GEMM in double (GPU: fp32 accumulate), ffn act rounded to fp32 then to bf16,
// combine as above.
#pragma once

#include <cstdint>
#include <vector>

#include "common/bf16.hpp"
#include "gemm/gemm_ref.hpp"
#include "loom/types.hpp"
#include "route/route_ref.hpp"

namespace loom {

// Expert weights of the layer.
//   single: w1 = [E, N=inter, K=hidden];              w2 unused
//   ffn:    w1 = w13 [E, 2I, H] (gate rows 0..I-1, up rows I..2I-1, quantised as separate blocks);
//           w2 = [E, H, I]
// fp8 fills *_q and *_scales; bf16 fills w1 / w2.
struct LayerWeights {
  Shape shape;  // tokens unused
  std::vector<uint8_t> w1_q, w2_q;
  std::vector<float> w1_scales, w2_scales;
  std::vector<bf16> w1, w2;

  ExpertWeights w1_view() const;
  ExpertWeights w2_view() const;  // ffn only
  // Bytes of one expert's weights (both matrices in ffn mode), scales included.
  int64_t expert_bytes() const;
};

// Result in double before the final rounding, [T, shape.out_cols()].
struct LayerResult {
  std::vector<double> out;
  // The output as the GPU returns it: fp32 in single mode, bf16 (as float) in ffn mode.
  std::vector<float> rounded() const;
  Mode mode = Mode::single;
  // ffn: SiLU(gate)*up per route t*k+j, [T*k, I], as rounded to fp32 before the re-quantisation
  // (a dropped route's row is 0).
  std::vector<float> act;
};

// An ffn fp8 intermediate per route t*k+j: E4M3 codes [T*k, I] and 1x128 scales
// [T*k, quant_blocks(I)] (a dropped route's row is not read).
struct RouteIntermediate {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
};

// The layer from precomputed routes. hidden: [T, H] bf16; topk: ids and weights [T, k].
// given (ffn fp8 only): GEMM 2 reads this intermediate instead of the reference's own re-quantised
// act. A GPU test passes the GPU's, so that E4M3 codes that round the other way on accumulation
// noise (docs/numerics.md) do not hide how GEMM 2 and the combine did.
// bf16_route_rows (ffn only): each route's weighted row, top-k weight x GEMM 2's row, rounded to
// bf16 before the combine sums them, as the deterministic combine does (docs/numerics.md).
LayerResult layer_ref(const LayerWeights& w, const bf16* hidden, const TopK& topk,
                      const RouteIntermediate* given = nullptr, bool bf16_route_rows = false);

// Relative Frobenius error ||got - ref|| / ||ref||, and the worst such error over rows of `cols`.
// NaN anywhere in `got` gives +inf. When a row of ref is all zero its error is ||got_row||.
struct ErrorStats {
  double overall = 0;
  double worst_row = 0;
  int64_t worst_row_index = -1;
};
ErrorStats relative_error(const float* got, const double* ref, int64_t rows, int64_t cols);

}  // namespace loom
