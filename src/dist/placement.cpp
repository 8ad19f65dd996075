#include "dist/placement.hpp"

#include <string>

#include "loom/types.hpp"

namespace loom::dist {
namespace {

[[noreturn]] void fail(const std::string& why) { throw Error("expert parallelism: " + why); }

int64_t block_begin(int64_t experts, int ranks, int r) { return r * experts / ranks; }

}  // namespace

Placement make_placement(int64_t experts, const EpConfig& ep) {
  if (ep.size < 1 || ep.size > kMaxRanks)
    fail("size must be in [1, " + std::to_string(kMaxRanks) + "], got " + std::to_string(ep.size));
  if (ep.rank < 0 || ep.rank >= ep.size)
    fail("rank must be in [0, " + std::to_string(ep.size) + "), got " + std::to_string(ep.rank));
  if (experts < 1 || experts > kMaxExperts)
    fail("experts must be in [1, " + std::to_string(kMaxExperts) + "], got " + std::to_string(experts));
  if (experts < ep.size)
    fail("every rank owns at least one expert: " + std::to_string(experts) + " experts for " +
         std::to_string(ep.size) + " ranks");
  const bool range_given = ep.first_expert >= 0 || ep.expert_count >= 0;
  if (range_given && (ep.first_expert < 0 || ep.expert_count < 1 || ep.first_expert + ep.expert_count > experts))
    fail("the owned range [" + std::to_string(ep.first_expert) + ", +" + std::to_string(ep.expert_count) +
         ") must be non-empty and within the " + std::to_string(experts) + " experts");

  Placement p;
  p.ranks = ep.size;
  p.rank = ep.rank;
  p.experts = experts;
  p.owner.resize(size_t(experts));
  if (ep.expert_rank.empty()) {
    for (int r = 0; r < ep.size; ++r)
      for (int64_t e = block_begin(experts, ep.size, r); e < block_begin(experts, ep.size, r + 1); ++e)
        p.owner[size_t(e)] = r;
  } else {
    if (int64_t(ep.expert_rank.size()) != experts)
      fail("the expert -> rank map has " + std::to_string(ep.expert_rank.size()) + " entries for " +
           std::to_string(experts) + " experts");
    for (int64_t e = 0; e < experts; ++e) {
      const int32_t r = ep.expert_rank[size_t(e)];
      if (r < 0 || r >= ep.size)
        fail("the map gives expert " + std::to_string(e) + " to rank " + std::to_string(r) + ", outside [0, " +
             std::to_string(ep.size) + ")");
      p.owner[size_t(e)] = r;
    }
  }
  p.rank_experts.assign(size_t(ep.size), 0);
  p.local_index.resize(size_t(experts));
  for (int64_t e = 0; e < experts; ++e) {
    const int32_t r = p.owner[size_t(e)];
    p.local_index[size_t(e)] = p.rank_experts[size_t(r)]++;
    if (r == ep.rank) p.local_experts.push_back(int32_t(e));
  }
  for (int r = 0; r < ep.size; ++r)
    if (p.rank_experts[size_t(r)] == 0) fail("the map gives rank " + std::to_string(r) + " no expert");
  for (int64_t e = 1; e < experts; ++e)
    if (p.owner[size_t(e)] < p.owner[size_t(e - 1)]) p.contiguous = false;
  if (range_given) {
    // The range must be exactly this rank's experts, whichever way the owners were given.
    bool same = int64_t(p.local_experts.size()) == ep.expert_count;
    for (size_t i = 0; same && i < p.local_experts.size(); ++i)
      same = p.local_experts[i] == ep.first_expert + int64_t(i);
    if (!same)
      fail("rank " + std::to_string(ep.rank) + " is given experts [" + std::to_string(ep.first_expert) + ", " +
           std::to_string(ep.first_expert + ep.expert_count) + ") but owns " +
           (ep.expert_rank.empty() ? "its contiguous block [" + std::to_string(block_begin(experts, ep.size, ep.rank)) +
                                         ", " + std::to_string(block_begin(experts, ep.size, ep.rank + 1)) +
                                         "); another placement needs the expert -> rank map"
                                   : std::to_string(p.local_experts.size()) + " other experts by the map"));
  }
  return p;
}

std::string describe(const Placement& p) {
  std::string s = "rank " + std::to_string(p.rank) + " of " + std::to_string(p.ranks) + ": ";
  if (p.contiguous)
    return s + "experts " + std::to_string(p.local_experts.front()) + ".." + std::to_string(p.local_experts.back()) +
           " of " + std::to_string(p.experts) + " (contiguous)";
  return s + std::to_string(p.local_experts.size()) + " of " + std::to_string(p.experts) + " experts (by map)";
}

}  // namespace loom::dist
