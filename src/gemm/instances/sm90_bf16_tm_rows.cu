// Instance: BF16 grouped GEMM, tokens on M, 128 x 256 tiles, A and B by TMA, the weighted route
// rows (ffn GEMM 2).
#include "gemm/instances/instances.cuh"

namespace loom::gemm {
LOOM_GEMM_INSTANCE(Sm90Bf16TmRows);
}  // namespace loom::gemm
