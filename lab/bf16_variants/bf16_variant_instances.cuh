// The BF16 GEMM's lab variants (instantiated under instances/): what measured slower than the
// product's kernel (gemm/instances/instances.cuh: 3 stages, the epilogue staged and stored by TMA).
#pragma once

#include "gemm/instances/instances.cuh"

namespace loom::gemm {

// 2-CTA clusters, 256 expert rows a unit, each CTA multicasting half of the weight tile to both.
using LabBf16ActPair = Bf16TokensOnMKernel<Bf16Epilogue::act, 2, false, 3, true>;
using LabBf16RowsPair = Bf16TokensOnMKernel<Bf16Epilogue::rows, 2, false, 3, true>;
// GEMM 1 with A by token (cp.async in the producer warpgroup: no gather kernel), alone and in pairs.
using LabBf16ActTokens = Bf16TokensOnMKernel<Bf16Epilogue::act, 1, true, 3, true>;
using LabBf16ActPairTokens = Bf16TokensOnMKernel<Bf16Epilogue::act, 2, true, 3, true>;
// Four stages, the epilogue stored from registers (the kernel before the staged epilogue).
using LabBf16ActUnstaged = Bf16TokensOnMKernel<Bf16Epilogue::act, 1, false, 4, false>;
using LabBf16RowsUnstaged = Bf16TokensOnMKernel<Bf16Epilogue::rows, 1, false, 4, false>;

LOOM_GEMM_INSTANCE_EXTERN(LabBf16ActPair);
LOOM_GEMM_INSTANCE_EXTERN(LabBf16RowsPair);
LOOM_GEMM_INSTANCE_EXTERN(LabBf16ActTokens);
LOOM_GEMM_INSTANCE_EXTERN(LabBf16ActPairTokens);
LOOM_GEMM_INSTANCE_EXTERN(LabBf16ActUnstaged);
LOOM_GEMM_INSTANCE_EXTERN(LabBf16RowsUnstaged);

}  // namespace loom::gemm
