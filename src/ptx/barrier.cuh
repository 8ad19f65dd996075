// Named barriers: synchronise a subset of the CTA (e.g. one warpgroup) without stalling the rest.
#pragma once

#include <cstdint>

namespace loom::ptx {

__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Named barrier met by warps from different code paths (barrier.sync without .aligned): e.g. two
// warpgroups handing a block over in shared memory.
__device__ __forceinline__ void named_barrier_sync_unaligned(uint32_t id, uint32_t threads) {
  asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// CTA-wide barrier that threads may reach at different instructions: barrier.sync without .aligned
// (__syncthreads is the .aligned form, which every thread must reach at the same instruction). For
// roles that meet from different code paths, such as a producer's warm-up and the consumers.
__device__ __forceinline__ void cta_sync_unaligned() { asm volatile("barrier.sync 0;" ::: "memory"); }

}  // namespace loom::ptx
