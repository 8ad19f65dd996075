// Instance: BF16 grouped GEMM, tokens on M, CTA pairs sharing the weight tiles by multicast, A by
// token (one-row TMA boxes from hidden), the SiLU*up epilogue into the bf16 intermediate.
#include "gemm/instances/instances.cuh"

namespace loom::gemm {
LOOM_GEMM_INSTANCE(Sm90Bf16TmActPairTokens);
}  // namespace loom::gemm
