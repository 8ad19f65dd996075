// Checking every CUDA call: failures become loom::CudaError with the call, file and line.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "loom/types.hpp"

namespace loom {

[[noreturn]] inline void cuda_fail(cudaError_t e, const char* what, const char* file, int line) {
  throw CudaError(std::string("CUDA error ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ") in " + what +
              " at " + file + ":" + std::to_string(line));
}

}  // namespace loom

#define LOOM_CUDA_CHECK(call)                                                   \
  do {                                                                          \
    const cudaError_t loom_err_ = (call);                                       \
    if (loom_err_ != cudaSuccess) ::loom::cuda_fail(loom_err_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: the launch error (bad config) now, not at the next sync.
#define LOOM_CUDA_CHECK_LAUNCH() LOOM_CUDA_CHECK(cudaGetLastError())
