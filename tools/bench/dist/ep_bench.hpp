// `loom bench --ep N` (issue 49): expert parallelism over N GPUs of one host, one process a rank.
// The parent writes an NCCL unique id to a file and starts N copies of this executable, each with
// --ep-rank r; each rank builds the layer's weights (all E, one seed), keeps its experts, makes its
// own tokens (a seed per rank) and a plan for each token count, runs plan_ep/run_ep, checks its
// output against the CPU reference where that is affordable, and times graph replays of the whole
// run and of its local experts alone (the same run's exchange is the difference), for each part
// count asked (the chunked overlap against the unsplit form, in one run). Rank 0 then times the
// one-GPU layer on P T tokens. The parent prints the ranks' rows.
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
  int64_t rows_per_peer = 0;    // 0: plan_ep's default cap; else at most T k of each token count
  int64_t tokens_per_peer = 0;  // 0: plan_ep's default cap; else at most each token count
  std::vector<int> chunks{1};  // each a plan (ExpertParallel::chunks), timed in turn in the same run
  int comm_sms = -1;           // ExpertParallel::comm_sms
};

// Starts the ranks as `self` (this executable) with `argv` (after the command) plus each rank's
// flags, waits for them, and returns the table. Throws loom::Error when a rank fails.
std::string run_ep_bench(const EpBenchOptions& opt, const std::string& self, const std::vector<std::string>& argv,
                         std::ostream& log);

// One rank: writes a line per token count to out_file.
void run_ep_bench_rank(const EpBenchOptions& opt, int rank, const std::string& id_file, const std::string& out_file,
                       std::ostream& log);

}  // namespace loom::bench
