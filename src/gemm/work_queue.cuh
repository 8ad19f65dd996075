// The persistent GEMMs' dynamic unit queue (GemmFp8Params::work_queue): two int32 words, [0] the
// units taken so far, [1] the CTAs done taking. Both are zero when a launch starts.
#pragma once

#include <cstdint>

namespace loom {

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

}  // namespace loom
