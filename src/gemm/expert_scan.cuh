// Exclusive scan of per-expert unit counts in shared memory, by one warp (16 experts per lane, so up
// to 512): the persistent GEMMs number their units expert by expert from it.
#pragma once

#include <cstdint>

#include "loom/types.hpp"

namespace loom {

static_assert(kGpuMaxExperts <= 32 * 16, "one warp scans every expert, 16 a lane");

// Called by the 32 lanes of one warp (lane: 0-31). On entry starts[e + 1] holds expert e's count
// (e < experts); on return starts[e] is the sum of the counts before e, and starts[experts] the total.
__device__ __forceinline__ void scan_expert_counts(int32_t* starts, int experts, int lane) {
  const int e0 = 16 * lane;
  int local[16], sum = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    local[i] = e0 + i < experts ? starts[e0 + i + 1] : 0;
    sum += local[i];
  }
  int incl = sum;
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const int v = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += v;
  }
  int run = incl - sum;
  __syncwarp();  // every lane has read its counts before any lane overwrites them
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    run += local[i];
    if (e0 + i < experts) starts[e0 + i + 1] = run;
  }
  if (lane == 0) starts[0] = 0;
}

}  // namespace loom
