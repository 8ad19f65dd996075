#include "bench/spin_wait.cuh"

#include "common/cuda_check.hpp"

namespace loom::bench {

namespace {
__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_wait_kernel(uint64_t nanoseconds) {
  const uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < nanoseconds) {
  }
}
}  // namespace

void launch_spin_wait(uint64_t nanoseconds, cudaStream_t stream) {
  spin_wait_kernel<<<1, 1, 0, stream>>>(nanoseconds);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::bench
