// Expert parallelism's placement: contiguous blocks, ranges, maps, and every invalid configuration
// rejected with a message naming it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dist/placement.hpp"
#include "loom/types.hpp"

namespace loom::dist {
namespace {

using Ints = std::vector<int32_t>;

EpConfig config(int size, int rank) {
  EpConfig c;
  c.size = size;
  c.rank = rank;
  return c;
}

TEST(Placement, ContiguousBlocks) {
  const Placement p = make_placement(16, config(4, 2));
  EXPECT_EQ(p.local_experts, (Ints{8, 9, 10, 11}));
  EXPECT_EQ(p.rank_experts, (Ints{4, 4, 4, 4}));
  EXPECT_EQ(p.owner[7], 1);
  EXPECT_EQ(p.owner[8], 2);
  EXPECT_EQ(p.local_index[11], 3);
  EXPECT_EQ(p.local_index[12], 0);
  EXPECT_TRUE(p.contiguous);
  EXPECT_EQ(describe(p), "rank 2 of 4: experts 8..11 of 16 (contiguous)");
}

TEST(Placement, UnevenBlocksDifferByAtMostOne) {
  for (int64_t E : {5, 7, 10, 13}) {
    for (int P : {2, 3, 4, 5}) {
      if (E < P) continue;
      const Placement p = make_placement(E, config(P, 0));
      int32_t lo = p.rank_experts[0], hi = lo, total = 0;
      for (int32_t n : p.rank_experts) {
        lo = std::min(lo, n);
        hi = std::max(hi, n);
        total += n;
      }
      EXPECT_LE(hi - lo, 1) << "E=" << E << " P=" << P;
      EXPECT_EQ(total, E);
      for (int64_t e = 1; e < E; ++e) EXPECT_LE(p.owner[size_t(e - 1)], p.owner[size_t(e)]);
    }
  }
}

TEST(Placement, RangeMustBeThisRanksBlock) {
  EpConfig c = config(2, 1);
  c.first_expert = 8;
  c.expert_count = 8;
  EXPECT_EQ(make_placement(16, c).local_experts.front(), 8);
  c.first_expert = 4;
  try {
    make_placement(16, c);
    FAIL() << "a range other than the rank's block was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("contiguous block [8, 16)"), std::string::npos) << e.what();
  }
  c.first_expert = 8;
  c.expert_count = -1;  // one of the two alone
  EXPECT_THROW(make_placement(16, c), Error);
}

TEST(Placement, MapPlacesAnyExpertAnywhere) {
  EpConfig c = config(3, 1);
  c.expert_rank = {2, 1, 0, 1, 2, 0, 1};
  const Placement p = make_placement(7, c);
  EXPECT_EQ(p.local_experts, (Ints{1, 3, 6}));
  EXPECT_EQ(p.rank_experts, (Ints{2, 3, 2}));
  EXPECT_EQ(p.local_index, (Ints{0, 0, 0, 1, 1, 1, 2}));
  EXPECT_FALSE(p.contiguous);
  EXPECT_EQ(describe(p), "rank 1 of 3: 3 of 7 experts (by map)");
  // A range given with the map must be what the map gives the rank.
  c.first_expert = 1;
  c.expert_count = 3;
  EXPECT_THROW(make_placement(7, c), Error);
  c.expert_rank = {0, 1, 1, 1, 2, 2, 0};
  EXPECT_EQ(make_placement(7, c).local_experts, (Ints{1, 2, 3}));
}

TEST(Placement, RejectsInvalidConfigurations) {
  EXPECT_THROW(make_placement(16, config(0, 0)), Error);
  EXPECT_THROW(make_placement(16, config(kMaxRanks + 1, 0)), Error);
  EXPECT_THROW(make_placement(16, config(2, 2)), Error);
  EXPECT_THROW(make_placement(16, config(2, -1)), Error);
  EXPECT_THROW(make_placement(3, config(4, 0)), Error);  // a rank without experts
  EXPECT_THROW(make_placement(0, config(1, 0)), Error);
  EpConfig c = config(2, 0);
  c.expert_rank = {0, 1, 1};  // wrong size
  EXPECT_THROW(make_placement(4, c), Error);
  c.expert_rank = {0, 1, 2, 1};  // rank out of range
  EXPECT_THROW(make_placement(4, c), Error);
  c.expert_rank = {1, 1, 1, 1};  // rank 0 owns nothing
  try {
    make_placement(4, c);
    FAIL() << "a rank without experts was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 no expert"), std::string::npos) << e.what();
  }
}

TEST(Placement, OneRankOwnsEverything) {
  const Placement p = make_placement(8, config(1, 0));
  EXPECT_EQ(p.local_experts.size(), 8u);
  for (int64_t e = 0; e < 8; ++e) EXPECT_EQ(p.local_index[size_t(e)], e);
}

}  // namespace
}  // namespace loom::dist
