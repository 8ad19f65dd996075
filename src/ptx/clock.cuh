// The SM's cycle counter (mov.u32 %clock), for the phase profile. Volatile with a memory clobber
// (which cuda::ptx::get_sreg_clock lacks), so the compiler neither moves it across other volatile
// asm and memory operations nor rematerialises it elsewhere (the clock64() intrinsic was re-read at
// its use: negative phases).
#pragma once

#include <cuda/ptx>

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

// The global nanosecond timer, for the phase profile's clock rate (cuda::ptx has it; volatile asm,
// so it stays in order with the mbarrier and TMA asm around it).
__device__ __forceinline__ uint64_t globaltimer() { return cuda::ptx::get_sreg_globaltimer(); }

}  // namespace loom::ptx
