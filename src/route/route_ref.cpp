#include "route/route_ref.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/parallel.hpp"

namespace loom {

namespace {

// The one ranking rule of routing: a larger key first, NaN after every number (-inf included),
// equal keys (and NaN against NaN) to the lower index. A strict total order, so the selection is
// unique and a GPU kernel can reproduce it bit for bit.
struct RanksBefore {
  const double* key;
  bool operator()(int32_t a, int32_t b) const {
    const double ka = key[a], kb = key[b];
    const bool a_nan = std::isnan(ka), b_nan = std::isnan(kb);
    if (a_nan != b_nan) return b_nan;
    if (!a_nan && ka != kb) return ka > kb;
    return a < b;
  }
};

// Moves the `count` best of candidates[0, n) to the front, best first.
void select_best(int32_t* candidates, int64_t n, int64_t count, const double* key) {
  std::partial_sort(candidates, candidates + count, candidates + n, RanksBefore{key});
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Per-thread scratch, sized once per chunk of tokens.
struct Scratch {
  std::vector<double> key;          // [E] ranking key of each expert
  std::vector<double> capped;       // [E] softmax input after the soft-cap
  std::vector<int32_t> candidates;  // [E] expert ids being ranked
  std::vector<double> group_score;  // [n_group]
  std::vector<int32_t> groups;      // [n_group] group ids being ranked
  std::vector<double> weight;       // [k] chosen weights before rounding
};

// Softmax probabilities of the chosen experts from the (soft-capped) logits, NaN where the logit is
// NaN. A NaN has probability 0. Experts at a +inf maximum share the mass equally; when nothing is
// above -inf there is no mass and every probability is 0.
void softmax_weights(const double* capped, int64_t experts, const int32_t* chosen, int64_t topk, double* weight) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  double max_capped = -inf;
  for (int64_t e = 0; e < experts; ++e)
    if (!std::isnan(capped[e])) max_capped = std::max(max_capped, capped[e]);

  if (max_capped == inf) {
    const int64_t at_max = std::count(capped, capped + experts, inf);
    for (int64_t j = 0; j < topk; ++j) weight[j] = capped[chosen[j]] == inf ? 1.0 / double(at_max) : 0.0;
    return;
  }
  if (max_capped == -inf) {
    std::fill(weight, weight + topk, 0.0);
    return;
  }
  // Shifting by the finite maximum keeps every exp in (0, 1]; -inf logits give exp(-inf) = 0.
  double denominator = 0;
  for (int64_t e = 0; e < experts; ++e)
    if (!std::isnan(capped[e])) denominator += std::exp(capped[e] - max_capped);
  for (int64_t j = 0; j < topk; ++j) {
    const double c = capped[chosen[j]];
    weight[j] = std::isnan(c) ? 0.0 : std::exp(c - max_capped) / denominator;
  }
}

void route_softmax_token(const float* logits, int64_t experts, int64_t topk, const Routing& routing, Scratch& s,
                         int32_t* ids) {
  // Rank by the raw logit: tanh and exp are increasing, so the order is that of the probabilities,
  // and the comparison is exact on any hardware.
  const double softcap = routing.softcap;
  for (int64_t e = 0; e < experts; ++e) {
    const double l = logits[e];
    s.key[size_t(e)] = l;
    s.capped[size_t(e)] = softcap > 0 ? softcap * std::tanh(l / softcap) : l;  // NaN stays NaN
    s.candidates[size_t(e)] = int32_t(e);
  }
  select_best(s.candidates.data(), experts, topk, s.key.data());
  std::copy_n(s.candidates.data(), topk, ids);
  softmax_weights(s.capped.data(), experts, ids, topk, s.weight.data());
}

void route_sigmoid_token(const float* logits, const float* bias, int64_t experts, int64_t topk,
                         const Routing& routing, Scratch& s, int32_t* ids) {
  // Biased score; a NaN logit keeps a NaN key so it ranks last whatever its bias.
  for (int64_t e = 0; e < experts; ++e) {
    const float l = logits[e];
    s.key[size_t(e)] = std::isnan(l) ? l : sigmoid(double(l)) + (bias ? double(bias[e]) : 0.0);
  }

  // Group stage. A group's score is the sum of its two best keys under the ranking rule, so a NaN
  // among them makes the group's score NaN and the group ranks after every scored group.
  const int64_t n_group = routing.n_group, group_size = experts / n_group;
  for (int64_t g = 0; g < n_group; ++g) {
    int32_t* members = s.candidates.data() + g * group_size;
    for (int64_t i = 0; i < group_size; ++i) members[i] = int32_t(g * group_size + i);
    const int64_t best = std::min<int64_t>(2, group_size);
    select_best(members, group_size, best, s.key.data());
    s.group_score[size_t(g)] = best == 2 ? s.key[size_t(members[0])] + s.key[size_t(members[1])]
                                         : s.key[size_t(members[0])];
    s.groups[size_t(g)] = int32_t(g);
  }
  select_best(s.groups.data(), n_group, routing.topk_group, s.group_score.data());

  // Expert stage over the kept groups only.
  int64_t n_candidates = 0;
  for (int64_t i = 0; i < routing.topk_group; ++i) {
    const int64_t g = s.groups[size_t(i)];
    for (int64_t m = 0; m < group_size; ++m) s.candidates[size_t(n_candidates++)] = int32_t(g * group_size + m);
  }
  select_best(s.candidates.data(), n_candidates, topk, s.key.data());
  std::copy_n(s.candidates.data(), topk, ids);

  // Weights are the unbiased scores; the bias only steers the choice.
  for (int64_t j = 0; j < topk; ++j) {
    const float l = logits[ids[j]];
    s.weight[size_t(j)] = std::isnan(l) ? 0.0 : sigmoid(double(l));
  }
}

}  // namespace

TopK route_ref(const float* logits, int64_t tokens, int64_t experts, int64_t topk, const Routing& routing,
               const float* bias) {
  if (tokens < 0) throw Error("route_ref: tokens must be >= 0, got " + std::to_string(tokens));
  if (experts <= 0 || experts > std::numeric_limits<int32_t>::max())
    throw Error("route_ref: experts must be in [1, 2^31), got " + std::to_string(experts));
  if (topk <= 0 || topk > experts)
    throw Error("route_ref: topk = " + std::to_string(topk) + " must be in [1, experts = " +
                std::to_string(experts) + "]");
  Shape shape;
  shape.experts = experts;
  shape.topk = topk;
  validate(routing, shape);  // the same group / softcap / scale rules as the rest of loom
  if (tokens > 0 && !logits) throw Error("route_ref: logits is null");

  TopK out;
  out.tokens = tokens;
  out.topk = topk;
  out.ids.resize(size_t(tokens * topk));
  out.weights.resize(size_t(tokens * topk));

  parallel_for(
      tokens,
      [&](int64_t begin, int64_t end) {
        Scratch s;
        s.key.resize(size_t(experts));
        if (routing.scoring == Scoring::softmax) s.capped.resize(size_t(experts));
        s.candidates.resize(size_t(experts));
        s.group_score.resize(size_t(routing.n_group));
        s.groups.resize(size_t(routing.n_group));
        s.weight.resize(size_t(topk));
        for (int64_t t = begin; t < end; ++t) {
          const float* row = logits + t * experts;
          int32_t* ids = out.ids.data() + t * topk;
          if (routing.scoring == Scoring::softmax)
            route_softmax_token(row, experts, topk, routing, s, ids);
          else
            route_sigmoid_token(row, bias, experts, topk, routing, s, ids);

          double sum = 0;
          for (int64_t j = 0; j < topk; ++j) sum += s.weight[size_t(j)];
          // Weights are >= 0, so a zero sum means all are 0: leave them 0 rather than make NaN.
          const bool divide = routing.renormalize && sum > 0;
          for (int64_t j = 0; j < topk; ++j) {
            const double w = divide ? s.weight[size_t(j)] / sum : s.weight[size_t(j)];
            out.weights[size_t(t * topk + j)] = float(w * double(routing.scale));  // the one rounding
          }
        }
      },
      64);
  return out;
}

int64_t count_nan_tokens(const float* logits, int64_t tokens, int64_t experts) {
  if (tokens < 0 || experts < 0) throw Error("count_nan_tokens: tokens and experts must be >= 0");
  if (tokens > 0 && experts > 0 && !logits) throw Error("count_nan_tokens: logits is null");
  int64_t count = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    const float* row = logits + t * experts;
    count += std::any_of(row, row + experts, [](float l) { return std::isnan(l); });
  }
  return count;
}

}  // namespace loom
