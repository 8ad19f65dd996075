// Instance: BF16 grouped GEMM, tokens on M, 128 x (gate block + up block) tiles, A and B by TMA,
// the epilogue SiLU(gate)*up into the bf16 intermediate (ffn GEMM 1).
#include "gemm/instances/instances.cuh"

namespace loom::gemm {
LOOM_GEMM_INSTANCE(Sm90Bf16TmAct);
}  // namespace loom::gemm
