// Summary statistics of repeated timings.
#pragma once

#include <string>
#include <vector>

namespace loom::bench {

struct Stats {
  double median_us = 0, p10_us = 0, p90_us = 0, min_us = 0, mean_us = 0;
  int reps = 0;
  std::string l2;  // how L2 was kept cold ("rotate:N", "flush") or "warm"
  bool valid() const { return reps > 0; }
};

// Percentiles by linear interpolation between order statistics.
Stats summarize(std::vector<double> us);

}  // namespace loom::bench
