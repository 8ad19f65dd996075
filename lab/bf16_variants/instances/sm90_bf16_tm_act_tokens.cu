// Lab instance: LabBf16ActTokens (bf16_variant_instances.cuh).
#include "bf16_variants/bf16_variant_instances.cuh"

namespace loom::gemm {
LOOM_GEMM_INSTANCE(LabBf16ActTokens);
}  // namespace loom::gemm
