// Instance: FP8 grouped GEMM, weights on M, expert-sorted rows by TMA, the epilogue handed to the producer's spare warps.
#include "gemm/instances/instances.cuh"

namespace loom::gemm {
LOOM_GEMM_INSTANCE(Sm90Fp8WmSortedHandoff);
}  // namespace loom::gemm
