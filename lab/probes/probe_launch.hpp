// Shared by the design probes (`loom skeleton`, `loom gather-probe`): the device or a clear error,
// and one launch timed by CUDA events (the probes time single long launches, not graph replays).
#pragma once

#include <cuda_runtime.h>

#include <optional>
#include <string>

#include "common/cuda_check.hpp"
#include "common/device_info.hpp"

namespace loom::bench {

inline DeviceInfo probe_device(const std::string& who) {
  std::string why;
  const std::optional<DeviceInfo> found = query_device(&why);
  if (!found) throw Error(who + ": no usable GPU (" + why + ")");
  return *found;
}

// Microseconds from an event before `launch()` to one after it, the launch's error checked.
template <class Launch>
double time_launch_us(const Launch& launch) {
  cudaEvent_t e0, e1;
  LOOM_CUDA_CHECK(cudaEventCreate(&e0));
  LOOM_CUDA_CHECK(cudaEventCreate(&e1));
  LOOM_CUDA_CHECK(cudaEventRecord(e0));
  launch();
  LOOM_CUDA_CHECK(cudaGetLastError());
  LOOM_CUDA_CHECK(cudaEventRecord(e1));
  LOOM_CUDA_CHECK(cudaEventSynchronize(e1));
  float ms = 0.0f;
  LOOM_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  LOOM_CUDA_CHECK(cudaEventDestroy(e0));
  LOOM_CUDA_CHECK(cudaEventDestroy(e1));
  return 1e3 * double(ms);
}

}  // namespace loom::bench
