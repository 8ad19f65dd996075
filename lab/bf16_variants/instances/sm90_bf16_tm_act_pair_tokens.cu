// Lab instance: LabBf16ActPairTokens (bf16_variant_instances.cuh).
#include "bf16_variants/bf16_variant_instances.cuh"

namespace loom::gemm {
LOOM_GEMM_INSTANCE(LabBf16ActPairTokens);
}  // namespace loom::gemm
