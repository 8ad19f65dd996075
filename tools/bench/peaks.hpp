// `loom peaks`: the device's ceilings measured the same way as every benchmark figure: streaming
// read bandwidth over 1 GiB and 256 MiB passes, and dense FP8 / BF16 GEMM rates (8192^3, cuBLASLt).
#pragma once

#include <iosfwd>
#include <string>

#include "bench/timer.hpp"

namespace loom::bench {

struct PeaksOptions {
  TimerOptions timer;
  int64_t gemm_size = 8192;
};

// Prints progress to `log`; returns {human table, JSON document}.
std::pair<std::string, std::string> run_peaks(const PeaksOptions& opt, std::ostream& log);

}  // namespace loom::bench
