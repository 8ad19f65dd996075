// Per-thread L2 prefetch (prefetch.global.L2; not in cuda::ptx). Only a hint: it cannot change what
// a later load returns (L2 is the point of coherence), so it may be issued before a kernel's PDL
// wait, on data its predecessor may still be writing.
#pragma once

namespace loom::ptx {

__device__ __forceinline__ void prefetch_l2(const void* gptr) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(gptr));
}

}  // namespace loom::ptx
