// The BF16 mainloops' K loop (tokens on M and weights on M differ in tile shapes, not in the loop):
// per stage, wait for it, issue one MMA per k16 step into one fp32 accumulator over all of K, and
// free the previous stage once its MMAs have completed. Both operands K-major with 128-byte swizzle,
// 64 bf16 of K per stage.
#pragma once

#include <cstdint>

#include "gemm/ring_cursor.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"

namespace loom::gemm {

// acc = A x B^T over kblocks stages from `st` (advanced past them). descs(stage) gives the stage's
// (A, B) shared-memory descriptors; release(stage) frees a stage whose MMAs are done. kGenericA: A
// arrived by cp.async (generic proxy), which the MMAs read through the async proxy.
template <class Mma, bool kGenericA, int kStages, int kAcc, class Descs, class Release>
__device__ __forceinline__ void bf16_k_loop(uint64_t* full, float (&acc)[kAcc], int kblocks, PipelineState<kStages>& st,
                                            const Descs& descs, const Release& release) {
  static_assert(Mma::kRegs == kAcc, "the accumulator is the MMA's");
  constexpr int kSteps = 64 / 16;  // k16 steps of a 64-wide (128-byte) stage
  PipelineState<kStages> prev = st;
  for (int kb = 0; kb < kblocks; ++kb) {
    ptx::mbar_wait(&full[st.stage], st.phase);
    if constexpr (kGenericA) ptx::fence_proxy_async_shared();
    const auto [desc_a, desc_b] = descs(st.stage);
#pragma unroll
    for (int i = 0; i < kAcc; ++i) ptx::fence_operand(acc[i]);
    ptx::wgmma_fence();
    // A k16 step is 32 bytes along the swizzled row: +2 in the descriptor's 16-byte units. The
    // first MMA of the unit overwrites the accumulator.
#pragma unroll
    for (int j = 0; j < kSteps; ++j) Mma::mma(acc, desc_a + 2 * j, desc_b + 2 * j, kb > 0 || j > 0 ? 1 : 0);
    ptx::wgmma_commit_group();
    // The previous stage's MMAs are done once at most this stage's group is pending: free it.
    ptx::wgmma_wait_group<1>();
#pragma unroll
    for (int i = 0; i < kAcc; ++i) ptx::fence_operand(acc[i]);
    if (kb > 0) {
      release(prev.stage);
      prev.advance();
    }
    st.advance();
  }
  ptx::wgmma_wait_group<0>();
#pragma unroll
  for (int i = 0; i < kAcc; ++i) ptx::fence_operand(acc[i]);
  if (kblocks > 0) release(prev.stage);
}

}  // namespace loom::gemm
