// L2 warm-up of the weights the GEMM reads first, run beside the glue kernels (they leave DRAM
// mostly idle). Only a hint: an L2 prefetch cannot change what a later load returns.
//
// Host-includable: plain declarations only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace loom {

struct WeightPrefetchParams {
  const uint8_t* begin = nullptr;  // first byte to warm (16-byte aligned)
  int64_t bytes = 0;               // a multiple of 16
  bool bulk = false;               // cp.async.bulk.prefetch.L2 per CTA chunk instead of per-thread lines
};

// Enqueues the kernel on `stream` (no PDL attribute: it depends on nothing of the run). bytes = 0
// enqueues nothing.
void launch_weight_prefetch(const WeightPrefetchParams& p, int sm_count, cudaStream_t stream);

}  // namespace loom
