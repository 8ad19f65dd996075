// The ffn layer's output: its fp32 accumulator [T, H] (the fast combine's reductions, or the
// deterministic combine's slot-order sums) rounded once to bf16 (nearest even; NaN stays NaN).
//
// Host-includable: plain declarations only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace loom {

struct ToBf16Params {
  const float* in = nullptr;  // [count] fp32, 16-byte aligned
  uint16_t* out = nullptr;    // [count] bf16 bits, 8-byte aligned
  int64_t count = 0;          // a multiple of 4 (T * H with H a multiple of 16)
};

// Enqueues the kernel on `stream` (at most 8 CTAs of 256 threads per SM of `sm_count`); pdl: launch
// with the programmatic-dependent-launch attribute. count = 0 enqueues nothing. Throws loom::Error
// on a bad count or misaligned pointer.
void launch_to_bf16(const ToBf16Params& p, int sm_count, cudaStream_t stream, bool pdl);

}  // namespace loom
