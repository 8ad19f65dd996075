// Instance: FP8 grouped GEMM, weights on M, rows gathered by token from the offsets (or a hit list), chunks of at most 32.
#include "gemm/instances/instances.cuh"

namespace loom::gemm {
LOOM_GEMM_INSTANCE(Sm90Fp8WmGather);
}  // namespace loom::gemm
