// Instance: BF16 grouped GEMM, tokens on M, a 2-CTA cluster per 256 expert rows sharing each
// (gate block + up block) by multicast, the SiLU*up epilogue into the bf16 intermediate.
#include "gemm/instances/instances.cuh"

namespace loom::gemm {
LOOM_GEMM_INSTANCE(Sm90Bf16TmActPair);
}  // namespace loom::gemm
