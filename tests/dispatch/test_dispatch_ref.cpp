// Dispatch reference: hand-worked layouts, and the layout invariants on random ids (duplicates and
// out-of-range ids included).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <limits>
#include <utility>
#include <vector>

#include "common/rng.hpp"
#include "dispatch/dispatch_ref.hpp"
#include "loom/types.hpp"
#include "test_seed.hpp"

namespace loom {
namespace {

using Ints = std::vector<int32_t>;

TEST(DispatchRef, HandCase) {
  // T 3, k 2, E 4. Routes r = t*2 + j: r0 e2, r1 e0, r2 e2, r3 e3, r4 e0, r5 e2.
  // Expert 0: r1, r4 -> rows 0, 1. Expert 1: none. Expert 2: r0, r2, r5 -> rows 2, 3, 4.
  // Expert 3: r3 -> row 5.
  const int32_t ids[] = {2, 0, 2, 3, 0, 2};
  const Dispatch d = dispatch_ref(ids, 3, 2, 4);
  EXPECT_EQ(d.experts, 4);
  EXPECT_EQ(d.routes, 6);
  EXPECT_EQ(d.dropped, 0);
  EXPECT_EQ(d.counts, (Ints{2, 0, 3, 1}));
  EXPECT_EQ(d.offsets, (Ints{0, 2, 2, 5, 6}));
  EXPECT_EQ(d.route_row, (Ints{2, 0, 3, 5, 1, 4}));
  EXPECT_EQ(d.row_route, (Ints{1, 4, 0, 2, 5, 3}));
}

TEST(DispatchRef, HandCaseDroppedAndRepeated) {
  // T 2, k 3, E 3. Token 0: [1, -1, 3] (slots 1 and 2 out of range); token 1: [1, 1, 0] (the
  // same expert twice, ordered by slot). Kept: r0 e1, r3 e1, r4 e1, r5 e0.
  // Expert 0: r5 -> row 0. Expert 1: r0, r3, r4 -> rows 1, 2, 3. Expert 2: none.
  const int32_t ids[] = {1, -1, 3, 1, 1, 0};
  const Dispatch d = dispatch_ref(ids, 2, 3, 3);
  EXPECT_EQ(d.routes, 6);
  EXPECT_EQ(d.dropped, 2);
  EXPECT_EQ(d.counts, (Ints{1, 3, 0}));
  EXPECT_EQ(d.offsets, (Ints{0, 1, 4, 4}));
  EXPECT_EQ(d.route_row, (Ints{1, -1, -1, 2, 3, 0}));
  EXPECT_EQ(d.row_route, (Ints{5, 0, 3, 4}));
}

TEST(DispatchRef, TokenMasksAndHitListHandCase) {
  // The HandCaseDroppedAndRepeated ids plus a token 33 in the second mask word: T 34, k 3, E 3.
  std::vector<int32_t> ids(34 * 3, 7);  // tokens 2..32: out of range, no bits
  const int32_t head[] = {1, -1, 3, 1, 1, 0};
  std::copy(std::begin(head), std::end(head), ids.begin());
  ids[33 * 3] = 2;
  const std::vector<uint32_t> masks = token_masks_ref(ids.data(), 34, 3, 3);
  EXPECT_EQ(masks, (std::vector<uint32_t>{0b10, 0b11, 0, 0, 0, 0b10}));  // [word][expert]
  const Dispatch d = dispatch_ref(ids.data(), 34, 3, 3);
  EXPECT_EQ(d.offsets, (Ints{0, 1, 4, 5}));
  // Experts 0, 1, 2 have 1, 3, 1 rows.
  EXPECT_EQ(hit_list_ref(d.offsets), (Ints{3, 0, 0, 0, 0, 0, 1, 0, 1, 1, 3, 0, 2, 4, 1, 0}));
  EXPECT_EQ(hit_list_ref(Ints{0, 0, 2, 2}), (Ints{1, 0, 0, 0, 1, 0, 2, 0}));  // only expert 1
}

TEST(DispatchRef, AllDropped) {
  const int32_t ids[] = {std::numeric_limits<int32_t>::min(), 5, std::numeric_limits<int32_t>::max(), -1};
  const Dispatch d = dispatch_ref(ids, 2, 2, 5);
  EXPECT_EQ(d.dropped, 4);
  EXPECT_EQ(d.counts, (Ints{0, 0, 0, 0, 0}));
  EXPECT_EQ(d.offsets, (Ints{0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(d.route_row, (Ints{-1, -1, -1, -1}));
  EXPECT_TRUE(d.row_route.empty());
}

TEST(DispatchRef, ZeroTokens) {
  const Dispatch d = dispatch_ref(nullptr, 0, 8, 3);
  EXPECT_EQ(d.experts, 3);
  EXPECT_EQ(d.routes, 0);
  EXPECT_EQ(d.dropped, 0);
  EXPECT_EQ(d.counts, (Ints{0, 0, 0}));
  EXPECT_EQ(d.offsets, (Ints{0, 0, 0, 0}));
  EXPECT_TRUE(d.route_row.empty());
  EXPECT_TRUE(d.row_route.empty());
}

TEST(DispatchRef, InvalidArguments) {
  const int32_t ids[] = {0, 1};
  EXPECT_THROW(dispatch_ref(ids, -1, 2, 4), Error);
  EXPECT_THROW(dispatch_ref(ids, 1, 0, 4), Error);
  EXPECT_THROW(dispatch_ref(ids, 1, 2, 0), Error);
  EXPECT_THROW(dispatch_ref(nullptr, 1, 2, 4), Error);
  EXPECT_THROW(dispatch_ref(ids, int64_t(1) << 30, 4, 4), Error);  // 2^32 routes overflow int32 rows
}

TEST(DispatchRefRandom, LayoutInvariants) {
  LOOM_FRESH_SEED();
  Rng rng(seed);
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t experts = 1 + int64_t(rng.below(rng.below(2) ? 16 : 600));
    const int64_t topk = 1 + int64_t(rng.below(16));
    const int64_t tokens = trial == 0 ? 0 : int64_t(rng.below(3000));
    const uint64_t drop_every = 1 + rng.below(20);  // how often an id is out of range
    SCOPED_TRACE(testing::Message() << "T=" << tokens << " k=" << topk << " E=" << experts);

    const int64_t routes = tokens * topk;
    std::vector<int32_t> ids(static_cast<size_t>(routes));
    for (int32_t& id : ids) {
      if (rng.below(drop_every) == 0) {
        const int32_t bad[] = {-1, int32_t(experts), int32_t(experts + 1 + int64_t(rng.below(100))),
                               -int32_t(1 + rng.below(1000)), std::numeric_limits<int32_t>::min(),
                               std::numeric_limits<int32_t>::max()};
        id = bad[rng.below(std::size(bad))];
      } else {
        id = int32_t(rng.below(uint64_t(experts)));  // repeats within a token are allowed here
      }
    }
    const Dispatch d = dispatch_ref(ids.data(), tokens, topk, experts);

    // Expectations counted directly from the ids.
    std::vector<int32_t> expected_counts(size_t(experts), 0);
    int64_t expected_dropped = 0;
    for (int32_t id : ids) {
      if (id >= 0 && id < experts)
        ++expected_counts[size_t(id)];
      else
        ++expected_dropped;
    }
    const int64_t rows = routes - expected_dropped;
    ASSERT_EQ(d.experts, experts);
    ASSERT_EQ(d.routes, routes);
    ASSERT_EQ(d.dropped, expected_dropped);
    ASSERT_EQ(d.counts, expected_counts);
    ASSERT_EQ(d.offsets.size(), size_t(experts + 1));
    ASSERT_EQ(d.route_row.size(), size_t(routes));
    ASSERT_EQ(int64_t(d.row_route.size()), rows);

    // Offsets: start at 0, step by the counts (so monotone), end at the kept routes.
    EXPECT_EQ(d.offsets[0], 0);
    for (int64_t e = 0; e < experts; ++e) {
      EXPECT_LE(d.offsets[size_t(e)], d.offsets[size_t(e + 1)]);
      EXPECT_EQ(d.offsets[size_t(e + 1)] - d.offsets[size_t(e)], expected_counts[size_t(e)]);
    }
    EXPECT_EQ(d.offsets[size_t(experts)], rows);

    // route_row: -1 exactly for dropped routes, and a permutation of [0, rows) over the rest.
    std::vector<int> hits(size_t(rows), 0);
    for (int64_t r = 0; r < routes; ++r) {
      const int32_t id = ids[size_t(r)], row = d.route_row[size_t(r)];
      if (id < 0 || id >= experts) {
        EXPECT_EQ(row, -1) << "route " << r;
        continue;
      }
      ASSERT_GE(row, 0) << "route " << r;
      ASSERT_LT(row, rows) << "route " << r;
      ++hits[size_t(row)];
      // The row lies in its expert's segment, and row_route maps it back.
      EXPECT_GE(row, d.offsets[size_t(id)]) << "route " << r;
      EXPECT_LT(row, d.offsets[size_t(id + 1)]) << "route " << r;
      EXPECT_EQ(d.row_route[size_t(row)], r) << "route " << r;
    }
    for (int64_t row = 0; row < rows; ++row) EXPECT_EQ(hits[size_t(row)], 1) << "row " << row;

    // Inside each segment: rows hold routes of that expert, ascending route index = ascending
    // (token, slot).
    for (int64_t e = 0; e < experts; ++e) {
      for (int64_t row = d.offsets[size_t(e)]; row < d.offsets[size_t(e + 1)]; ++row) {
        const int32_t r = d.row_route[size_t(row)];
        ASSERT_GE(r, 0);
        ASSERT_LT(r, routes);
        EXPECT_EQ(ids[size_t(r)], e) << "row " << row;
        EXPECT_EQ(d.route_row[size_t(r)], row) << "row " << row;
        if (row > d.offsets[size_t(e)]) {
          const int32_t prev = d.row_route[size_t(row - 1)];
          EXPECT_LT(std::make_pair(prev / topk, prev % topk), std::make_pair(r / topk, r % topk)) << "row " << row;
        }
      }
    }
    if (HasFailure()) return;
  }
}

}  // namespace
}  // namespace loom
