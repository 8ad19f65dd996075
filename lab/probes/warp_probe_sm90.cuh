// `loom warp-probe`: the latency of the warp-wide steps the latency-bound routing is made of
// (route_topk_device.cuh), each timed by clock64 in one warp as a chain of dependent steps, and
// k = 8 rankings over E = 256 experts by both rankers' own rounds (take_best for latency,
// WarpRanker for throughput).
//
// A step is the collective plus one dependent integer add (so the chain cannot fold). A launch
// times 8 passes of its chain: the first pass also fetches whatever code the instruction caches
// do not still hold from the previous launch; the later passes run warm.
#pragma once

#include <ostream>
#include <string>

namespace loom::bench {

struct WarpProbeOptions {
  int repeats = 5;  // launches per variant; the median is reported
};

// Prints progress to `log`; returns the table.
std::string run_warp_probe(const WarpProbeOptions& opt, std::ostream& log);

}  // namespace loom::bench
