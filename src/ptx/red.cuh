// Vector reductions to global memory (sm_90): one instruction adds four consecutive floats.
#pragma once

namespace loom::ptx {

__device__ __forceinline__ void red_add_v4_f32(float* gptr, float a, float b, float c, float d) {
  asm volatile("red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(gptr), "f"(a), "f"(b), "f"(c),
               "f"(d)
               : "memory");
}

}  // namespace loom::ptx
