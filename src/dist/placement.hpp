// Expert parallelism (issue 49), host side: which of P ranks owns each expert, and each expert's
// index among its owner's experts. The dispatch sends a route to its expert's owner, which runs
// it as its local expert local_index[e].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::dist {

// NCCL communicators span at most a few thousand ranks; an expert table per rank stays small.
inline constexpr int kMaxRanks = 4096;

struct EpConfig {
  int size = 1;  // P, the ranks that share the experts
  int rank = 0;  // this rank, in [0, P)
  // This rank's experts as a range [first_expert, first_expert + expert_count) (both or neither,
  // -1 = not given). Without a map it must be this rank's block of the contiguous placement.
  int64_t first_expert = -1, expert_count = -1;
  // Every expert's owner, [E] ranks in [0, P), for any placement; empty: contiguous blocks (rank r
  // owns experts [r E / P, (r + 1) E / P), so block sizes differ by at most one).
  std::vector<int32_t> expert_rank;
};

struct Placement {
  int ranks = 1, rank = 0;
  int64_t experts = 0;
  std::vector<int32_t> owner;          // [E] the rank that owns each expert
  std::vector<int32_t> local_index;    // [E] its index among its owner's experts (ascending global id)
  std::vector<int32_t> rank_experts;   // [P] how many experts each rank owns (each at least one)
  std::vector<int32_t> local_experts;  // this rank's experts' global ids, in local order
  bool contiguous = true;              // every rank's experts are one range, in rank order
};

// Checks the configuration against E and builds the tables; throws loom::Error with a one-line
// reason (rank out of range, a range that is not this rank's block, a map of the wrong size or
// with a rank out of range, a rank that owns no expert).
Placement make_placement(int64_t experts, const EpConfig& ep);

// "rank 1 of 2: experts 8..15 of 16 (contiguous)" or "... 5 of 16 experts (by map)".
std::string describe(const Placement& p);

}  // namespace loom::dist
