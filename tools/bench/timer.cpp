#include "bench/timer.hpp"

#include <algorithm>

#include "bench/spin_wait.cuh"
#include "bench/stream_read_sm90.cuh"
#include "common/cuda_check.hpp"

namespace loom::bench {

std::string ColdPlan::str() const {
  switch (mode) {
    case L2Mode::warm: return "warm";
    case L2Mode::rotate: return "rotate:" + std::to_string(copies);
    case L2Mode::flush: return "flush";
  }
  return "?";
}

ColdPlan plan_cold_l2(int64_t touched_bytes, int64_t l2_bytes, int max_copies) {
  const int64_t target = 4 * l2_bytes;
  if (touched_bytes <= 0) return {L2Mode::flush, 1};
  const int64_t copies = (target + touched_bytes - 1) / touched_bytes;
  if (copies <= max_copies) return {L2Mode::rotate, int(std::max<int64_t>(1, copies))};
  return {L2Mode::flush, 1};
}

GpuTimer::GpuTimer(const DeviceInfo& device) : device_(device) {
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  flush_bytes_ = std::max<int64_t>(2 * device_.l2_bytes, 64 << 20) / 16 * 16;
  LOOM_CUDA_CHECK(cudaMalloc(&flush_buffer_, size_t(flush_bytes_)));
  LOOM_CUDA_CHECK(cudaMemsetAsync(flush_buffer_, 0x5a, size_t(flush_bytes_), stream_));
  LOOM_CUDA_CHECK(cudaMalloc(&flush_ids_, sizeof(int32_t)));
  LOOM_CUDA_CHECK(cudaMemsetAsync(flush_ids_, 0, sizeof(int32_t), stream_));
  LOOM_CUDA_CHECK(cudaMalloc(&sink_, sizeof(uint32_t)));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

GpuTimer::~GpuTimer() {
  cudaFree(flush_buffer_);
  cudaFree(flush_ids_);
  cudaFree(sink_);
  cudaStreamDestroy(stream_);
}

void GpuTimer::flush_l2(cudaStream_t stream) {
  ReadArgs a;
  a.group[0] = {flush_buffer_, 0, flush_bytes_};
  a.groups = 1;
  a.seg_ids = flush_ids_;
  a.segments = 1;
  a.sink = sink_;
  launch_stream_read(a, ReadConfig{4, 512, 4}, device_.sm_count, stream);
}

Stats GpuTimer::time(const std::function<void(cudaStream_t, int)>& enqueue, int copies, L2Mode mode,
                     const TimerOptions& opt) {
  if (copies < 1) throw Error("timer: copies must be >= 1");
  if (opt.reps < 1) throw Error("timer: reps must be >= 1");
  std::vector<cudaGraphExec_t> graphs(opt.graph ? size_t(copies) : 0, nullptr);
  for (int c = 0; c < int(graphs.size()); ++c) {
    cudaGraph_t g = nullptr;
    LOOM_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
      enqueue(stream_, c);
    } catch (...) {
      cudaStreamEndCapture(stream_, &g);
      if (g) cudaGraphDestroy(g);
      throw;
    }
    LOOM_CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
    LOOM_CUDA_CHECK(cudaGraphInstantiate(&graphs[size_t(c)], g, 0));
    LOOM_CUDA_CHECK(cudaGraphDestroy(g));
  }
  auto replay = [&](int rep) {
    if (opt.graph)
      LOOM_CUDA_CHECK(cudaGraphLaunch(graphs[size_t(rep % copies)], stream_));
    else
      enqueue(stream_, rep % copies);
  };

  for (int w = 0; w < opt.warmup; ++w) {
    if (mode == L2Mode::flush) flush_l2(stream_);
    replay(w);
  }
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));

  std::vector<cudaEvent_t> start(size_t(opt.reps)), stop(size_t(opt.reps));
  for (int r = 0; r < opt.reps; ++r) {
    LOOM_CUDA_CHECK(cudaEventCreate(&start[size_t(r)]));
    LOOM_CUDA_CHECK(cudaEventCreate(&stop[size_t(r)]));
  }
  // Batches of runs queued behind a spin kernel: the device never waits for the host inside a
  // timed region, so enqueue cost is not measured.
  constexpr int kBatch = 32;
  for (int b = 0; b < opt.reps; b += kBatch) {
    launch_spin_wait(2'000'000, stream_);
    for (int r = b; r < std::min(opt.reps, b + kBatch); ++r) {
      if (mode == L2Mode::flush) flush_l2(stream_);
      LOOM_CUDA_CHECK(cudaEventRecord(start[size_t(r)], stream_));
      replay(r);
      LOOM_CUDA_CHECK(cudaEventRecord(stop[size_t(r)], stream_));
    }
  }
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::vector<double> us(size_t(opt.reps));
  for (int r = 0; r < opt.reps; ++r) {
    float ms = 0;
    LOOM_CUDA_CHECK(cudaEventElapsedTime(&ms, start[size_t(r)], stop[size_t(r)]));
    us[size_t(r)] = double(ms) * 1000.0;
    cudaEventDestroy(start[size_t(r)]);
    cudaEventDestroy(stop[size_t(r)]);
  }
  for (auto g : graphs) cudaGraphExecDestroy(g);
  Stats s = summarize(std::move(us));
  s.l2 = mode == L2Mode::warm ? "warm" : mode == L2Mode::flush ? "flush" : "rotate:" + std::to_string(copies);
  if (!opt.graph) s.l2 += ",eager";
  return s;
}

}  // namespace loom::bench
