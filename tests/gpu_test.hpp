// GPU tests call LOOM_REQUIRE_GPU() first: without a usable sm_90 device they skip with the reason,
// and CTest reports them as skipped (never as passed).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/cuda_check.hpp"

namespace loom::test {

// Empty when a Hopper (sm_90) device is usable, else why not.
inline std::string gpu_unavailable_reason() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("no CUDA device (") + cudaGetErrorString(e) + ")";
  }
  if (count == 0) return "no CUDA device";
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return "cannot query device 0";
  if (prop.major != 9) return std::string("device 0 (") + prop.name + ") is not sm_90; loom kernels are built for sm_90a";
  return {};
}

// The compute-sanitizer tool this process runs under, as scripts/sanitize.sh names it in
// LOOM_SANITIZER ("memcheck", "racecheck", ...); empty in a plain run. Under a tool a kernel runs
// tens to thousands of times slower: timing bounds are not asserted and the heaviest tests take
// their smaller case lists (each still reaching every kernel instance and path of the full list).
inline std::string sanitizer() {
  const char* tool = std::getenv("LOOM_SANITIZER");
  return tool ? tool : "";
}

// Sets `bytes` bytes at `p` to `byte` and waits: cudaMemset runs on the legacy default stream,
// which a non-blocking stream's work does not wait for (a kernel there could run before the fill
// lands, or under a slower instrumented run, the fill after the kernel).
inline void fill(void* p, int byte, size_t bytes) {
  LOOM_CUDA_CHECK(cudaMemset(p, byte, bytes));
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
}

// A non-blocking stream for tests that check PDL and stream ordering.
class Stream {
 public:
  Stream() {
    if (cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking) != cudaSuccess) s_ = nullptr;
  }
  ~Stream() {
    if (s_) cudaStreamDestroy(s_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }
  // Launch errors first, then completion; either fails the current test.
  void sync() const {
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
  }

 private:
  cudaStream_t s_ = nullptr;
};

// Mean time of one launch over `iters` back-to-back launches on `stream` (after `warmup` untimed
// ones), in microseconds: an informational figure for the test log, never a pass criterion.
template <class Launch>
double mean_launch_us(const Stream& stream, Launch&& launch, int warmup = 20, int iters = 200) {
  cudaEvent_t e0, e1;
  LOOM_CUDA_CHECK(cudaEventCreate(&e0));
  LOOM_CUDA_CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < warmup; ++i) launch();
  LOOM_CUDA_CHECK(cudaEventRecord(e0, stream.get()));
  for (int i = 0; i < iters; ++i) launch();
  LOOM_CUDA_CHECK(cudaEventRecord(e1, stream.get()));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  float ms = 0;
  LOOM_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 1e3 * double(ms) / iters;
}

// A float's bits (bitwise comparisons of kernel outputs).
inline uint32_t bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

}  // namespace loom::test

#define LOOM_REQUIRE_GPU()                                                  \
  do {                                                                      \
    const std::string loom_reason_ = ::loom::test::gpu_unavailable_reason(); \
    if (!loom_reason_.empty()) GTEST_SKIP() << "GPU test skipped: " << loom_reason_; \
  } while (0)
