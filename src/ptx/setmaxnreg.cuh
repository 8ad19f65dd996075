// Per-warpgroup register reallocation (sm_90a): the TMA producer gives registers back so the MMA
// consumers can hold wider accumulators. Needs a register cap at kernel entry
// (__launch_bounds__(threads, 1)); each warpgroup executes exactly one of these, uniformly.
#pragma once

#include <cstdint>

namespace loom::ptx {

template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg takes multiples of 8 in [24, 256]");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}

template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg takes multiples of 8 in [24, 256]");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}

}  // namespace loom::ptx
