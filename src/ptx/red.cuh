// Reductions into global memory (sm_90): a vector reduction from registers, and a bulk reduction
// from shared memory through the async proxy (cuda::ptx).
#pragma once

#include <cuda/ptx>

#include <cstdint>

namespace loom::ptx {

// One instruction adds four consecutive floats.
__device__ __forceinline__ void red_add_v4_f32(float* gptr, float a, float b, float c, float d) {
  asm volatile("red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(gptr), "f"(a), "f"(b), "f"(c),
               "f"(d)
               : "memory");
}

// dst[i] += src[i] for bytes / 4 floats (bytes a multiple of 16, both 16-byte aligned). The source
// was written by generic stores: fence_proxy_async_shared() first. Completion: bulk_commit() then
// bulk_wait_read() before the source may be overwritten.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, const float* src, uint32_t bytes) {
  cuda::ptx::cp_reduce_async_bulk(cuda::ptx::space_global, cuda::ptx::space_shared, cuda::ptx::op_add, dst, src, bytes);
}
__device__ __forceinline__ void bulk_commit() { cuda::ptx::cp_async_bulk_commit_group(); }
__device__ __forceinline__ void bulk_wait_read() { cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{}); }
// ... and until the thread's bulk operations have completed (their writes done).
__device__ __forceinline__ void bulk_wait() { cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{}); }

}  // namespace loom::ptx
