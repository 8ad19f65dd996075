// A kernel that keeps the GPU busy for a while, so the host can enqueue a batch of timed runs
// ahead of the device and its enqueue time stays out of the measurement.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace loom::bench {

void launch_spin_wait(uint64_t nanoseconds, cudaStream_t stream);

}  // namespace loom::bench
