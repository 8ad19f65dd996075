// Instance: BF16 grouped GEMM, tokens on M, a 2-CTA cluster per 256 expert rows sharing each 256
// weight rows by multicast, the weighted route rows.
#include "gemm/instances/instances.cuh"

namespace loom::gemm {
LOOM_GEMM_INSTANCE(Sm90Bf16TmRowsPair);
}  // namespace loom::gemm
