// The SM's cycle counter (mov.u32 %clock; not in cuda::ptx), for the phase profile. Volatile with a
// memory clobber, so the compiler neither moves it across other volatile asm and memory operations
// nor rematerialises it elsewhere (the clock64() intrinsic was re-read at its use: negative phases).
#pragma once

#include <cstdint>

namespace loom::ptx {

__device__ __forceinline__ uint32_t clock32() {
  uint32_t t;
  asm volatile("mov.u32 %0, %%clock;" : "=r"(t)::"memory");
  return t;
}

// The clock once x0..x3 have been computed: the read waits for their producers (e.g. the loads an
// MMA's register operands come from), which a plain read would not.
__device__ __forceinline__ uint32_t clock32_after(uint32_t x0, uint32_t x1, uint32_t x2, uint32_t x3) {
  uint32_t t;
  asm volatile("mov.u32 %0, %%clock;" : "=r"(t) : "r"(x0), "r"(x1), "r"(x2), "r"(x3) : "memory");
  return t;
}

// The global nanosecond timer (mov.u64 %globaltimer), for the phase profile's clock rate.
__device__ __forceinline__ uint64_t globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}

}  // namespace loom::ptx
