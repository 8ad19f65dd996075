// Instance: FP8 grouped GEMM, weights on M, expert-sorted rows by TMA, the epilogue in the consumers.
#include "gemm/instances/instances.cuh"

namespace loom::gemm {
LOOM_GEMM_INSTANCE(Sm90Fp8WmSorted);
}  // namespace loom::gemm
