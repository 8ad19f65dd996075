// Instance: FP8 grouped GEMM, tokens on M, 128 x 128 tiles, A from the fragment ring by sorted row.
#include "gemm/instances/instances.cuh"

namespace loom::gemm {
LOOM_GEMM_INSTANCE(Sm90Fp8TmTallSorted);
}  // namespace loom::gemm
