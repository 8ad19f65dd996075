// Global loads with an L2 cache policy (ld.global.cg.L2::cache_hint; not in cuda::ptx as of
// CUDA 13.0). Cached in L2 only, as __ldcg.
#pragma once

#include <cstdint>

namespace loom::ptx {

__device__ __forceinline__ uint4 ld_cg_hint(const uint4* gptr, uint64_t policy) {
  uint4 v;
  asm volatile("ld.global.cg.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(gptr), "l"(policy));
  return v;
}

}  // namespace loom::ptx
