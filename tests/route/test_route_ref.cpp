// Routing reference: hand-worked cases with exact ids and weights, and random inputs checked
// against a brute-force ranking and weight computation written independently here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <numeric>
#include <set>
#include <vector>

#include "common/rng.hpp"
#include "route/route_ref.hpp"
#include "test_seed.hpp"

namespace loom {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

Routing softmax_routing(bool renormalize, float softcap = 0.0f, float scale = 1.0f) {
  Routing r;
  r.scoring = Scoring::softmax;
  r.renormalize = renormalize;
  r.softcap = softcap;
  r.scale = scale;
  return r;
}

Routing sigmoid_routing(int n_group, int topk_group, bool renormalize, float scale = 1.0f) {
  Routing r;
  r.scoring = Scoring::sigmoid;
  r.n_group = n_group;
  r.topk_group = topk_group;
  r.renormalize = renormalize;
  r.scale = scale;
  return r;
}

std::vector<int32_t> row_ids(const TopK& out, int64_t t) {
  return {out.ids.begin() + t * out.topk, out.ids.begin() + (t + 1) * out.topk};
}

// Logit whose sigmoid is p: log(p / (1 - p)), rounded to float like any real logit.
float logit_of(double p) { return float(std::log(p / (1.0 - p))); }

// ---------------------------------------------------------------------------------------------
// Softmax, by hand. logits [1, 3, 2, 0]: exp = [e, e^3, e^2, 1], sum S = 31.19287485057736.

TEST(RouteRef, SoftmaxHandNoRenorm) {
  const float logits[] = {1, 3, 2, 0};
  const TopK out = route_ref(logits, 1, 4, 2, softmax_routing(false));
  EXPECT_EQ(row_ids(out, 0), (std::vector<int32_t>{1, 2}));
  EXPECT_FLOAT_EQ(out.weights[0], 0.6439142598879724f);   // e^3 / S
  EXPECT_FLOAT_EQ(out.weights[1], 0.23688281808991016f);  // e^2 / S
}

TEST(RouteRef, SoftmaxHandRenorm) {
  const float logits[] = {1, 3, 2, 0};
  const TopK out = route_ref(logits, 1, 4, 2, softmax_routing(true));
  EXPECT_EQ(row_ids(out, 0), (std::vector<int32_t>{1, 2}));
  EXPECT_FLOAT_EQ(out.weights[0], 0.7310585786300049f);  // e^3 / (e^3 + e^2) = 1 / (1 + e^-1)
  EXPECT_FLOAT_EQ(out.weights[1], 0.2689414213699951f);  // e^2 / (e^3 + e^2) = 1 / (1 + e)
}

TEST(RouteRef, SoftmaxHandSoftcap) {
  // cap 2: l' = 2 tanh(l / 2) = [0.92423431, 1.81029651, 1.52318831, 0]; order unchanged.
  // sum exp(l') = 2.51994 + 6.11226 + 4.58683 + 1 = 14.21902
  const float logits[] = {1, 3, 2, 0};
  const TopK plain = route_ref(logits, 1, 4, 2, softmax_routing(false, 2.0f));
  EXPECT_EQ(row_ids(plain, 0), (std::vector<int32_t>{1, 2}));
  EXPECT_FLOAT_EQ(plain.weights[0], 0.4298649213463287f);  // 6.11226 / 14.21902
  EXPECT_FLOAT_EQ(plain.weights[1], 0.322583761325795f);   // 4.58683 / 14.21902
  const TopK renorm = route_ref(logits, 1, 4, 2, softmax_routing(true, 2.0f));
  EXPECT_EQ(row_ids(renorm, 0), (std::vector<int32_t>{1, 2}));
  EXPECT_FLOAT_EQ(renorm.weights[0], 0.5712880243470909f);   // 0.42986 / (0.42986 + 0.32258)
  EXPECT_FLOAT_EQ(renorm.weights[1], 0.42871197565290914f);  // 0.32258 / (0.42986 + 0.32258)
}

TEST(RouteRef, SoftcapRanksByRawLogitWhenCappedValuesTie) {
  // cap 1: tanh(40) and tanh(50) are both exactly 1.0 in double, so the capped probabilities tie;
  // the raw logit still ranks 50 (id 1) before 40 (id 0). Weights: e / (2e + 2) each, renorm 1/2.
  const float logits[] = {40, 50, 0, 0};
  const TopK out = route_ref(logits, 1, 4, 2, softmax_routing(true, 1.0f));
  EXPECT_EQ(row_ids(out, 0), (std::vector<int32_t>{1, 0}));
  EXPECT_FLOAT_EQ(out.weights[0], 0.5f);
  EXPECT_FLOAT_EQ(out.weights[1], 0.5f);
}

TEST(RouteRef, SoftmaxTiesGoToLowerId) {
  // logits [2, 5, 5, 2, 5], k 4: the three 5s in id order, then the lower of the two 2s.
  // Renormalised over {5, 5, 5, 2}: e^5 / (3 e^5 + e^2) = 1 / (3 + e^-3), e^-3 / (3 + e^-3).
  const float logits[] = {2, 5, 5, 2, 5};
  const TopK out = route_ref(logits, 1, 5, 4, softmax_routing(true));
  EXPECT_EQ(row_ids(out, 0), (std::vector<int32_t>{1, 2, 4, 0}));
  for (int j = 0; j < 3; ++j) EXPECT_FLOAT_EQ(out.weights[size_t(j)], 0.3278917437784153f);
  EXPECT_FLOAT_EQ(out.weights[3], 0.01632476866475409f);
}

TEST(RouteRef, SoftmaxNaNRanksLastAndWeighsZero) {
  const float logits[] = {
      kNaN, 1,    kNaN, 0,      // row 0: 1 (id 1), 0 (id 3), then NaNs by id: 0
      -kInf, kNaN, 0, -kInf,    // row 1: NaN ranks even below -inf
      kNaN, kNaN, kNaN, kNaN,   // row 2: all NaN -> lowest ids, weights 0 (not NaN)
      1, 2, 3, 4,               // row 3: clean
  };
  const TopK out = route_ref(logits, 4, 4, 3, softmax_routing(true));
  EXPECT_EQ(row_ids(out, 0), (std::vector<int32_t>{1, 3, 0}));
  EXPECT_FLOAT_EQ(out.weights[0], 0.7310585786300049f);  // e / (e + 1); the NaN counts 0
  EXPECT_FLOAT_EQ(out.weights[1], 0.2689414213699951f);  // 1 / (e + 1)
  EXPECT_EQ(out.weights[2], 0.0f);
  EXPECT_EQ(row_ids(out, 1), (std::vector<int32_t>{2, 0, 3}));
  EXPECT_EQ(out.weights[3], 1.0f);  // exp(0) / exp(0); exp(-inf) = 0
  EXPECT_EQ(out.weights[4], 0.0f);
  EXPECT_EQ(out.weights[5], 0.0f);
  EXPECT_EQ(row_ids(out, 2), (std::vector<int32_t>{0, 1, 2}));
  for (int j = 6; j < 9; ++j) EXPECT_EQ(out.weights[size_t(j)], 0.0f);
  EXPECT_EQ(row_ids(out, 3), (std::vector<int32_t>{3, 2, 1}));
  EXPECT_EQ(count_nan_tokens(logits, 4, 4), 3);
  EXPECT_EQ(count_nan_tokens(logits + 12, 1, 4), 0);
  EXPECT_EQ(count_nan_tokens(logits, 0, 4), 0);
}

TEST(RouteRef, SoftmaxInfinities) {
  // +inf logits share the whole mass; NaN still ranks last; all -inf has no mass at all.
  const float logits[] = {
      kInf, 0, kInf, kNaN,        // ids 0, 2 (the +inf pair), then 1
      -kInf, -kInf, -kInf, -kInf  // ids 0, 1, 2, weights 0
  };
  const TopK out = route_ref(logits, 2, 4, 3, softmax_routing(false));
  EXPECT_EQ(row_ids(out, 0), (std::vector<int32_t>{0, 2, 1}));
  EXPECT_EQ(out.weights[0], 0.5f);
  EXPECT_EQ(out.weights[1], 0.5f);
  EXPECT_EQ(out.weights[2], 0.0f);
  EXPECT_EQ(row_ids(out, 1), (std::vector<int32_t>{0, 1, 2}));
  for (int j = 3; j < 6; ++j) EXPECT_EQ(out.weights[size_t(j)], 0.0f);
  EXPECT_EQ(count_nan_tokens(logits, 2, 4), 1);
}

TEST(RouteRef, ScaleAppliesToBothScorings) {
  const float logits[] = {1, 3, 2, 0};
  const TopK soft = route_ref(logits, 1, 4, 2, softmax_routing(true, 0.0f, 2.5f));
  EXPECT_FLOAT_EQ(soft.weights[0], 2.5f * 0.7310585786300049f);
  EXPECT_FLOAT_EQ(soft.weights[1], 2.5f * 0.2689414213699951f);
  const TopK soft_raw = route_ref(logits, 1, 4, 2, softmax_routing(false, 0.0f, 2.5f));
  EXPECT_FLOAT_EQ(soft_raw.weights[0], 2.5f * 0.6439142598879724f);

  // Sigmoid, one group: s = [0.75, 0.25, 0.5, 0.2] -> ids 0, 2; renorm 0.75/1.25, 0.5/1.25.
  const float sig_logits[] = {logit_of(0.75), logit_of(0.25), 0.0f, logit_of(0.2)};
  const TopK sig = route_ref(sig_logits, 1, 4, 2, sigmoid_routing(1, 1, true, 2.5f));
  EXPECT_EQ(row_ids(sig, 0), (std::vector<int32_t>{0, 2}));
  EXPECT_NEAR(sig.weights[0], 2.5 * 0.6, 1e-6);
  EXPECT_NEAR(sig.weights[1], 2.5 * 0.4, 1e-6);
  const TopK sig_raw = route_ref(sig_logits, 1, 4, 2, sigmoid_routing(1, 1, false, 2.5f));
  EXPECT_NEAR(sig_raw.weights[0], 2.5 * 0.75, 1e-6);
  EXPECT_NEAR(sig_raw.weights[1], 2.5 * 0.5, 1e-6);
}

// ---------------------------------------------------------------------------------------------
// Sigmoid grouped top-k, by hand. E 8 in 4 groups {0,1} {2,3} {4,5} {6,7}, keep 2 groups, k 2.
// Unbiased scores s = [0.9, 0.1 | 0.6, 0.6 | 0.75, 0.2 | 0.5, 0.2].

const float kGroupedLogits[] = {logit_of(0.9), logit_of(0.1),  logit_of(0.6), logit_of(0.6),
                                logit_of(0.75), logit_of(0.2), 0.0f,          logit_of(0.2)};

TEST(RouteRef, SigmoidGroupedHandNoBias) {
  // Group scores (two best): 1.0, 1.2, 0.95, 0.7 -> keep groups 1, 0 -> candidates {0, 1, 2, 3}.
  // Best: id 0 (0.9), then ids 2 and 3 tie at 0.6 -> id 2. Id 4 (0.75) beats them but its group
  // lost: the group stage matters. Weights 0.9 / 1.5, 0.6 / 1.5.
  const TopK out = route_ref(kGroupedLogits, 1, 8, 2, sigmoid_routing(4, 2, true));
  EXPECT_EQ(row_ids(out, 0), (std::vector<int32_t>{0, 2}));
  EXPECT_NEAR(out.weights[0], 0.6, 1e-6);
  EXPECT_NEAR(out.weights[1], 0.4, 1e-6);
}

TEST(RouteRef, SigmoidGroupedHandBiasChangesChoiceWeightsStayUnbiased) {
  // bias [0, 0, 0.3, 0, 0.1, 0.1, 0, 0] -> b = [0.9, 0.1 | 0.9, 0.6 | 0.85, 0.3 | 0.5, 0.2].
  // Group scores 1.0, 1.5, 1.15, 0.7 -> keep groups 1, 2 -> candidates {2, 3, 4, 5}.
  // By b: id 2 (0.9), id 4 (0.85). Weights are the unbiased s: 0.6, 0.75, so slot 0 weighs less
  // than slot 1. Renormalised: 0.6 / 1.35 = 0.4444, 0.75 / 1.35 = 0.5556.
  const float bias[] = {0, 0, 0.3f, 0, 0.1f, 0.1f, 0, 0};
  const TopK out = route_ref(kGroupedLogits, 1, 8, 2, sigmoid_routing(4, 2, true), bias);
  EXPECT_EQ(row_ids(out, 0), (std::vector<int32_t>{2, 4}));
  EXPECT_NEAR(out.weights[0], 0.6 / 1.35, 1e-6);
  EXPECT_NEAR(out.weights[1], 0.75 / 1.35, 1e-6);

  const TopK raw = route_ref(kGroupedLogits, 1, 8, 2, sigmoid_routing(4, 2, false, 2.0f), bias);
  EXPECT_EQ(row_ids(raw, 0), (std::vector<int32_t>{2, 4}));
  EXPECT_NEAR(raw.weights[0], 2.0 * 0.6, 1e-6);
  EXPECT_NEAR(raw.weights[1], 2.0 * 0.75, 1e-6);
}

TEST(RouteRef, SigmoidGroupScoreUsesTwoBestNotMax) {
  // Groups {0,1} s = [0.9, 0.1] (max 0.9, sum 1.0) and {2,3} s = [0.6, 0.6] (sum 1.2); keep 1 group.
  // Ranking groups by their best expert would keep group 0; the sum of two keeps group 1.
  const float logits[] = {logit_of(0.9), logit_of(0.1), logit_of(0.6), logit_of(0.6)};
  const TopK out = route_ref(logits, 1, 4, 2, sigmoid_routing(2, 1, false));
  EXPECT_EQ(row_ids(out, 0), (std::vector<int32_t>{2, 3}));
  EXPECT_NEAR(out.weights[0], 0.6, 1e-6);
  EXPECT_NEAR(out.weights[1], 0.6, 1e-6);
}

TEST(RouteRef, SigmoidSingleExpertGroups) {
  // 4 groups of one expert: a group's score is its one b. s = [0.3, 0.9, 0.2, 0.8]; keep 3 groups
  // {1, 3, 0}; k 2 -> ids 1, 3.
  const float logits[] = {logit_of(0.3), logit_of(0.9), logit_of(0.2), logit_of(0.8)};
  const TopK out = route_ref(logits, 1, 4, 2, sigmoid_routing(4, 3, false));
  EXPECT_EQ(row_ids(out, 0), (std::vector<int32_t>{1, 3}));
  EXPECT_NEAR(out.weights[0], 0.9, 1e-6);
  EXPECT_NEAR(out.weights[1], 0.8, 1e-6);
}

TEST(RouteRef, SigmoidNaN) {
  const float logits[] = {
      // Row 0, groups {0,1} {2,3}, keep 1: group 0's two best are 0.9 and NaN, so its score is NaN
      // and it ranks after group 1 (0.25 + 0.2 = 0.45). Ids 2, 3; weights 0.25/0.45, 0.2/0.45.
      kNaN, logit_of(0.9), logit_of(0.25), logit_of(0.2),
      // Row 1, all NaN: group 0 kept (tie -> lower id), ids 0, 1, weights 0 (not NaN).
      kNaN, kNaN, kNaN, kNaN,
      // Row 2, used alone below.
      kNaN, 0.0f, 0.0f, 0.0f,
  };
  const TopK out = route_ref(logits, 2, 4, 2, sigmoid_routing(2, 1, true));
  EXPECT_EQ(row_ids(out, 0), (std::vector<int32_t>{2, 3}));
  EXPECT_NEAR(out.weights[0], 0.25 / 0.45, 1e-6);
  EXPECT_NEAR(out.weights[1], 0.2 / 0.45, 1e-6);
  EXPECT_EQ(row_ids(out, 1), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(out.weights[2], 0.0f);
  EXPECT_EQ(out.weights[3], 0.0f);

  // Row 2 with bias [0, -2, -1, -1], both groups kept, k 3: b = [NaN, -1.5, -0.5, -0.5]. Every
  // number, however low, ranks before the NaN: ids 2, 3 (tie -> lower id), 1; weights s = 0.5.
  const float bias[] = {0, -2, -1, -1};
  const TopK last = route_ref(logits + 8, 1, 4, 3, sigmoid_routing(2, 2, false), bias);
  EXPECT_EQ(row_ids(last, 0), (std::vector<int32_t>{2, 3, 1}));
  EXPECT_NEAR(last.weights[0], 0.5, 1e-6);
  EXPECT_NEAR(last.weights[2], 0.5, 1e-6);
  EXPECT_EQ(count_nan_tokens(logits, 3, 4), 3);
}

TEST(RouteRef, EmptyAndInvalid) {
  const TopK empty = route_ref(nullptr, 0, 8, 2, softmax_routing(true));
  EXPECT_EQ(empty.tokens, 0);
  EXPECT_EQ(empty.topk, 2);
  EXPECT_TRUE(empty.ids.empty());
  EXPECT_TRUE(empty.weights.empty());

  const float logits[8] = {};
  EXPECT_THROW(route_ref(logits, 1, 8, 0, softmax_routing(true)), Error);
  EXPECT_THROW(route_ref(logits, 1, 8, 9, softmax_routing(true)), Error);
  EXPECT_THROW(route_ref(logits, -1, 8, 2, softmax_routing(true)), Error);
  EXPECT_THROW(route_ref(nullptr, 1, 8, 2, softmax_routing(true)), Error);
  EXPECT_THROW(route_ref(logits, 1, 8, 2, sigmoid_routing(3, 1, true)), Error);  // 3 does not divide 8
  EXPECT_THROW(route_ref(logits, 1, 8, 2, sigmoid_routing(4, 5, true)), Error);  // topk_group > n_group
  EXPECT_THROW(route_ref(logits, 1, 8, 3, sigmoid_routing(4, 1, true)), Error);  // k > 2 kept experts
  EXPECT_THROW(route_ref(logits, 1, 8, 2, sigmoid_routing(2, 1, true, kInf)), Error);
}

// ---------------------------------------------------------------------------------------------
// Random inputs against an independent brute force.

// All indices, best first, by a full stable sort: larger key first, NaN last, equal keys keep
// index order.
std::vector<int32_t> full_ranking(const std::vector<double>& key) {
  std::vector<int32_t> order(key.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const double ka = key[size_t(a)], kb = key[size_t(b)];
    if (std::isnan(ka) || std::isnan(kb)) return !std::isnan(ka) && std::isnan(kb);
    return ka > kb;
  });
  return order;
}

// Random logits with the awkward cases mixed in: exact ties (coarse rounding), NaN and -inf.
std::vector<float> random_logits(Rng& rng, int64_t tokens, int64_t experts) {
  std::vector<float> logits(size_t(tokens * experts));
  for (int64_t t = 0; t < tokens; ++t) {
    const bool coarse = rng.below(4) == 0;  // a quarter of the rows are full of ties
    const bool special = rng.below(8) == 0;
    for (int64_t e = 0; e < experts; ++e) {
      double l = 3.0 * rng.normal();
      if (coarse) l = std::round(l * 2.0) / 2.0;
      float& out = logits[size_t(t * experts + e)];
      out = float(l);
      if (special && rng.below(6) == 0) out = rng.below(2) ? kNaN : -kInf;
    }
  }
  return logits;
}

void check_weights(const TopK& out, int64_t t, const std::vector<double>& unnormalised, const Routing& routing) {
  double sum = 0;
  for (double w : unnormalised) sum += w;
  const double divisor = routing.renormalize && sum > 0 ? sum : 1.0;
  double got_sum = 0;
  for (int64_t j = 0; j < out.topk; ++j) {
    const float w = out.weights[size_t(t * out.topk + j)];
    ASSERT_FALSE(std::isnan(w)) << "token " << t << " slot " << j;
    const double expected = unnormalised[size_t(j)] / divisor * routing.scale;
    EXPECT_NEAR(w, expected, 1e-6 * std::abs(routing.scale)) << "token " << t << " slot " << j;
    got_sum += w;
  }
  if (routing.renormalize && sum > 0) {
    EXPECT_NEAR(got_sum, routing.scale, 1e-6 * std::abs(routing.scale)) << "token " << t;
  }
}

void check_distinct_in_range(const TopK& out, int64_t t, int64_t experts) {
  std::set<int32_t> seen;
  for (int32_t id : row_ids(out, t)) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, experts);
    seen.insert(id);
  }
  EXPECT_EQ(int64_t(seen.size()), out.topk) << "token " << t << ": repeated expert";
}

TEST(RouteRefRandom, SoftmaxMatchesBruteForce) {
  LOOM_FRESH_SEED();
  Rng rng(seed);
  const int64_t expert_choices[] = {1, 2, 7, 16, 64, 160, 512};
  for (int trial = 0; trial < 24; ++trial) {
    const int64_t experts = expert_choices[rng.below(std::size(expert_choices))];
    const int64_t topk = 1 + int64_t(rng.below(uint64_t(std::min<int64_t>(experts, 16))));
    const int64_t tokens = 1 + int64_t(rng.below(300));
    const Routing routing = softmax_routing(rng.below(2) == 0, rng.below(2) ? float(rng.uniform(0.5, 8.0)) : 0.0f,
                                            rng.below(3) ? float(rng.uniform(0.1, 4.0)) : 1.0f);
    SCOPED_TRACE(testing::Message() << "E=" << experts << " k=" << topk << " T=" << tokens << " "
                                    << describe(routing));
    const std::vector<float> logits = random_logits(rng, tokens, experts);
    const TopK out = route_ref(logits.data(), tokens, experts, topk, routing);
    ASSERT_EQ(out.ids.size(), size_t(tokens * topk));
    ASSERT_EQ(out.weights.size(), size_t(tokens * topk));

    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<double> raw(static_cast<size_t>(experts)), capped(static_cast<size_t>(experts));
      for (int64_t e = 0; e < experts; ++e) {
        raw[size_t(e)] = logits[size_t(t * experts + e)];
        capped[size_t(e)] = routing.softcap > 0 ? routing.softcap * std::tanh(raw[size_t(e)] / routing.softcap)
                                                : raw[size_t(e)];
      }
      const std::vector<int32_t> ranking = full_ranking(raw);
      check_distinct_in_range(out, t, experts);
      ASSERT_EQ(row_ids(out, t), std::vector<int32_t>(ranking.begin(), ranking.begin() + topk)) << "token " << t;

      // p_e = 1 / sum_j exp(c_j - c_e): a different route to the softmax than max-shifting.
      std::vector<double> probability(static_cast<size_t>(topk));
      for (int64_t j = 0; j < topk; ++j) {
        const double c = capped[size_t(ranking[size_t(j)])];
        if (std::isnan(c) || c == -std::numeric_limits<double>::infinity()) continue;  // stays 0
        double inverse = 0;
        for (double other : capped)
          if (!std::isnan(other)) inverse += std::exp(other - c);
        probability[size_t(j)] = 1.0 / inverse;
      }
      check_weights(out, t, probability, routing);
      // Monotone capping keeps the weights in slot order (scale is positive here).
      for (int64_t j = 1; j < topk; ++j)
        EXPECT_GE(out.weights[size_t(t * topk + j - 1)], out.weights[size_t(t * topk + j)]) << "token " << t;
      if (HasFailure()) return;
    }
  }
}

TEST(RouteRefRandom, SigmoidGroupedMatchesBruteForce) {
  LOOM_FRESH_SEED();
  Rng rng(seed);
  const int64_t expert_choices[] = {1, 4, 8, 12, 64, 160, 256, 512};
  for (int trial = 0; trial < 24; ++trial) {
    const int64_t experts = expert_choices[rng.below(std::size(expert_choices))];
    std::vector<int> divisors;
    for (int d = 1; d <= experts && d <= 64; ++d)
      if (experts % d == 0) divisors.push_back(d);
    const int n_group = divisors[rng.below(divisors.size())];
    const int topk_group = 1 + int(rng.below(uint64_t(n_group)));
    const int64_t kept_experts = int64_t(topk_group) * (experts / n_group);
    const int64_t topk = 1 + int64_t(rng.below(uint64_t(std::min<int64_t>(kept_experts, 16))));
    const int64_t tokens = 1 + int64_t(rng.below(300));
    const Routing routing = sigmoid_routing(n_group, topk_group, rng.below(2) == 0,
                                            rng.below(3) ? float(rng.uniform(0.1, 4.0)) : 1.0f);
    std::vector<float> bias;
    if (rng.below(3)) {
      bias.resize(size_t(experts));
      for (float& b : bias) b = float(0.2 * rng.normal());
    }
    SCOPED_TRACE(testing::Message() << "E=" << experts << " k=" << topk << " T=" << tokens << " bias="
                                    << !bias.empty() << " " << describe(routing));
    const std::vector<float> logits = random_logits(rng, tokens, experts);
    const TopK out = route_ref(logits.data(), tokens, experts, topk, routing, bias.empty() ? nullptr : bias.data());
    ASSERT_EQ(out.ids.size(), size_t(tokens * topk));

    const int64_t group_size = experts / n_group;
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<double> score(static_cast<size_t>(experts)), biased(static_cast<size_t>(experts));
      for (int64_t e = 0; e < experts; ++e) {
        const double l = logits[size_t(t * experts + e)];
        score[size_t(e)] = std::isnan(l) ? 0.0 : 1.0 / (1.0 + std::exp(-l));
        biased[size_t(e)] = std::isnan(l) ? l : score[size_t(e)] + (bias.empty() ? 0.0 : double(bias[size_t(e)]));
      }
      // Groups: sum of the two best members (ranked by a full sort of the group), then a full
      // sort of the groups.
      std::vector<double> group_score(static_cast<size_t>(n_group));
      for (int64_t g = 0; g < n_group; ++g) {
        const std::vector<double> members(biased.begin() + g * group_size, biased.begin() + (g + 1) * group_size);
        const std::vector<int32_t> order = full_ranking(members);
        group_score[size_t(g)] = members[size_t(order[0])] + (group_size > 1 ? members[size_t(order[1])] : 0.0);
      }
      const std::vector<int32_t> group_order = full_ranking(group_score);
      std::vector<bool> group_kept(size_t(n_group), false);
      for (int i = 0; i < topk_group; ++i) group_kept[size_t(group_order[size_t(i)])] = true;

      std::vector<int32_t> expected;
      for (int32_t e : full_ranking(biased))
        if (group_kept[size_t(e / group_size)] && int64_t(expected.size()) < topk) expected.push_back(e);

      check_distinct_in_range(out, t, experts);
      const std::vector<int32_t> got = row_ids(out, t);
      for (int32_t e : got) {
        if (e >= 0 && e < experts) {
          EXPECT_TRUE(group_kept[size_t(e / group_size)]) << "token " << t << " expert " << e << " in a dropped group";
        }
      }
      ASSERT_EQ(got, expected) << "token " << t;

      std::vector<double> unbiased(static_cast<size_t>(topk));
      for (int64_t j = 0; j < topk; ++j) unbiased[size_t(j)] = score[size_t(expected[size_t(j)])];
      check_weights(out, t, unbiased, routing);
      if (HasFailure()) return;
    }
  }
}

}  // namespace
}  // namespace loom
