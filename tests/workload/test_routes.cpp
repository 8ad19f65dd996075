// Routes of every distribution: validity, exact and statistical per-expert counts, determinism,
// replay files and their errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "route/route_ref.hpp"
#include "test_seed.hpp"
#include "workload/workload.hpp"
#include "workload_test_util.hpp"

namespace loom {
namespace {

using test::error_of;
using test::greedy_counts;
using test::json_array;
using test::route_shape;
using test::TempFile;

int64_t hot_routes(double p, int64_t T) { return std::llround(p * double(T)); }

// Whether hot:P is realisable, worked out from first principles: the hot expert takes h routes,
// the other E-1 share the rest as evenly as possible, and no expert may exceed T.
bool hot_feasible(double p, int64_t T, int64_t k, int64_t E) {
  const int64_t rest = T * k - hot_routes(p, T);
  if (E == 1) return rest == 0;
  return (rest + E - 2) / (E - 1) <= T;
}

void expect_valid_topk(const TopK& tk, int64_t T, int64_t E, int64_t k) {
  ASSERT_EQ(tk.tokens, T);
  ASSERT_EQ(tk.topk, k);
  ASSERT_EQ(int64_t(tk.ids.size()), T * k);
  ASSERT_EQ(int64_t(tk.weights.size()), T * k);
  for (int64_t t = 0; t < T; ++t) {
    std::set<int32_t> seen;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t id = tk.ids[size_t(t * k + j)];
      ASSERT_GE(id, 0) << "token " << t;
      ASSERT_LT(id, E) << "token " << t;
      seen.insert(id);
    }
    ASSERT_EQ(int64_t(seen.size()), k) << "token " << t << " repeats an expert";
  }
}

// Counts computed here, not by expert_counts, so the tests do not trust the code under test.
std::vector<int32_t> count_ids(const TopK& tk, int64_t E) {
  std::vector<int32_t> c(static_cast<size_t>(E), 0);
  for (const int32_t id : tk.ids) {
    if (id < 0 || id >= E) {
      ADD_FAILURE() << "expert id " << id << " out of range";
      continue;
    }
    ++c[size_t(id)];
  }
  return c;
}

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Each token routes to k distinct in-range experts under every distribution, across shapes with
// k = E, k = 1, E = 1 and k > 8; hot:P throws exactly when it cannot be realised.
TEST(WorkloadRoutes, EveryTokenHasKDistinctExperts) {
  LOOM_FRESH_SEED();
  struct Dims {
    int64_t T, E, k;
  };
  const std::vector<Dims> dims = {{128, 256, 8}, {37, 5, 5}, {50, 1, 1}, {33, 7, 1}, {4, 300, 16}, {200, 16, 8}};
  for (const Dims& d : dims) {
    const Shape shape = route_shape(d.T, d.E, d.k);
    TempFile replay("valid", json_array(greedy_counts(d.T, d.k, d.E, seed)));
    const std::vector<std::string> specs = {"random", "balanced", "zipf:0",   "zipf:1.2",    "zipf:8",
                                            "hot:1",  "hot:0.3",  "hot:0.95", "concentrated", "replay:" + replay.path()};
    for (const std::string& spec : specs) {
      SCOPED_TRACE(describe(shape) + " " + spec);
      const Distribution dist = parse_distribution(spec);
      if (dist.kind == DistKind::hot && !hot_feasible(dist.param, d.T, d.k, d.E)) {
        const std::string msg = error_of([&] { make_routes(shape, Routing{}, dist, seed); });
        EXPECT_NE(msg.find("cannot be realised"), std::string::npos) << msg;
        continue;
      }
      const Routes r = make_routes(shape, Routing{}, dist, seed);
      expect_valid_topk(r.topk, d.T, d.E, d.k);
    }
  }
}

// Sigmoid scoring with groups goes through route_ref with a small random expert bias.
TEST(WorkloadRoutes, RandomSigmoidHasBiasAndValidRoutes) {
  LOOM_FRESH_SEED();
  const Shape shape = route_shape(96, 64, 6);
  Routing routing;
  routing.scoring = Scoring::sigmoid;
  routing.n_group = 8;
  routing.topk_group = 4;
  const Routes r = make_routes(shape, routing, parse_distribution("random"), seed);
  expect_valid_topk(r.topk, 96, 64, 6);
  ASSERT_EQ(r.expert_bias.size(), 64u);
  // Drawn as N(0, 0.1): all within 6 sigma, not all equal.
  for (const float b : r.expert_bias) EXPECT_LT(std::fabs(b), 0.6f);
  EXPECT_NE(*std::min_element(r.expert_bias.begin(), r.expert_bias.end()),
            *std::max_element(r.expert_bias.begin(), r.expert_bias.end()));
  const TopK again = route_ref(r.logits.data(), 96, 64, 6, routing, r.expert_bias.data());
  EXPECT_EQ(again.ids, r.topk.ids);
  EXPECT_TRUE(same_bytes(again.weights, r.topk.weights));
}

// random: logits are N(0, 1) and the routes are exactly route_ref of them; no target counts.
TEST(WorkloadRoutes, RandomIsRouteRefOfNormalLogits) {
  LOOM_FRESH_SEED();
  const Shape shape = route_shape(128, 256, 8);
  const Routing routing;
  const Routes r = make_routes(shape, routing, parse_distribution("random"), seed);
  ASSERT_EQ(r.logits.size(), size_t(128 * 256));
  EXPECT_TRUE(r.expert_bias.empty());
  EXPECT_TRUE(r.target_counts.empty());
  double sum = 0, sq = 0;
  for (const float x : r.logits) {
    ASSERT_TRUE(std::isfinite(x));
    sum += x;
    sq += double(x) * x;
  }
  // n = 32768 draws: the mean's sd is 1/sqrt(n) = 0.0055 and the variance's about sqrt(2/n) = 0.0078;
  // the bounds are 5 and 6 of those.
  const double n = double(r.logits.size()), mean = sum / n, var = sq / n - mean * mean;
  EXPECT_LT(std::fabs(mean), 0.028);
  EXPECT_LT(std::fabs(var - 1.0), 0.047);
  const TopK again = route_ref(r.logits.data(), 128, 256, 8, routing);
  EXPECT_EQ(again.ids, r.topk.ids);
  EXPECT_TRUE(same_bytes(again.weights, r.topk.weights));
}

// route_from_logits (bench --dist-logits): logits whose routing picks, per token, the same experts
// the distribution emitted, the top-k then being route_ref's of those logits (also under a tiny
// soft-cap, which changes the weights, not the ranking); random routes keep their logits; sigmoid
// scoring is rejected.
TEST(WorkloadRoutes, LogitsThatRouteToTheDistributionsIds) {
  LOOM_FRESH_SEED();
  const Shape shape = route_shape(96, 64, 6);
  for (const char* spec : {"balanced", "zipf:1.2", "hot:0.9", "concentrated"}) {
    SCOPED_TRACE(spec);
    const Routes ids = make_routes(shape, Routing{}, parse_distribution(spec), seed);
    Routes r = ids;
    route_from_logits(shape, Routing{}, seed, r);
    ASSERT_EQ(r.logits.size(), size_t(96 * 64));
    const TopK again = route_ref(r.logits.data(), 96, 64, 6, Routing{});
    EXPECT_EQ(again.ids, r.topk.ids);
    EXPECT_TRUE(same_bytes(again.weights, r.topk.weights));
    for (int64_t t = 0; t < 96; ++t) {
      std::vector<int32_t> a(ids.topk.ids.begin() + t * 6, ids.topk.ids.begin() + (t + 1) * 6);
      std::vector<int32_t> b(r.topk.ids.begin() + t * 6, r.topk.ids.begin() + (t + 1) * 6);
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      ASSERT_EQ(a, b) << "token " << t;
    }
    EXPECT_EQ(expert_counts(r.topk, 64), expert_counts(ids.topk, 64));
  }
  Routes random = make_routes(shape, Routing{}, parse_distribution("random"), seed);
  const Routes before = random;
  route_from_logits(shape, Routing{}, seed, random);
  EXPECT_EQ(random.topk.ids, before.topk.ids);
  EXPECT_TRUE(same_bytes(random.logits, before.logits));
  Routing sigmoid;
  sigmoid.scoring = Scoring::sigmoid;
  Routes zipf = make_routes(shape, Routing{}, parse_distribution("zipf:1.2"), seed);
  EXPECT_THROW(route_from_logits(shape, sigmoid, seed, zipf), Error);
  Routing capped;
  capped.softcap = 0.01f;
  Routes zipf_capped = zipf;
  route_from_logits(shape, capped, seed, zipf_capped);
  EXPECT_EQ(expert_counts(zipf_capped.topk, 64), expert_counts(zipf.topk, 64));
}

// Same seed, same bytes for every distribution; another seed, other routes.
TEST(WorkloadRoutes, DeterministicPerSeed) {
  LOOM_FRESH_SEED();
  const Shape shape = route_shape(128, 256, 8);
  TempFile replay("det", json_array(greedy_counts(128, 8, 256, seed)));
  Routing sigmoid;
  sigmoid.scoring = Scoring::sigmoid;
  struct Case {
    std::string spec;
    Routing routing;
  };
  const std::vector<Case> cases = {{"random", Routing{}}, {"random", sigmoid},      {"balanced", Routing{}},
                                   {"zipf:1.2", Routing{}}, {"hot:0.9", Routing{}}, {"concentrated", Routing{}},
                                   {"replay:" + replay.path(), Routing{}}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec + " " + describe(c.routing));
    const Distribution dist = parse_distribution(c.spec);
    const Routes a = make_routes(shape, c.routing, dist, seed);
    const Routes b = make_routes(shape, c.routing, dist, seed);
    EXPECT_EQ(a.topk.ids, b.topk.ids);
    EXPECT_TRUE(same_bytes(a.topk.weights, b.topk.weights));
    EXPECT_TRUE(same_bytes(a.logits, b.logits));
    EXPECT_TRUE(same_bytes(a.expert_bias, b.expert_bias));
    EXPECT_EQ(a.target_counts, b.target_counts);
    const Routes other = make_routes(shape, c.routing, dist, seed + 1);
    EXPECT_NE(a.topk.ids, other.topk.ids);
    EXPECT_FALSE(same_bytes(a.topk.weights, other.topk.weights));
  }
}

// Distributions drawn token by token (random, zipf) give the first T' tokens of a T-token batch
// when asked for T' tokens: per-token streams, so neither batch size nor thread chunking matters.
TEST(WorkloadRoutes, PerTokenDistributionsArePrefixStable) {
  LOOM_FRESH_SEED();
  for (const std::string spec : {"random", "zipf:1.2"}) {
    SCOPED_TRACE(spec);
    const Distribution dist = parse_distribution(spec);
    const Routes big = make_routes(route_shape(300, 64, 4), Routing{}, dist, seed);
    const Routes small = make_routes(route_shape(17, 64, 4), Routing{}, dist, seed);
    ASSERT_EQ(small.topk.ids.size(), 17u * 4);
    EXPECT_TRUE(std::equal(small.topk.ids.begin(), small.topk.ids.end(), big.topk.ids.begin()));
    EXPECT_EQ(std::memcmp(small.topk.weights.data(), big.topk.weights.data(), small.topk.weights.size() * 4), 0);
    EXPECT_TRUE(std::equal(small.logits.begin(), small.logits.end(), big.logits.begin()));
  }
}

// Weights are positive and sum to routing.scale on every token, whatever the distribution.
TEST(WorkloadRoutes, WeightsArePositiveAndSumToScale) {
  LOOM_FRESH_SEED();
  const Shape shape = route_shape(64, 32, 6);
  TempFile replay("weights", json_array(greedy_counts(64, 6, 32, seed)));
  for (const float scale : {1.0f, 2.5f}) {
    Routing routing;
    routing.scale = scale;
    for (const std::string& spec :
         {std::string("random"), std::string("balanced"), std::string("zipf:1.2"), std::string("hot:0.5"),
          std::string("concentrated"), "replay:" + replay.path()}) {
      SCOPED_TRACE(spec + " scale " + std::to_string(scale));
      const Routes r = make_routes(shape, routing, parse_distribution(spec), seed);
      for (int64_t t = 0; t < 64; ++t) {
        double sum = 0;
        for (int64_t j = 0; j < 6; ++j) {
          const float w = r.topk.weights[size_t(t * 6 + j)];
          ASSERT_GT(w, 0.0f) << "token " << t;
          sum += w;
        }
        ASSERT_NEAR(sum, scale, 1e-5 * scale) << "token " << t;
      }
    }
  }
}

// balanced: counts differ by at most 1 and sum to T*k; realised equals target.
TEST(WorkloadRoutes, BalancedCountsDifferByAtMostOne) {
  LOOM_FRESH_SEED();
  struct Dims {
    int64_t T, E, k;
  };
  for (const Dims& d : std::vector<Dims>{{128, 256, 8}, {100, 7, 3}, {5, 256, 8}, {1, 3, 3}, {1000, 16, 8}}) {
    SCOPED_TRACE("T=" + std::to_string(d.T) + " E=" + std::to_string(d.E) + " k=" + std::to_string(d.k));
    const Routes r = make_routes(route_shape(d.T, d.E, d.k), Routing{}, parse_distribution("balanced"), seed);
    const std::vector<int32_t> c = count_ids(r.topk, d.E);
    EXPECT_EQ(c, r.target_counts);
    EXPECT_LE(*std::max_element(c.begin(), c.end()) - *std::min_element(c.begin(), c.end()), 1);
    EXPECT_EQ(std::accumulate(c.begin(), c.end(), int64_t(0)), d.T * d.k);
  }
}

// hot:P: one expert has exactly round(P*T) routes, the others differ by at most 1.
TEST(WorkloadRoutes, HotExpertGetsExactlyRoundPT) {
  LOOM_FRESH_SEED();
  struct Case {
    int64_t T, E, k;
    double p;
  };
  const std::vector<Case> cases = {{128, 256, 8, 0.9}, {128, 256, 8, 1.0}, {128, 256, 8, 0.0}, {1000, 16, 8, 0.33},
                                   {7, 4, 2, 0.5},      {128, 8, 8, 1.0},   {64, 2, 1, 0.25}};
  for (const Case& c : cases) {
    SCOPED_TRACE("T=" + std::to_string(c.T) + " E=" + std::to_string(c.E) + " k=" + std::to_string(c.k) +
                 " P=" + std::to_string(c.p));
    Distribution dist;
    dist.kind = DistKind::hot;
    dist.param = c.p;
    const Routes r = make_routes(route_shape(c.T, c.E, c.k), Routing{}, dist, seed);
    const std::vector<int32_t> counts = count_ids(r.topk, c.E);
    EXPECT_EQ(counts, r.target_counts);
    const int64_t h = hot_routes(c.p, c.T);
    // Some expert with h routes must leave the others within 1 of each other.
    bool found = false;
    for (int64_t hot = 0; hot < c.E && !found; ++hot) {
      if (counts[size_t(hot)] != h) continue;
      int32_t lo = INT32_MAX, hi = INT32_MIN;
      for (int64_t e = 0; e < c.E; ++e) {
        if (e == hot) continue;
        lo = std::min(lo, counts[size_t(e)]);
        hi = std::max(hi, counts[size_t(e)]);
      }
      found = c.E == 1 || hi - lo <= 1;
    }
    EXPECT_TRUE(found) << "no expert with " << h << " routes and an even rest";
    EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), int64_t(0)), c.T * c.k);
  }
}

// Impossible hot requests throw a one-line Error that says why.
TEST(WorkloadRoutes, HotRejectsImpossibleRequests) {
  LOOM_FRESH_SEED();
  struct Case {
    int64_t T, E, k;
    std::string spec;
  };
  // With k < E the rest always fits (it is at most T*(E-1)); with k = E (E = 1 included) every
  // expert takes every token, so round(P*T) must be T.
  const std::vector<Case> cases = {{128, 8, 8, "hot:0.5"}, {128, 1, 1, "hot:0.5"}, {10, 2, 2, "hot:0.5"},
                                   {128, 8, 8, "hot:0.99"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec + " T=" + std::to_string(c.T) + " E=" + std::to_string(c.E));
    ASSERT_FALSE(hot_feasible(parse_distribution(c.spec).param, c.T, c.k, c.E));
    const std::string msg =
        error_of([&] { make_routes(route_shape(c.T, c.E, c.k), Routing{}, parse_distribution(c.spec), seed); });
    EXPECT_NE(msg.find(c.spec + " cannot be realised"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos);
  }
  // A parameter out of range that bypassed the parser is caught too.
  Distribution bad;
  bad.kind = DistKind::hot;
  bad.param = 1.5;
  EXPECT_FALSE(error_of([&] { make_routes(route_shape(8, 4, 2), Routing{}, bad, seed); }).empty());
}

// concentrated: the same k experts on every token, T routes each, none elsewhere.
TEST(WorkloadRoutes, ConcentratedUsesTheSameKExperts) {
  LOOM_FRESH_SEED();
  const Routes r = make_routes(route_shape(128, 256, 8), Routing{}, parse_distribution("concentrated"), seed);
  const std::vector<int32_t> c = count_ids(r.topk, 256);
  EXPECT_EQ(c, r.target_counts);
  EXPECT_EQ(std::count(c.begin(), c.end(), 128), 8);
  EXPECT_EQ(std::count(c.begin(), c.end(), 0), 256 - 8);
  std::vector<int32_t> first(r.topk.ids.begin(), r.topk.ids.begin() + 8);
  std::sort(first.begin(), first.end());
  for (int64_t t = 1; t < 128; ++t) {
    std::vector<int32_t> row(r.topk.ids.begin() + t * 8, r.topk.ids.begin() + t * 8 + 8);
    std::sort(row.begin(), row.end());
    ASSERT_EQ(row, first) << "token " << t;
  }
}

// Exact inclusion probabilities of k successive draws without replacement, P ~ (e+1)^-S,
// by enumerating every ordered draw sequence.
void enumerate_inclusion(const std::vector<double>& w, std::vector<bool>& used, int64_t left, double prob,
                         std::vector<double>& incl) {
  if (left == 0) return;
  double total = 0;
  for (size_t e = 0; e < w.size(); ++e)
    if (!used[e]) total += w[e];
  for (size_t e = 0; e < w.size(); ++e) {
    if (used[e]) continue;
    const double p = prob * w[e] / total;
    incl[e] += p;
    used[e] = true;
    enumerate_inclusion(w, used, left - 1, p, incl);
    used[e] = false;
  }
}

std::vector<double> exact_inclusion(int64_t E, int64_t k, double s) {
  std::vector<double> w(static_cast<size_t>(E)), incl(size_t(E), 0.0);
  for (int64_t e = 0; e < E; ++e) w[size_t(e)] = std::pow(double(e + 1), -s);
  std::vector<bool> used(static_cast<size_t>(E), false);
  enumerate_inclusion(w, used, k, 1.0, incl);
  return incl;
}

// zipf_inclusion agrees with the exact inclusion probabilities of sampling without replacement
// (small E, by enumeration), sums to k, and is 1 for every expert when k = E.
// Tolerance: 5 standard deviations of a mean of `samples` Bernoulli draws.
TEST(WorkloadZipf, InclusionMatchesExactEnumeration) {
  LOOM_FRESH_SEED();
  struct Case {
    int64_t E, k;
    double s;
  };
  const int64_t samples = 200000;
  for (const Case& c : std::vector<Case>{{5, 2, 1.2}, {6, 3, 2.0}, {7, 1, 0.7}, {4, 3, 0.0}}) {
    SCOPED_TRACE("E=" + std::to_string(c.E) + " k=" + std::to_string(c.k) + " S=" + std::to_string(c.s));
    const std::vector<double> exact = exact_inclusion(c.E, c.k, c.s);
    const std::vector<double> mc = zipf_inclusion(c.E, c.k, c.s, seed, samples);
    ASSERT_EQ(int64_t(mc.size()), c.E);
    EXPECT_NEAR(std::accumulate(mc.begin(), mc.end(), 0.0), double(c.k), 1e-9);
    for (int64_t e = 0; e < c.E; ++e) {
      const double p = exact[size_t(e)];
      EXPECT_NEAR(mc[size_t(e)], p, 5 * std::sqrt(p * (1 - p) / double(samples)) + 1e-12) << "expert " << e;
    }
  }
  for (const double v : zipf_inclusion(6, 6, 1.5, seed, 100)) EXPECT_EQ(v, 1.0);
  // Same seed, same estimate.
  EXPECT_EQ(zipf_inclusion(16, 4, 1.2, seed, 5000), zipf_inclusion(16, 4, 1.2, seed, 5000));
}

// make_routes' zipf tokens follow the same law: realised counts over T=20000 tokens against the
// exact inclusion probabilities, within 5 binomial standard deviations.
TEST(WorkloadZipf, RoutesMatchExactInclusionSmallE) {
  LOOM_FRESH_SEED();
  const int64_t T = 20000, E = 6, k = 3;
  const double s = 1.5;
  const Routes r = make_routes(route_shape(T, E, k), Routing{}, parse_distribution("zipf:1.5"), seed);
  EXPECT_TRUE(r.target_counts.empty());
  const std::vector<double> exact = exact_inclusion(E, k, s);
  const std::vector<int32_t> c = count_ids(r.topk, E);
  for (int64_t e = 0; e < E; ++e) {
    const double p = exact[size_t(e)];
    EXPECT_NEAR(double(c[size_t(e)]), T * p, 5 * std::sqrt(T * p * (1 - p)) + 1) << "expert " << e;
  }
}

// At scale: T=4096, E=256, k=8, S=1.2. Each expert's count is Binomial(T, p_e) (tokens are
// independent); p_e is estimated by zipf_inclusion with its own seed and 100000 samples, whose
// error adds T^2 p(1-p)/samples to the variance. Tolerance: 6 standard deviations of the sum, + 3:
// the tail experts' counts (means ~18) are skewed to the right, and with 256 experts per run and a
// fresh seed each run, 5 deviations failed by chance (seed 1032919894621549891: expert 203 counted
// 41 against 18.4 from 400000 samples, 5.3 deviations; the next seeds' largest were 2.7 and 2.8).
// Expert 0 (rank 1) must be the most frequent: its inclusion leads expert 1's by far more than that.
TEST(WorkloadZipf, RoutesMatchInclusionAtScale) {
  LOOM_FRESH_SEED();
  const int64_t T = 4096, E = 256, k = 8, samples = 100000;
  const Routes r = make_routes(route_shape(T, E, k), Routing{}, parse_distribution("zipf:1.2"), seed);
  const std::vector<double> p = zipf_inclusion(E, k, 1.2, seed ^ 0x5eed5eed5eedull, samples);
  const std::vector<int32_t> c = count_ids(r.topk, E);
  for (int64_t e = 0; e < E; ++e) {
    const double pe = p[size_t(e)];
    const double var = T * pe * (1 - pe) + double(T) * T * pe * (1 - pe) / double(samples);
    EXPECT_NEAR(double(c[size_t(e)]), T * pe, 6 * std::sqrt(var) + 3) << "expert " << e;
  }
  EXPECT_EQ(std::max_element(c.begin(), c.end()) - c.begin(), 0);
  // Rank order of inclusion: decreasing in e (up to Monte-Carlo noise at the flat tail).
  EXPECT_GT(p[0], p[1]);
  EXPECT_GT(p[1], p[10]);
  EXPECT_GT(p[10], p[200]);
}

TEST(WorkloadZipf, RejectsBadArguments) {
  EXPECT_FALSE(error_of([] { zipf_inclusion(0, 1, 1.0, 1, 10); }).empty());
  EXPECT_FALSE(error_of([] { zipf_inclusion(4, 5, 1.0, 1, 10); }).empty());
  EXPECT_FALSE(error_of([] { zipf_inclusion(4, 0, 1.0, 1, 10); }).empty());
  EXPECT_FALSE(error_of([] { zipf_inclusion(4, 2, -1.0, 1, 10); }).empty());
  EXPECT_FALSE(error_of([] { zipf_inclusion(4, 2, 1.0, 1, 0); }).empty());
}

// expert_counts counts every in-range id and ignores out-of-range ones (as dispatch drops them).
TEST(WorkloadRoutes, ExpertCountsCountsIds) {
  TopK tk;
  tk.tokens = 3;
  tk.topk = 2;
  tk.ids = {0, 2, 2, 1, -1, 9};
  tk.weights.assign(6, 0.5f);
  EXPECT_EQ(expert_counts(tk, 3), (std::vector<int32_t>{1, 1, 2}));
  EXPECT_EQ(expert_counts(TopK{}, 4), (std::vector<int32_t>{0, 0, 0, 0}));
}

// T = 0 is valid for every distribution: empty routes, zero counts.
TEST(WorkloadRoutes, ZeroTokens) {
  LOOM_FRESH_SEED();
  const Shape shape = route_shape(0, 8, 2);
  TempFile replay("zero", "{\"counts\": [0, 0, 0, 0, 0, 0, 0, 0]}");
  Routing sigmoid;
  sigmoid.scoring = Scoring::sigmoid;
  for (const std::string& spec : {std::string("random"), std::string("balanced"), std::string("zipf:1.2"),
                                 std::string("hot:0.9"), std::string("concentrated"), "replay:" + replay.path()}) {
    for (const Routing& routing : {Routing{}, sigmoid}) {
      SCOPED_TRACE(spec + " " + describe(routing));
      const Routes r = make_routes(shape, routing, parse_distribution(spec), seed);
      EXPECT_EQ(r.topk.tokens, 0);
      EXPECT_EQ(r.topk.topk, 2);
      EXPECT_TRUE(r.topk.ids.empty());
      EXPECT_TRUE(r.topk.weights.empty());
      EXPECT_TRUE(r.logits.empty());
      EXPECT_EQ(expert_counts(r.topk, 8), std::vector<int32_t>(8, 0));
      const bool targeted = spec != "random" && spec != "zipf:1.2";
      EXPECT_EQ(r.target_counts, targeted ? std::vector<int32_t>(8, 0) : std::vector<int32_t>{});
    }
  }
}

// replay: both file forms are read, and the routes realise the file's counts exactly.
TEST(ReplayFile, RoutesRealiseTheFileCounts) {
  LOOM_FRESH_SEED();
  struct Dims {
    int64_t T, E, k;
  };
  for (const Dims& d : std::vector<Dims>{{128, 256, 8}, {64, 8, 8}, {300, 10, 3}, {1, 4, 2}}) {
    SCOPED_TRACE("T=" + std::to_string(d.T) + " E=" + std::to_string(d.E) + " k=" + std::to_string(d.k));
    const std::vector<int32_t> counts = greedy_counts(d.T, d.k, d.E, seed);
    TempFile object("object", "{\"note\": \"extra members are ignored\", \"counts\": " + json_array(counts) + "}");
    TempFile bare("bare", json_array(counts));
    EXPECT_EQ(read_replay_counts(object.path(), d.T, d.k, d.E), counts);
    EXPECT_EQ(read_replay_counts(bare.path(), d.T, d.k, d.E), counts);
    const Routes r = make_routes(route_shape(d.T, d.E, d.k), Routing{}, parse_distribution("replay:" + object.path()), seed);
    expect_valid_topk(r.topk, d.T, d.E, d.k);
    EXPECT_EQ(count_ids(r.topk, d.E), counts);
    EXPECT_EQ(r.target_counts, counts);
  }
}

// The example in docs/ is a valid replay file for qwen35-single.
TEST(ReplayFile, DocsExampleFitsQwen35Single) {
  LOOM_FRESH_SEED();
  const Preset& p = find_preset("qwen35-single");
  const std::string path = std::string(LOOM_SOURCE_DIR) + "/docs/replay-example.json";
  const std::vector<int32_t> c = read_replay_counts(path, p.shape.tokens, p.shape.topk, p.shape.experts);
  const Routes r = make_routes(p.shape, p.routing, parse_distribution("replay:" + path), seed);
  EXPECT_EQ(count_ids(r.topk, p.shape.experts), c);
}

// Every problem with a replay file is one Error that names the file and the problem.
TEST(ReplayFile, ErrorsNameTheProblem) {
  const int64_t T = 128, k = 2, E = 8;  // counts must sum to 256
  struct Case {
    std::string name, text, expect;
  };
  const std::vector<Case> cases = {
      {"over", "{\"counts\": [30, 30, 30, 130, 30, 6, 0, 0]}", "count 130 for expert 3 exceeds T=128"},
      {"sum", "{\"counts\": [30, 30, 30, 30, 30, 30, 30, 40]}", "counts sum to 250, expected T*k=256"},
      {"short", "{\"counts\": [128, 128, 0, 0, 0, 0, 0]}", "has 7 counts, expected E=8"},
      {"long", "[32, 32, 32, 32, 32, 32, 32, 32, 0]", "has 9 counts, expected E=8"},
      {"negative", "[100, 100, -1, 57, 0, 0, 0, 0]", "count -1 for expert 2 is negative"},
      {"fraction", "[1.5, 100, 100, 54.5, 0, 0, 0, 0]", "count 1.5 for expert 0 is not an integer"},
      {"string", "[\"32\", 32, 32, 32, 32, 32, 32, 32]", "count for expert 0 is not a number"},
      {"malformed", "{\"counts\": [32, 32,", "JSON error"},
      {"empty", "", "JSON error"},
      {"nokey", "{\"count\": [32, 32, 32, 32, 32, 32, 32, 32]}", "expected {\"counts\": [c0, c1, ...]}"},
      {"scalar", "256", "expected {\"counts\": [c0, c1, ...]}"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    TempFile f(c.name, c.text);
    const std::string msg = error_of([&] { read_replay_counts(f.path(), T, k, E); });
    EXPECT_EQ(msg.rfind("replay file " + f.path() + ": ", 0), 0u) << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    // make_routes reports the same problem.
    const std::string via_routes = error_of(
        [&] { make_routes(route_shape(T, E, k), Routing{}, parse_distribution("replay:" + f.path()), 1); });
    EXPECT_EQ(via_routes, msg);
  }
  const std::string missing = (std::filesystem::temp_directory_path() / "loom-no-such-replay-file.json").string();
  const std::string msg = error_of([&] { read_replay_counts(missing, T, k, E); });
  EXPECT_NE(msg.find("replay file " + missing + ": no such file"), std::string::npos) << msg;
  const std::string dir = std::filesystem::temp_directory_path().string();
  EXPECT_NE(error_of([&] { read_replay_counts(dir, T, k, E); }).find("not a regular file"), std::string::npos);
}

}  // namespace
}  // namespace loom
