// Instance: BF16 grouped GEMM, tokens on M, A by token (one-row TMA boxes from hidden), the SiLU*up
// epilogue into the bf16 intermediate (ffn GEMM 1 without the gather).
#include "gemm/instances/instances.cuh"

namespace loom::gemm {
LOOM_GEMM_INSTANCE(Sm90Bf16TmActTokens);
}  // namespace loom::gemm
