// An independent GPU reference of the FP8 layer (single and ffn modes) and the BF16 layer for shapes
// too large for the CPU reference: CUDA cores only, operands dequantised exactly (code x scale) in double, double
// accumulation, none of loom's kernels (no tensor cores, no TMA). Itself checked against layer_ref
// on small shapes (test_pipeline_gpu.cpp).
#pragma once

#include <vector>

#include "common/bf16.hpp"
#include "pipeline/layer_ref.hpp"
#include "route/route_ref.hpp"

namespace loom::test {

// out [T, N] in double: sum over slots of weight * (quantised hidden . dequantised W_e^T).
std::vector<double> reference_single_fp8_gpu(const LayerWeights& w, const std::vector<bf16>& hidden, const TopK& topk);

// The ffn layer (fp8): GEMM 1 (w13) in double on the GPU, the intermediate as layer_ref makes it
// (act in double rounded once to fp32, 1x128 requantised, on the CPU), GEMM 2 (w2) in double on
// the GPU, the slot-order combine; out [T, H] in double, before the bf16 rounding. As layer_ref:
// `given` replaces the intermediate GEMM 2 reads; `act` (if not null) receives SiLU(gate)*up per route.
std::vector<double> reference_ffn_fp8_gpu(const LayerWeights& w, const std::vector<bf16>& hidden, const TopK& topk,
                                          const RouteIntermediate* given = nullptr, std::vector<float>* act = nullptr);

// The ffn layer (bf16) with layer_ref's rounding points and bf16 route rows (as GEMM 2 stores them):
// GEMM 1 in double on the GPU, act rounded to fp32 then bf16 on the CPU, GEMM 2 in double on the
// GPU, each weighted route row rounded to bf16, the slot-order sum; out [T, H] before the last rounding.
std::vector<double> reference_ffn_bf16_gpu(const LayerWeights& w, const std::vector<bf16>& hidden, const TopK& topk);

}  // namespace loom::test
