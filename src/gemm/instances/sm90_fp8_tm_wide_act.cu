// Instance: FP8 grouped GEMM, tokens on M, 64 x (gate block + up block) tiles, A from the fragment
// ring, the epilogue SiLU(gate)*up requantised into the ffn intermediate.
#include "gemm/instances/instances.cuh"

namespace loom::gemm {
LOOM_GEMM_INSTANCE(Sm90Fp8TmWideAct);
}  // namespace loom::gemm
