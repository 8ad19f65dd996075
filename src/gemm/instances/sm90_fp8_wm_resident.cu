// Instance: FP8 grouped GEMM, weights on M, an expert's rows resident in shared memory over all of K.
#include "gemm/instances/instances.cuh"

namespace loom::gemm {
LOOM_GEMM_INSTANCE(Sm90Fp8WmResident);
}  // namespace loom::gemm
