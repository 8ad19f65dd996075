// Expert bins (RouteTopkParams::bin_counts): the routing kernel appends each route to its expert's
// bin with a returning atomic, so the register-loaded GEMM needs no dispatch kernel. The counters
// must be zero when the routing starts; this one-CTA kernel, launched just before it, zeroes them and
// the status word the routing counts into. The bins themselves need no clearing: only the first
// bin_counts[e] slots of a bin are read.
//
// Host-includable: plain declarations only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "loom/status.hpp"

namespace loom {

struct ExpertBinsClearParams {
  int32_t* bin_counts = nullptr;  // [experts * kBinCountStride] (device_layout.hpp): word e * kBinCountStride per expert
  LayerStatus* status = nullptr;
  int experts = 0;
};

// Enqueues the kernel on `stream` (pdl: with the programmatic-dependent-launch attribute; it waits
// for its predecessor, which may still read the counters, before its stores). Throws loom::Error
// on a null pointer or experts outside [1, 4096].
void launch_expert_bins_clear(const ExpertBinsClearParams& p, cudaStream_t stream, bool pdl);

}  // namespace loom
