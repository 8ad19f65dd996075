// Instance: FP8 grouped GEMM, weights on M, rows gathered by token, the experts from the routes' early ids.
#include "gemm/instances/instances.cuh"

namespace loom::gemm {
LOOM_GEMM_INSTANCE(Sm90Fp8WmGatherEarly);
}  // namespace loom::gemm
