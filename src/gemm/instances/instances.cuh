// The enumerated GEMM instances: one kernel each, explicitly instantiated in its own file of this
// folder (named for what it is). A launcher TU includes this header and calls
// launch_grouped_gemm<Instance>: the extern declarations keep it from compiling the kernels again.
#pragma once

#include "gemm/epilogue/combine_handoff.cuh"
#include "gemm/epilogue/combine_in_consumers.cuh"
#include "gemm/gemm_fp8.hpp"
#include "gemm/kernel/bf16_tokens_on_m_kernel.cuh"
#include "gemm/kernel/bf16_weights_on_m_kernel.cuh"
#include "gemm/kernel/fp8_resident_kernel.cuh"
#include "gemm/kernel/fp8_tokens_on_m_kernel.cuh"
#include "gemm/kernel/fp8_weights_on_m_kernel.cuh"
#include "gemm/kernel/grouped_gemm_sm90.cuh"
#include "gemm/operand/gathered_rows.cuh"
#include "gemm/operand/sorted_rows.cuh"

namespace loom::gemm {

// Weights on M, rows gathered by token (batches up to kGatherMaxTokens), from the offsets.
using Sm90Fp8WmGather =
    WeightsOnMKernel<GatheredRows<ExpertsFrom::offsets>, CombineInConsumers, ExpertsFrom::offsets, kStagesGathered>;
// ... from the routes' early expert ids (one routing CTA, at most kEarlyIdWords routes).
using Sm90Fp8WmGatherEarly =
    WeightsOnMKernel<GatheredRows<ExpertsFrom::early_ids>, CombineInConsumers, ExpertsFrom::early_ids, kStagesGathered>;
// ... from expert bins, by the chunk walk.
using Sm90Fp8WmBins =
    WeightsOnMKernel<GatheredRows<ExpertsFrom::bins>, CombineInConsumers, ExpertsFrom::bins, kStagesGathered>;
// Weights on M, expert-sorted rows by TMA, the epilogue in the consumers.
using Sm90Fp8WmSorted = WeightsOnMKernel<SortedRows<false>, CombineInConsumers, ExpertsFrom::offsets, kStagesInline>;
// ... the epilogue handed to the producer warpgroup's spare warps (scales in row quads).
using Sm90Fp8WmSortedHandoff = WeightsOnMKernel<SortedRows<true>, CombineHandoff, ExpertsFrom::offsets, kStagesHandoff>;
// Weights on M, an expert's rows resident in shared memory over all of K (from expert bins).
using Sm90Fp8WmResident = ResidentKernel;
// Tokens on M: 128 x 128 tiles, A from the fragment ring; and 64 x 256 tiles.
using Sm90Fp8TmTall = TokensOnMKernel<false>;
using Sm90Fp8TmWide = TokensOnMKernel<true>;
// ... A by expert-sorted row (the ffn intermediate, fragment order), combined by token.
using Sm90Fp8TmTallSorted = TokensOnMKernel<false, tokens_on_m::NoProbe, true>;
using Sm90Fp8TmWideSorted = TokensOnMKernel<true, tokens_on_m::NoProbe, true>;
// ... 64 x (gate block + up block) tiles, the epilogue SiLU(gate)*up requantised (ffn GEMM 1).
using Sm90Fp8TmWideAct = TokensOnMKernel<true, tokens_on_m::NoProbe, false, true>;
// BF16, tokens on M: 128 x 256 tiles, A and B by TMA, three stages; the SiLU*up epilogue (ffn
// GEMM 1) or the weighted route rows (ffn GEMM 2), staged in shared memory and stored by TMA.
using Sm90Bf16TmAct = Bf16TokensOnMKernel<Bf16Epilogue::act, 1, false, 3, true>;
using Sm90Bf16TmRows = Bf16TokensOnMKernel<Bf16Epilogue::rows, 1, false, 3, true>;

// BF16, weights on M (decode): 64 weight rows x 64 sorted rows, the same two epilogues by token column.
using Sm90Bf16WmAct = Bf16WeightsOnMKernel<Bf16Epilogue::act>;
using Sm90Bf16WmRows = Bf16WeightsOnMKernel<Bf16Epilogue::rows>;

#define LOOM_GEMM_INSTANCE(Kernel)                                                                     \
  template void launch_grouped_gemm<Kernel>(const typename Kernel::Maps&, const typename Kernel::Args&, int, size_t, \
                                            cudaStream_t, bool);                                               \
  template int max_active_clusters<Kernel>(size_t)
#define LOOM_GEMM_INSTANCE_EXTERN(Kernel)                                                                   \
  extern template void launch_grouped_gemm<Kernel>(const typename Kernel::Maps&, const typename Kernel::Args&, int, \
                                                   size_t, cudaStream_t, bool);                                \
  extern template int max_active_clusters<Kernel>(size_t)

LOOM_GEMM_INSTANCE_EXTERN(Sm90Fp8WmGather);
LOOM_GEMM_INSTANCE_EXTERN(Sm90Fp8WmGatherEarly);
LOOM_GEMM_INSTANCE_EXTERN(Sm90Fp8WmBins);
LOOM_GEMM_INSTANCE_EXTERN(Sm90Fp8WmSorted);
LOOM_GEMM_INSTANCE_EXTERN(Sm90Fp8WmSortedHandoff);
LOOM_GEMM_INSTANCE_EXTERN(Sm90Fp8WmResident);
LOOM_GEMM_INSTANCE_EXTERN(Sm90Fp8TmTall);
LOOM_GEMM_INSTANCE_EXTERN(Sm90Fp8TmWide);
LOOM_GEMM_INSTANCE_EXTERN(Sm90Fp8TmTallSorted);
LOOM_GEMM_INSTANCE_EXTERN(Sm90Fp8TmWideSorted);
LOOM_GEMM_INSTANCE_EXTERN(Sm90Fp8TmWideAct);
LOOM_GEMM_INSTANCE_EXTERN(Sm90Bf16TmAct);
LOOM_GEMM_INSTANCE_EXTERN(Sm90Bf16TmRows);
LOOM_GEMM_INSTANCE_EXTERN(Sm90Bf16WmAct);
LOOM_GEMM_INSTANCE_EXTERN(Sm90Bf16WmRows);

}  // namespace loom::gemm
