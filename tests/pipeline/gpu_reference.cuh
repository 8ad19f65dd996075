// An independent GPU reference of the single-mode FP8 layer for shapes too large for the CPU
// reference: CUDA cores only, operands dequantised exactly (code x scale) in double, double
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

}  // namespace loom::test
