// `loom bench`: generate a workload, run the layer (GPU path when the kernels exist for the shape,
// else the CPU reference, labelled as such), measure both speeds of light in the same run, and
// return one record per token count.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "bench/report.hpp"
#include "bench/timer.hpp"
#include "loom/loom.hpp"
#include "workload/workload.hpp"

namespace loom::bench {

struct BenchOptions {
  std::string preset;  // for the record; the shape below is what runs
  Shape shape;
  Routing routing;
  std::vector<int64_t> tokens;  // one record per entry
  Distribution dist;
  bool dist_logits = false;  // a distribution of ids runs from router logits that route to them
  WeightValues weight_values = WeightValues::uniform;
  uint64_t seed = 1;
  TimerOptions timer;
  bool measure_sol = true;
  int max_copies = 8;        // input copies for L2 rotation
  double max_cpu_gflop = 40; // larger CPU-reference runs are skipped (with a note)
  Options layer;             // loom options of the GPU path (deterministic, pdl, prefetch)
  bool check = true;         // compare the GPU output with the CPU reference when it is affordable
  int trace_chain = 0;       // > 0: that many traced cold replays (a LOOM_CHAIN_TRACE build only)
};

std::vector<Record> run_bench(const BenchOptions& opt, std::ostream& log);

}  // namespace loom::bench
