#include "bench/stats.hpp"

#include <algorithm>
#include <numeric>

namespace loom::bench {

namespace {
double percentile(const std::vector<double>& sorted, double q) {
  const double pos = q * double(sorted.size() - 1);
  const size_t lo = size_t(pos);
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - double(lo)) * (sorted[hi] - sorted[lo]);
}
}  // namespace

Stats summarize(std::vector<double> us) {
  Stats s;
  if (us.empty()) return s;
  std::sort(us.begin(), us.end());
  s.reps = int(us.size());
  s.min_us = us.front();
  s.p10_us = percentile(us, 0.10);
  s.median_us = percentile(us, 0.50);
  s.p90_us = percentile(us, 0.90);
  s.mean_us = std::accumulate(us.begin(), us.end(), 0.0) / double(us.size());
  return s;
}

}  // namespace loom::bench
