// Kernel launch with the programmatic-dependent-launch attribute (PDL) when asked: the kernel may
// start while its predecessor in the stream finishes, and must call ptx::pdl_wait() (src/ptx/pdl.cuh).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "common/cuda_check.hpp"

namespace loom {

// Raises `kernel`'s dynamic shared-memory limit to at least `bytes` on the current device (the
// opt-in above 48 KiB), once per device, kernel and size. Thread-safe; a kernel launched on a
// second GPU of the process is opted in there too (the attribute is per device).
void ensure_dynamic_smem(const void* kernel, size_t bytes);
template <class... Params>
void ensure_dynamic_smem(void (*kernel)(Params...), size_t bytes) {
  ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), bytes);
}

// cluster_x > 1: thread-block clusters of cluster_x CTAs along x (grid.x a multiple of it).
template <class... Params, class... Args>
void launch_kernel_clustered(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                             bool pdl, unsigned cluster_x, Args&&... args) {
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster_x > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster_x;
    attr[n].val.clusterDim.y = 1;
    attr[n++].val.clusterDim.z = 1;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem_bytes;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = n;
  LOOM_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                   bool pdl, Args&&... args) {
  launch_kernel_clustered(kernel, grid, block, smem_bytes, stream, pdl, 1u, std::forward<Args>(args)...);
}

}  // namespace loom
