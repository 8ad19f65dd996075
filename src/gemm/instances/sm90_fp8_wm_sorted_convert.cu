// Instance: FP8 grouped GEMM, weights on M, expert-sorted rows by TMA, the epilogue in the consumers,
// each column block of the output rounded to bf16 by the unit that completes it (ffn GEMM 2).
#include "gemm/instances/instances.cuh"

namespace loom::gemm {
LOOM_GEMM_INSTANCE(Sm90Fp8WmSortedConvert);
}  // namespace loom::gemm
