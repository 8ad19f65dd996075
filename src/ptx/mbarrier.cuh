// mbarrier wrappers over cuda::ptx: the full/empty handshake of TMA pipelines.
#pragma once

#include <cuda/ptx>

#include <cstdint>

namespace loom::ptx {

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t arrivals) { cuda::ptx::mbarrier_init(bar, arrivals); }

// Makes barrier initialisation visible to the async proxy (TMA) before first use.
__device__ __forceinline__ void fence_mbar_init() {
  cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
}

// Producer: one arrival plus the bytes the TMA loads of this phase will deliver.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared, bar,
                                       bytes);
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) { (void)cuda::ptx::mbarrier_arrive(bar); }

// Spins until the phase with the given parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  while (!cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {
  }
}

// As mbar_wait, acquiring at cluster scope: for barriers other CTAs of the cluster arrive on.
__device__ __forceinline__ void mbar_wait_cluster(uint64_t* bar, uint32_t parity) {
  while (!cuda::ptx::mbarrier_try_wait_parity(cuda::ptx::sem_acquire, cuda::ptx::scope_cluster, bar, parity)) {
  }
}

}  // namespace loom::ptx
