// Thread-block cluster wrappers (sm_90): the CTA's rank, a cluster-wide barrier, and an arrival on
// an mbarrier of another CTA of the cluster (mapa is not in cuda::ptx as of CUDA 13.0).
#pragma once

#include <cuda/ptx>

#include <cstdint>

namespace loom::ptx {

__device__ __forceinline__ uint32_t cluster_rank() { return cuda::ptx::get_sreg_cluster_ctarank(); }

// Every thread of every CTA of the cluster: prior memory operations (barrier initialisation
// included) are visible cluster-wide after it.
__device__ __forceinline__ void cluster_sync() {
  cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_release);
  cuda::ptx::barrier_cluster_wait(cuda::ptx::sem_acquire);
}

// One arrival on the mbarrier at the same shared-memory offset as `bar` in CTA `cta` of the cluster,
// with the default (CTA-scope) release: a consumer telling the peer's producer that a stage it read
// through wgmma (completed) may be overwritten by the peer's multicast. (.release.cluster would
// put a memory barrier into every consumer warp's K loop.)
__device__ __forceinline__ void mbar_arrive_remote(uint64_t* bar, uint32_t cta) {
  const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(cta));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}

}  // namespace loom::ptx
