// Timing of GPU work the way every loom figure is taken: the work is captured in CUDA graphs (one
// per copy of its inputs), warm-up runs are dropped, each replay is bracketed by CUDA events, the
// host enqueues a batch ahead of the device (a spin kernel holds the GPU while it does), and L2 is
// kept cold by rotating over input copies or by flushing it outside the timed region.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench/stats.hpp"
#include "common/device_info.hpp"

namespace loom::bench {

enum class L2Mode { warm, rotate, flush };

struct ColdPlan {
  L2Mode mode = L2Mode::flush;
  int copies = 1;  // input copies to rotate over (rotate), else 1
  std::string str() const;
};

// Rotation when at most max_copies copies of `touched_bytes` reach 4x L2 per cycle; otherwise
// (small runs) flush L2 before each timed replay.
ColdPlan plan_cold_l2(int64_t touched_bytes, int64_t l2_bytes, int max_copies);

struct TimerOptions {
  int reps = 500;
  int warmup = 20;
  // false: time eager launches (enqueue called per replay) instead of graph replays; the host
  // still enqueues ahead of the device, so the figure is device time including launch gaps.
  bool graph = true;
};

class GpuTimer {
 public:
  explicit GpuTimer(const DeviceInfo& device);
  ~GpuTimer();
  GpuTimer(const GpuTimer&) = delete;
  GpuTimer& operator=(const GpuTimer&) = delete;

  cudaStream_t stream() const { return stream_; }

  // enqueue(stream, copy) enqueues one run on copy `copy` of the inputs (copy < copies). It is
  // captured into a graph once per copy; only graph replays are timed.
  Stats time(const std::function<void(cudaStream_t, int)>& enqueue, int copies, L2Mode mode,
             const TimerOptions& opt);

  // Reads 2x L2 of a private buffer, leaving L2 full of clean lines nobody else uses.
  void flush_l2(cudaStream_t stream);

 private:
  DeviceInfo device_;
  cudaStream_t stream_ = nullptr;
  void* flush_buffer_ = nullptr;
  int64_t flush_bytes_ = 0;
  int32_t* flush_ids_ = nullptr;
  uint32_t* sink_ = nullptr;
};

}  // namespace loom::bench
