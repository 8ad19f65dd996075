// Expert parallelism's CPU reference: the send layout by hand and by its invariants, the token
// form's layout and its owner-side return rows, and all P ranks of a layer run on the CPU equal to
// the one-GPU layer's reference, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/rng.hpp"
#include "dist/ep_routes_ref.hpp"
#include "pipeline/layer_ref.hpp"
#include "test_seed.hpp"
#include "workload/workload.hpp"

namespace loom::dist {
namespace {

using Ints = std::vector<int32_t>;
using Longs = std::vector<int64_t>;

TEST(EpRoutesRef, SendLayoutHandCase) {
  // P 2, E 4: rank 0 owns experts 0-1, rank 1 owns 2-3. T 3, k 2; slot 5's id is out of range.
  EpConfig c;
  c.size = 2;
  const Placement p = make_placement(4, c);
  const int32_t ids[] = {2, 0, 3, 1, 0, 5};
  const SendLayout s = send_layout_ref(p, ids, 3, 2);
  EXPECT_EQ(s.counts, (Longs{3, 2}));
  EXPECT_EQ(s.offsets, (Longs{0, 3, 5}));
  EXPECT_EQ(s.slot, (Ints{1, 3, 4, 0, 2}));
  EXPECT_EQ(s.local_expert, (Ints{0, 1, 0, 0, 1}));
  EXPECT_EQ(s.position, (Ints{3, 0, 4, 1, 2, -1}));
  EXPECT_EQ(s.dropped, 1);
  const RecvLayout r = recv_layout_ref({2, 0, 7});
  EXPECT_EQ(r.offsets, (Longs{0, 2, 2, 9}));
  EXPECT_EQ(r.rows(), 9);
  EXPECT_THROW(recv_layout_ref({1, -1}), Error);
}

TEST(EpRoutesRef, SendLayoutInvariants) {
  LOOM_FRESH_SEED();
  Rng rng(seed);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t E = 1 + int64_t(rng.below(40)), k = 1 + int64_t(rng.below(4));
    const int P = 1 + int(rng.below(uint64_t(std::min<int64_t>(E, 8))));
    const int64_t T = int64_t(rng.below(50));
    EpConfig c;
    c.size = P;
    c.rank = int(rng.below(uint64_t(P)));
    if (trial % 2) {  // a random map that gives every rank an expert
      c.expert_rank.resize(size_t(E));
      for (int64_t e = 0; e < E; ++e) c.expert_rank[size_t(e)] = e < P ? int32_t(e) : int32_t(rng.below(uint64_t(P)));
    }
    const Placement p = make_placement(E, c);
    Ints ids(size_t(T * k));
    for (auto& id : ids) id = int32_t(rng.below(uint64_t(E + 2))) - 1;  // -1 and E: out of range
    const SendLayout s = send_layout_ref(p, ids.data(), T, k);
    int64_t dropped = 0;
    for (int64_t r = 0; r < T * k; ++r) {
      const int32_t e = ids[size_t(r)];
      if (e < 0 || e >= E) {
        ++dropped;
        EXPECT_EQ(s.position[size_t(r)], -1);
        continue;
      }
      const int32_t row = s.position[size_t(r)];
      ASSERT_GE(row, 0);
      EXPECT_EQ(s.slot[size_t(row)], r);
      const int32_t dest = p.owner[size_t(e)];
      EXPECT_GE(row, s.offsets[size_t(dest)]);
      EXPECT_LT(row, s.offsets[size_t(dest) + 1]);
      EXPECT_EQ(s.local_expert[size_t(row)], p.local_index[size_t(e)]);
    }
    EXPECT_EQ(s.dropped, dropped);
    EXPECT_EQ(s.offsets.back(), T * k - dropped);
    for (int q = 0; q < P; ++q)  // slot order within each destination
      for (int64_t row = s.offsets[size_t(q)] + 1; row < s.offsets[size_t(q) + 1]; ++row)
        EXPECT_LT(s.slot[size_t(row - 1)], s.slot[size_t(row)]);
  }
}

TEST(EpRoutesRef, TokenFormHandCase) {
  // The hand case above, each token sent once per owner: rank 0 gets tokens 0, 1, 2; rank 1
  // tokens 0, 1. Each route's return row is its place among the routes to its owner.
  EpConfig c;
  c.size = 2;
  const Placement p = make_placement(4, c);
  const int32_t ids[] = {2, 0, 3, 1, 0, 5};
  const TokenSendLayout s = send_tokens_ref(p, ids, 3, 2);
  EXPECT_EQ(s.counts, (Longs{3, 2}));
  EXPECT_EQ(s.offsets, (Longs{0, 3, 5}));
  EXPECT_EQ(s.token, (Ints{0, 1, 2, 0, 1}));
  EXPECT_EQ(s.local_ids, (Ints{-1, 0, -1, 1, 0, -1, 0, -1, 1, -1}));
  EXPECT_EQ(s.return_row, (Ints{0, 0, 1, 1, 2, -1}));
  EXPECT_EQ(s.dropped, 1);
  EXPECT_EQ(owner_return_rows_ref(s.local_ids.data(), 3, 2), (Ints{-1, 0, -1, 1, 2, -1}));
  EXPECT_EQ(owner_return_rows_ref(s.local_ids.data() + 6, 2, 2), (Ints{0, -1, 1, -1}));
}

// The token form's invariant: the owner, counting the valid slots of the token rows it received,
// finds every route's return row where the sender expects it; the rows are the route form's.
TEST(EpRoutesRef, TokenFormOwnerFindsTheSendersReturnRows) {
  LOOM_FRESH_SEED();
  Rng rng(seed);
  for (int trial = 0; trial < 30; ++trial) {
    const int64_t E = 1 + int64_t(rng.below(40)), k = 1 + int64_t(rng.below(8));
    const int P = 1 + int(rng.below(uint64_t(std::min<int64_t>(E, 8))));
    const int64_t T = int64_t(rng.below(60));
    EpConfig c;
    c.size = P;
    if (trial % 2) {
      c.expert_rank.resize(size_t(E));
      for (int64_t e = 0; e < E; ++e) c.expert_rank[size_t(e)] = e < P ? int32_t(e) : int32_t(rng.below(uint64_t(P)));
    }
    const Placement p = make_placement(E, c);
    Ints ids(size_t(T * k));
    for (auto& id : ids) id = int32_t(rng.below(uint64_t(E + 2))) - 1;  // -1 and E: out of range
    const TokenSendLayout s = send_tokens_ref(p, ids.data(), T, k);
    const SendLayout routes = send_layout_ref(p, ids.data(), T, k);
    EXPECT_EQ(s.dropped, routes.dropped);
    for (int64_t r = 0; r < T * k; ++r) {  // the route form's place among the owner's routes
      const int32_t e = ids[size_t(r)];
      const int32_t want =
          e < 0 || e >= E ? -1 : int32_t(routes.position[size_t(r)] - routes.offsets[size_t(p.owner[size_t(e)])]);
      ASSERT_EQ(s.return_row[size_t(r)], want) << "route " << r;
    }
    std::vector<int> seen(size_t(T * k), 0);
    for (int q = 0; q < P; ++q) {
      const int64_t first = s.offsets[size_t(q)], rows = s.counts[size_t(q)];
      const Ints owner = owner_return_rows_ref(s.local_ids.data() + first * k, rows, k);
      int64_t valid = 0;
      for (int64_t i = 0; i < rows; ++i) {
        const int32_t t = s.token[size_t(first + i)];
        if (i > 0) {
          EXPECT_LT(s.token[size_t(first + i - 1)], t) << "token order within rank " << q;
        }
        int64_t mine = 0;
        for (int64_t j = 0; j < k; ++j) {
          const int32_t e = ids[size_t(t * k + j)], local = s.local_ids[size_t((first + i) * k + j)];
          const bool owned = e >= 0 && e < E && p.owner[size_t(e)] == q;
          ASSERT_EQ(local, owned ? p.local_index[size_t(e)] : -1) << "rank " << q << " row " << i << " slot " << j;
          if (!owned) continue;
          ++mine;
          ++seen[size_t(t * k + j)];
          ASSERT_EQ(owner[size_t(i * k + j)], s.return_row[size_t(t * k + j)]) << "rank " << q << " token " << t;
        }
        EXPECT_GT(mine, 0) << "a token row with no route to rank " << q;
        valid += mine;
      }
      EXPECT_EQ(valid, routes.counts[size_t(q)]);
    }
    for (int64_t r = 0; r < T * k; ++r) EXPECT_EQ(seen[size_t(r)], s.return_row[size_t(r)] >= 0 ? 1 : 0) << r;
  }
}

// The device's buffers (token_segments_ref): with caps nothing reaches and one part, the token
// form itself; with tight caps and parts, every route either sent once at a distinct return row of
// its (rank, part) segment or counted in the overflow, and tokens spread over the parts.
TEST(EpRoutesRef, TokenSegmentsAreTheTokenFormWithCapsAndParts) {
  LOOM_FRESH_SEED();
  Rng rng(seed);
  for (int trial = 0; trial < 30; ++trial) {
    const int64_t E = 1 + int64_t(rng.below(40)), k = 1 + int64_t(rng.below(8));
    const int P = 1 + int(rng.below(uint64_t(std::min<int64_t>(E, 8))));
    const int64_t T = 1 + int64_t(rng.below(60));
    EpConfig c;
    c.size = P;
    const Placement p = make_placement(E, c);
    Ints ids(size_t(T * k));
    for (auto& id : ids) id = int32_t(rng.below(uint64_t(E + 2))) - 1;
    const TokenSendLayout form = send_tokens_ref(p, ids.data(), T, k);
    const TokenSegments loose = token_segments_ref(p, ids.data(), T, k, T, T * k, 1);
    EXPECT_EQ(loose.overflow, 0);
    EXPECT_EQ(loose.dropped, form.dropped);
    EXPECT_EQ(loose.tokens_to, form.counts);
    for (int q = 0; q < P; ++q)
      for (int64_t i = 0; i < form.counts[size_t(q)]; ++i) {
        const int64_t row = q * T + i, frow = form.offsets[size_t(q)] + i;
        ASSERT_EQ(loose.token[size_t(row)], form.token[size_t(frow)]);
        for (int64_t j = 0; j < k; ++j)
          ASSERT_EQ(loose.ids[size_t(row * k + j)], form.local_ids[size_t(frow * k + j)]);
      }
    for (int64_t r = 0; r < T * k; ++r) {
      const int32_t want = form.return_row[size_t(r)];
      const int32_t e = ids[size_t(r)];
      ASSERT_EQ(loose.slot_row[size_t(r)], want < 0 ? -1 : int32_t(p.owner[size_t(e)] * T * k + want)) << r;
    }

    const int C = 1 + int(rng.below(4));
    const int64_t tcap = C * int64_t(rng.below(uint64_t(T / C + 2)));
    const int64_t rcap = C * int64_t(rng.below(uint64_t(T * k / C + 2)));
    const TokenSegments tight = token_segments_ref(p, ids.data(), T, k, tcap, rcap, C);
    std::vector<int> used(size_t(P * rcap), 0);
    int64_t sent = 0;
    for (size_t a = 0; a < tight.slot.size(); ++a) {
      if (tight.slot[a] < 0) {
        EXPECT_EQ(tight.ids[a], -1);
        EXPECT_EQ(tight.ret[a], -1);
        continue;
      }
      ++sent;
      const int64_t row = int64_t(a) / k, part = row / (P * (tcap / C)), q = row / (tcap / C) % P;
      EXPECT_EQ(tight.token[size_t(row)], tight.slot[a] / k);
      EXPECT_EQ(tight.slot_row[size_t(tight.slot[a])], (part * P + q) * (rcap / C) + tight.ret[a]);
      ASSERT_LT(tight.ret[a], rcap / C);
      EXPECT_EQ(++used[size_t(tight.slot_row[size_t(tight.slot[a])])], 1) << "a return row taken twice";
    }
    EXPECT_EQ(sent + tight.overflow + tight.dropped, T * k);
  }
}

struct WorldCase {
  DType dtype;
  int ranks;
  std::string dist;
  bool map;
};

// P ranks with different token counts (one with none) against one batch of all their tokens.
void expect_world_equals_one_gpu(const WorldCase& wc, uint64_t seed) {
  SCOPED_TRACE(std::string(to_string(wc.dtype)) + " P=" + std::to_string(wc.ranks) + " " + wc.dist +
               (wc.map ? " map" : " blocks"));
  Shape s;
  s.hidden = 256;
  s.inter = 128;
  s.experts = 8;
  s.topk = 3;
  s.mode = Mode::ffn;
  s.dtype = wc.dtype;
  const LayerWeights w = make_weights(s, seed);
  const Longs tokens_of{5, 0, 9, 3};
  std::vector<std::vector<bf16>> hidden;
  std::vector<TopK> topk;
  std::vector<bf16> all_hidden;
  TopK all;
  all.topk = s.topk;
  for (int r = 0; r < wc.ranks; ++r) {
    Shape sr = s;
    sr.tokens = tokens_of[size_t(r)];
    hidden.push_back(make_hidden(sr, seed + 11 * uint64_t(r + 1)));
    topk.push_back(make_routes(sr, Routing{}, parse_distribution(wc.dist), seed + 17 * uint64_t(r + 1)).topk);
    if (r == 0 && sr.tokens > 0) topk[0].ids[1] = int32_t(s.experts);  // one out-of-range id: dropped alike
    all_hidden.insert(all_hidden.end(), hidden.back().begin(), hidden.back().end());
    all.ids.insert(all.ids.end(), topk.back().ids.begin(), topk.back().ids.end());
    all.weights.insert(all.weights.end(), topk.back().weights.begin(), topk.back().weights.end());
    all.tokens += sr.tokens;
  }
  EpConfig c;
  c.size = wc.ranks;
  if (wc.map) c.expert_rank = {1 % wc.ranks, 0, 2 % wc.ranks, 0, 3 % wc.ranks, 1 % wc.ranks, 0, 2 % wc.ranks};
  const auto world = ep_world_ref(w, c, hidden, topk);
  const LayerResult one = layer_ref(w, all_hidden.data(), all, nullptr, true);
  int64_t row0 = 0;
  for (int r = 0; r < wc.ranks; ++r) {
    const int64_t n = tokens_of[size_t(r)] * s.hidden;
    ASSERT_EQ(int64_t(world[size_t(r)].size()), n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(world[size_t(r)][size_t(i)], one.out[size_t(row0 + i)]) << "rank " << r << " element " << i;
    row0 += n;
  }
}

TEST(EpRoutesRef, WorldEqualsOneGpuBitForBit) {
  LOOM_FRESH_SEED();
  for (const DType dt : {DType::bf16, DType::fp8})
    for (const int P : {1, 2, 3, 4}) expect_world_equals_one_gpu({dt, P, "random", false}, seed);
  expect_world_equals_one_gpu({DType::bf16, 3, "random", true}, seed);
  expect_world_equals_one_gpu({DType::fp8, 4, "random", true}, seed);
}

TEST(EpRoutesRef, WorldSkewedToOneRank) {
  LOOM_FRESH_SEED();
  // hot:1: every token routes to one expert; concentrated: every token picks the same k experts,
  // so some ranks receive nothing.
  expect_world_equals_one_gpu({DType::bf16, 4, "hot:1", false}, seed);
  expect_world_equals_one_gpu({DType::fp8, 2, "concentrated", false}, seed);
}

}  // namespace
}  // namespace loom::dist
