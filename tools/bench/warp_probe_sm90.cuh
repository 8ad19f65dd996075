// `loom warp-probe`: the latency of the warp-wide steps the latency-bound routing is made of
// (route_topk_device.cuh), each timed by clock64 in one warp as a chain of dependent steps, and
// one k = 8 ranking of the routing's own arg-max rounds (take_best) over E = 256 experts.
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
