// `loom bench --ep N` (issue 49): expert parallelism over N GPUs of one host, one process a rank.
// The parent writes an NCCL unique id to a file and starts N copies of this executable, each with
// --ep-rank r; each rank builds the layer's weights (all E, one seed), keeps its experts, makes its
// own tokens (a seed per rank), runs plan_ep/run_ep, checks its output against the CPU reference
// where that is affordable, and times graph replays of the whole run and of its local experts
// alone (the same run's exchange is the difference). The parent prints the ranks' rows.
// No MPI: rendezvous through the id file. NCCL_NVLS_ENABLE=0 in every rank.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "bench/bench.hpp"

namespace loom::bench {

struct EpBenchOptions {
  BenchOptions base;  // shape (all E experts), routing, tokens per rank, distribution, seed, timer, options
  int ranks = 1;
  int64_t rows_per_peer = 0;  // 0: plan_ep's default cap
};

// Starts the ranks as `self` (this executable) with `argv` (after the command) plus each rank's
// flags, waits for them, and returns the table. Throws loom::Error when a rank fails.
std::string run_ep_bench(const EpBenchOptions& opt, const std::string& self, const std::vector<std::string>& argv,
                         std::ostream& log);

// One rank: writes a line per token count to out_file.
void run_ep_bench_rank(const EpBenchOptions& opt, int rank, const std::string& id_file, const std::string& out_file,
                       std::ostream& log);

}  // namespace loom::bench
