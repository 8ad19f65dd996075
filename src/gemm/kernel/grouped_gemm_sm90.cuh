// The grouped-GEMM skeleton: one persistent kernel frame that every loom GEMM instance runs in.
//
//   grouped_gemm_sm90<Kernel>   the __global__ entry: shared memory, barrier initialisation, the
//                               schedule's preparation after the PDL wait, the warp roles and their
//                               register budgets, the hand-off to the next kernel of the chain.
//   Kernel                      a composition of parts (src/gemm/kernel/*_kernel.cuh): a mainloop
//                               (operand orientation, K loop, FP8 promotion), a token source (where
//                               the activation rows come from), an epilogue (what happens to a
//                               finished tile) and a scheduler (which units a CTA computes).
//
// A Kernel provides:
//   Maps, Args                     the launch's arguments: its TMA descriptors (a __grid_constant__
//                                  parameter: TMA takes their addresses) and the rest (by value)
//   Params                         ParamRefs<Maps, Args>: what every part takes
//   SharedStorage                  the CTA's shared memory (1024-aligned)
//   kProducerRegs, kConsumerRegs   setmaxnreg budgets of the producer / consumer warpgroups (0: keep)
//   init(s, p)                     thread 0: every part's mbarriers (the skeleton fences them)
//   prefetch(p)                    thread 0: descriptors worth having early (tensor maps)
//   Schedule prepare(s, p)         every thread: the PDL wait and whatever the units are derived
//                                  from, ending in a CTA-wide barrier (or deferring both)
//   produce(s, p, sched)           warpgroup 0 (warps 0-3, each its role)
//   consume(s, p, sched, c)        consumer warpgroup c (0 or 1)
// Every combination is its own kernel (an explicit instantiation under src/gemm/instances/): what
// the parts share is source, never a runtime branch on the hot path.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "diag/chain_trace.cuh"
#include "common/launch.hpp"
#include "ptx/mbarrier.cuh"
#include "ptx/pdl.cuh"
#include "ptx/setmaxnreg.cuh"

namespace loom::gemm {

inline constexpr int kThreads = 384;         // warpgroup 0: producers; 1 and 2: MMA consumers
inline constexpr int kProducerThreads = 128;
inline constexpr int kConsumerWarps = 8;
// One sm_90 CTA's dynamic shared memory, less the 1 KiB slack each kernel takes to align its base.
inline constexpr size_t kMaxSharedStorage = 227 * 1024 - 1024;
// setmaxnreg moves registers within what the CTA was launched with: 384 threads at the 168 that
// __launch_bounds__(384, 1) gives each.
inline constexpr uint32_t kLaunchRegs = 168;

template <uint32_t kProducerRegs, uint32_t kConsumerRegs>
inline constexpr bool fits_register_pool =
    kProducerRegs == 0 || 128 * kProducerRegs + 256 * kConsumerRegs <= kThreads * kLaunchRegs;

// The CTA's shared storage on a 1024-byte boundary (128-byte-swizzled TMA tiles need it). Aligned
// by pointer arithmetic on the extern array, not through an integer: the compiler then still knows
// every access is to shared memory (through uintptr_t it emitted generic loads and stores with
// 64-bit address arithmetic on the promotion's critical path).
template <class Storage>
__device__ __forceinline__ Storage& shared_storage() {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t align_pad = (1024u - uint32_t(reinterpret_cast<uintptr_t>(smem_raw) % 1024u)) % 1024u;
  return *reinterpret_cast<Storage*>(smem_raw + align_pad);
}

// The kernel's two parameters, by reference: the parts read them where they are (constant bank),
// never as copies in registers.
template <class Maps, class Args>
struct ParamRefs {
  const Maps& maps;
  const Args& a;
};

template <class Kernel>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_gemm_sm90(const __grid_constant__ typename Kernel::Maps maps, const typename Kernel::Args a) {
  using S = typename Kernel::SharedStorage;
  const typename Kernel::Params p{maps, a};
  static_assert(alignof(S) == 1024 && sizeof(S) <= kMaxSharedStorage, "one sm_90 CTA's shared memory, 1024-aligned");
  static_assert(fits_register_pool<Kernel::kProducerRegs, Kernel::kConsumerRegs>, "the CTA's register pool");
  S& s = shared_storage<S>();
  if (threadIdx.x == 0) LOOM_TRACE(kGemmStart);
  if (threadIdx.x == 0) LOOM_TRACE_SM(kGemmSm);
  if (threadIdx.x == 0) {
    Kernel::init(s, p);
    ptx::fence_mbar_init();
    Kernel::prefetch(p);
  }
  const typename Kernel::Schedule sched = Kernel::prepare(s, p);
  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    if constexpr (Kernel::kProducerRegs != 0) ptx::setmaxnreg_dec<Kernel::kProducerRegs>();
    Kernel::produce(s, p, sched);
  } else {
    if constexpr (Kernel::kConsumerRegs != 0) ptx::setmaxnreg_inc<Kernel::kConsumerRegs>();
    Kernel::consume(s, p, sched, warpgroup - 1);
  }
  ptx::pdl_launch_dependents();
}

// Host side: the dynamic shared memory a Kernel launches with (+ the alignment slack), its cluster
// size (Kernel::kClusterX where it has one), and one persistent launch of it (grid a multiple of
// the cluster size).
template <class Kernel>
inline constexpr size_t launch_smem_bytes = sizeof(typename Kernel::SharedStorage) + 1024;

template <class Kernel>
inline constexpr unsigned cluster_x_of = [] {
  if constexpr (requires { Kernel::kClusterX; })
    return unsigned(Kernel::kClusterX);
  else
    return 1u;
}();

template <class Kernel>
void launch_grouped_gemm(const typename Kernel::Maps& maps, const typename Kernel::Args& a, int grid,
                         size_t smem_bytes, cudaStream_t stream, bool pdl) {
  ensure_dynamic_smem(grouped_gemm_sm90<Kernel>, smem_bytes);
  launch_kernel_clustered(grouped_gemm_sm90<Kernel>, dim3(grid), dim3(kThreads), smem_bytes, stream, pdl,
                          cluster_x_of<Kernel>, maps, a);
}

// The most clusters of Kernel (cluster_x_of<Kernel> CTAs each, smem_bytes per CTA) the current device
// holds at once: where an SM group's SM count is odd, pairs of CTAs leave an SM out.
template <class Kernel>
int max_active_clusters(size_t smem_bytes) {
  ensure_dynamic_smem(grouped_gemm_sm90<Kernel>, smem_bytes);
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = cluster_x_of<Kernel>;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(cluster_x_of<Kernel>);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem_bytes;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  LOOM_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, grouped_gemm_sm90<Kernel>, &cfg));
  return clusters;
}

}  // namespace loom::gemm
