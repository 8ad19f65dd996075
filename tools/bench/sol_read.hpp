// The memory speed of light: a small sweep of the streaming-read kernel over exactly the bytes
// given, each configuration timed like everything else; the fastest is kept.
#pragma once

#include <vector>

#include "bench/stream_read_sm90.cuh"
#include "bench/timer.hpp"

namespace loom::bench {

std::vector<ReadConfig> read_sweep();  // loads: CTAs per SM x unroll, 512 threads; bulk: CTAs x ring depth

struct ReadResult {
  Stats stats;
  ReadConfig config;
  // The fastest median of each reader (16-byte loads, bulk copies), for the record: the floor is
  // the faster of the two.
  double loads_median_us = 0.0, bulk_median_us = 0.0;
};

// per_copy: the same bytes in each input copy (rotated when mode is rotate).
ReadResult measure_stream_read(GpuTimer& timer, const DeviceInfo& device, const std::vector<ReadArgs>& per_copy,
                               L2Mode mode, const TimerOptions& opt);

}  // namespace loom::bench
