// The dynamic tail shared by the persistent GEMMs: units go round robin except the last round's
// worth, which CTAs take from a global queue as they finish (SMs stream at unequal rates and units
// do not divide evenly among the CTAs; taking every unit from the queue loses the round robin's L2
// locality).
//
// The queue is two int32 words of the GEMM's workspace (loom::kWorkQueueWords): [0] the units taken so
// far, [1] the CTAs done taking. Its reset is the queue's own: the last CTA out leaves both words
// zero for the next launch; and the plan zeroes them once more in the kernel before the GEMM (its
// generic word clear, QuantGatherParams::zero_words), so a run never depends on how the previous
// one ended.
#pragma once

#include <cstdint>

#include "gemm/gemm_fp8.hpp"

namespace loom::gemm {

static_assert(kWorkQueueWords == 2, "[0] units taken, [1] CTAs done taking");
// Rounds of units left to the queue (one measured best; docs/perf/journal).
inline constexpr int kDynamicRounds = 1;

// The first unit index the queue hands out: units below it go round robin.
__device__ __forceinline__ int dynamic_static_end(int units, int grid) {
  return max(1, units / grid - kDynamicRounds) * grid;
}

// The next unit a warp takes from the queue (base + the units taken before it): lane 0 fetches, every
// lane returns it. Called by all 32 lanes of the fetching warp.
__device__ __forceinline__ int fetch_work_unit(int32_t* queue, int base, int lane) {
  int next = 0;
  if (lane == 0) next = base + atomicAdd(queue, 1);
  return __shfl_sync(0xffffffffu, next, 0);
}

// Called once per CTA, by the thread that fetches, after its last fetch has returned (the value
// that ended its walk): the CTA counts itself out, and the last CTA out leaves both words zero for
// the next launch (no fetch can follow, every CTA having made its last).
__device__ __forceinline__ void leave_work_queue(int32_t* queue) {
  __threadfence();
  if (atomicAdd(queue + 1, 1) == int(gridDim.x) - 1) {
    atomicExch(queue, 0);
    atomicExch(queue + 1, 0);
  }
}

}  // namespace loom::gemm
