// Instance: FP8 grouped GEMM, weights on M, rows gathered by token from expert bins, the chunk walk.
#include "gemm/instances/instances.cuh"

namespace loom::gemm {
LOOM_GEMM_INSTANCE(Sm90Fp8WmBins);
}  // namespace loom::gemm
