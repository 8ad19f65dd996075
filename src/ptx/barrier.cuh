// Named barriers: synchronise a subset of the CTA (e.g. one warpgroup) without stalling the rest.
#pragma once

#include <cstdint>

namespace loom::ptx {

__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace loom::ptx
