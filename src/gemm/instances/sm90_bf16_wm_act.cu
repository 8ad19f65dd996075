// Instance: BF16 grouped GEMM, weights on M (decode): 64 weight rows x 64 of an expert's sorted rows,
// the SiLU*up epilogue into the bf16 intermediate, by token column.
#include "gemm/instances/instances.cuh"

namespace loom::gemm {
LOOM_GEMM_INSTANCE(Sm90Bf16WmAct);
}  // namespace loom::gemm
