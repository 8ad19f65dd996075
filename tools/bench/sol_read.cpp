#include "bench/sol_read.hpp"

#include <utility>

namespace loom::bench {

std::vector<ReadConfig> read_sweep() {
  std::vector<ReadConfig> v;
  for (int ctas : {2, 4, 8})
    for (int unroll : {2, 4, 8}) v.push_back(ReadConfig{ctas, 512, unroll});
  // Bulk copies: 1 CTA per SM with a deep ring, or 2 with shallower ones (their rings share the SM).
  // Chunks of 16 KiB dealt one at a time, 16 at a time (256 KiB, `loom stream-probe`'s units), or
  // in one span per CTA.
  for (int run : {1, 16, 0})
    for (const auto& [ctas, stages] : {std::pair{1, 8}, std::pair{1, 12}, std::pair{2, 4}, std::pair{2, 6}})
      v.push_back(ReadConfig{ctas, 0, 0, stages, run});
  return v;
}

ReadResult measure_stream_read(GpuTimer& timer, const DeviceInfo& device, const std::vector<ReadArgs>& per_copy,
                               L2Mode mode, const TimerOptions& opt) {
  ReadResult best;
  double loads_us = 0.0, bulk_us = 0.0;
  for (const ReadConfig& cfg : read_sweep()) {
    const Stats s = timer.time(
        [&](cudaStream_t st, int c) { launch_stream_read(per_copy[size_t(c)], cfg, device.sm_count, st); },
        int(per_copy.size()), mode, opt);
    double& kind = cfg.bulk_stages > 0 ? bulk_us : loads_us;
    if (kind == 0.0 || s.median_us < kind) kind = s.median_us;
    if (!best.stats.valid() || s.median_us < best.stats.median_us) best.stats = s, best.config = cfg;
  }
  best.loads_median_us = loads_us;
  best.bulk_median_us = bulk_us;
  return best;
}

}  // namespace loom::bench
