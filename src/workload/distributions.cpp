// Expert-load distributions: parsing, replay files, and the routes they produce.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <numeric>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/json.hpp"
#include "common/parallel.hpp"
#include "workload/workload.hpp"
#include "workload/workload_rng.hpp"

namespace loom {

namespace {

using namespace workload_detail;

constexpr const char* kKnownDistributions = "random, balanced, zipf:S, hot:P, concentrated, replay:FILE";

// The whole string must be a finite number ("1.2", "1e-3"); no spaces, no sign games.
bool parse_number(const std::string& s, double& out) {
  if (s.empty()) return false;
  const char* end = s.data() + s.size();
  const auto [p, ec] = std::from_chars(s.data(), end, out);
  return ec == std::errc() && p == end && std::isfinite(out);
}

// Shortest text that reads back to the same double, so to_string round-trips through parse.
std::string format_number(double d) {
  char buf[64];
  const auto [p, ec] = std::to_chars(buf, buf + sizeof buf, d);
  return ec == std::errc() ? std::string(buf, p) : std::string("?");
}

void check_zipf_exponent(double s) {
  if (!std::isfinite(s) || s < 0)
    throw Error("zipf exponent must be finite and >= 0, got " + format_number(s));
}

void check_hot_fraction(double p) {
  if (!std::isfinite(p) || p < 0 || p > 1) throw Error("hot fraction must be in [0, 1], got " + format_number(p));
}

// s * log(e + 1): an expert's zipf weight is exp(-this), rank(e) = e + 1, so expert 0 is hottest.
std::vector<double> zipf_log_ranks(int64_t experts, double s) {
  std::vector<double> r(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) r[size_t(e)] = s * std::log(double(e + 1));
  return r;
}

// k distinct experts drawn one after another without replacement, P(e) ~ (e+1)^-S renormalised
// over those left, written to out[0, k) in draw order. Exponential keys: with X_e ~ Exp(1), the
// smallest X_e / w_e is expert e with probability w_e / sum(w), and by memorylessness the rest
// follow in the order successive draws would pick them. Keys are compared as logs so that large
// S cannot underflow a weight to zero.
void zipf_draw(Rng& r, const std::vector<double>& log_ranks, int64_t k, std::vector<std::pair<double, int32_t>>& keys,
               int32_t* out) {
  const size_t E = log_ranks.size();
  keys.resize(E);
  for (size_t e = 0; e < E; ++e) keys[e] = {std::log(-std::log(open_unit(r))) + log_ranks[e], int32_t(e)};
  std::partial_sort(keys.begin(), keys.begin() + k, keys.end());
  for (int64_t j = 0; j < k; ++j) out[j] = keys[size_t(j)].second;
}

// Random positive weights summing to 1, times scale, in decreasing order like a router's top-k.
void random_weights(Rng& r, int64_t k, float scale, float* w) {
  double u[64];
  std::vector<double> big;
  double* v = u;
  if (k > 64) {
    big.resize(size_t(k));
    v = big.data();
  }
  double sum = 0;
  for (int64_t j = 0; j < k; ++j) sum += v[j] = r.uniform(0.25, 1.0);
  std::sort(v, v + k, [](double a, double b) { return a > b; });
  for (int64_t j = 0; j < k; ++j) w[j] = float(v[j] / sum * double(scale));
}

std::string shape_note(const Shape& s) {
  return "T=" + std::to_string(s.tokens) + " k=" + std::to_string(s.topk) + " E=" + std::to_string(s.experts);
}

// Per-expert route counts the distribution aims at (all but random and zipf). Draws the chosen
// experts from `plan`.
std::vector<int32_t> target_counts(const Shape& shape, const Distribution& dist, Rng& plan) {
  const int64_t T = shape.tokens, E = shape.experts, k = shape.topk;
  std::vector<int32_t> c(static_cast<size_t>(E), 0);
  std::vector<int32_t> experts(static_cast<size_t>(E));
  std::iota(experts.begin(), experts.end(), 0);
  switch (dist.kind) {
    case DistKind::balanced: {
      // T*k = base*E + rem with rem < E; base + 1 <= T because k <= E.
      const int64_t base = T * k / E, rem = T * k % E;
      shuffle(experts.data(), E, plan);
      for (int64_t i = 0; i < E; ++i) c[size_t(experts[size_t(i)])] = int32_t(base + (i < rem ? 1 : 0));
      return c;
    }
    case DistKind::hot: {
      check_hot_fraction(dist.param);
      const int64_t hot_routes = std::llround(dist.param * double(T));  // half away from zero
      const int64_t hot = int64_t(plan.below(uint64_t(E)));
      const int64_t rest = T * k - hot_routes, others = E - 1;
      const std::string what = "hot:" + format_number(dist.param) + " cannot be realised with " + shape_note(shape);
      if (others == 0) {
        if (rest != 0) throw Error(what + ": the only expert takes every route, so round(P*T) must be T");
        c[size_t(hot)] = int32_t(hot_routes);
        return c;
      }
      const int64_t base = rest / others, rem = rest % others, most = base + (rem > 0 ? 1 : 0);
      if (most > T)
        throw Error(what + ": the other " + std::to_string(others) + " experts would need up to " +
                    std::to_string(most) + " routes each, more than T=" + std::to_string(T) +
                    " (a token picks k distinct experts)");
      c[size_t(hot)] = int32_t(hot_routes);
      std::swap(experts[size_t(hot)], experts[size_t(E - 1)]);  // others are experts[0, E-1)
      shuffle(experts.data(), others, plan);
      for (int64_t i = 0; i < others; ++i) c[size_t(experts[size_t(i)])] = int32_t(base + (i < rem ? 1 : 0));
      return c;
    }
    case DistKind::concentrated:
      shuffle(experts.data(), E, plan);
      for (int64_t i = 0; i < k; ++i) c[size_t(experts[size_t(i)])] = int32_t(T);
      return c;
    case DistKind::replay:
      return read_replay_counts(dist.file, T, k, E);
    default:
      throw Error("internal: no target counts for distribution " + to_string(dist));
  }
}

// Routes with exactly counts[e] tokens on expert e (each count <= T, sum T*k): lay each expert's
// routes consecutively into a T x k matrix in column-major order (slot 0 of every token, then
// slot 1, ...). At most T consecutive entries never wrap onto the same row, so each token gets k
// distinct experts. Expert order and token order are shuffled; the caller shuffles the slots.
void lay_out(const std::vector<int32_t>& counts, int64_t T, int64_t k, Rng& plan, int32_t* ids) {
  const int64_t E = int64_t(counts.size());
  std::vector<int32_t> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  shuffle(order.data(), E, plan);
  std::vector<int64_t> token_of_row(static_cast<size_t>(T));
  std::iota(token_of_row.begin(), token_of_row.end(), int64_t(0));
  shuffle(token_of_row.data(), T, plan);
  int64_t p = 0;
  for (const int32_t e : order) {
    for (int32_t i = 0; i < counts[size_t(e)]; ++i, ++p) {
      const int64_t slot = p / T, row = p % T;
      ids[token_of_row[size_t(row)] * k + slot] = e;
    }
  }
  if (p != T * k) throw Error("internal: laid out " + std::to_string(p) + " routes, expected T*k");
}

void random_routes(const Shape& shape, const Routing& routing, uint64_t seed, Routes& out) {
  const int64_t T = shape.tokens, E = shape.experts, k = shape.topk;
  out.logits.resize(size_t(T * E));
  parallel_for(
      T,
      [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          Rng r(seed, stream_id(Stream::logits, uint64_t(t)));
          Normal normal(r);
          float* row = out.logits.data() + t * E;
          for (int64_t e = 0; e < E; ++e) row[e] = float(normal());
        }
      },
      16);
  if (routing.scoring == Scoring::sigmoid) {
    // Small next to the sigmoid's spread, as trained routers' load-balancing biases are.
    Rng r(seed, stream_id(Stream::bias, 0));
    Normal normal(r);
    out.expert_bias.resize(size_t(E));
    for (float& b : out.expert_bias) b = float(0.1 * normal());
  }
  if (T > 0)
    out.topk = route_ref(out.logits.data(), T, E, k, routing, out.expert_bias.empty() ? nullptr : out.expert_bias.data());
  out.topk.tokens = T;
  out.topk.topk = k;
}

}  // namespace

Distribution parse_distribution(const std::string& spec) {
  const size_t colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  const bool has_arg = colon != std::string::npos;
  const std::string arg = has_arg ? spec.substr(colon + 1) : std::string();
  Distribution d;
  auto plain = [&](DistKind kind) {
    if (has_arg) throw Error("distribution '" + name + "' takes no parameter (got '" + spec + "')");
    d.kind = kind;
    return d;
  };
  if (name == "random") return plain(DistKind::random);
  if (name == "balanced") return plain(DistKind::balanced);
  if (name == "concentrated") return plain(DistKind::concentrated);
  if (name == "zipf") {
    double s = 0;
    if (!has_arg || !parse_number(arg, s) || s < 0)
      throw Error("zipf needs an exponent S >= 0, as in zipf:1.2 (got '" + spec + "')");
    d.kind = DistKind::zipf;
    d.param = s + 0.0;  // -0 -> 0
    return d;
  }
  if (name == "hot") {
    double p = 0;
    if (!has_arg || !parse_number(arg, p) || p < 0 || p > 1)
      throw Error("hot needs a fraction P in [0, 1], as in hot:0.9 (got '" + spec + "')");
    d.kind = DistKind::hot;
    d.param = p + 0.0;
    return d;
  }
  if (name == "replay") {
    if (arg.empty()) throw Error("replay needs a file, as in replay:counts.json (got '" + spec + "')");
    d.kind = DistKind::replay;
    d.file = arg;  // everything after the first ':', so paths may hold ':'
    return d;
  }
  throw Error("unknown distribution '" + spec + "' (known: " + kKnownDistributions + ")");
}

std::string to_string(const Distribution& d) {
  switch (d.kind) {
    case DistKind::random: return "random";
    case DistKind::balanced: return "balanced";
    case DistKind::zipf: return "zipf:" + format_number(d.param);
    case DistKind::hot: return "hot:" + format_number(d.param);
    case DistKind::concentrated: return "concentrated";
    case DistKind::replay: return "replay:" + d.file;
  }
  return "?";
}

std::vector<int32_t> read_replay_counts(const std::string& path, int64_t tokens, int64_t topk, int64_t experts) {
  const std::string what = "replay file " + path;
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) throw Error(what + ": no such file");
  if (!std::filesystem::is_regular_file(status)) throw Error(what + ": not a regular file");
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) throw Error(what + ": cannot read it");
  const json::Value doc = json::parse(text.str(), what);  // errors read "replay file P: JSON error at ..."

  const json::Value* list = nullptr;
  if (doc.kind() == json::Value::Kind::array) {
    list = &doc;
  } else if (doc.has("counts") && doc.at("counts").kind() == json::Value::Kind::array) {
    list = &doc.at("counts");
  } else {
    throw Error(what + ": expected {\"counts\": [c0, c1, ...]} or a bare array of per-expert counts");
  }
  const auto& a = list->as_array();
  if (int64_t(a.size()) != experts)
    throw Error(what + ": has " + std::to_string(a.size()) + " counts, expected E=" + std::to_string(experts));

  std::vector<int32_t> counts(a.size());
  int64_t sum = 0;
  for (size_t e = 0; e < a.size(); ++e) {
    const std::string which = " for expert " + std::to_string(e);
    if (a[e].kind() != json::Value::Kind::number) throw Error(what + ": count" + which + " is not a number");
    const double c = a[e].as_number();
    if (!std::isfinite(c) || c != std::floor(c))
      throw Error(what + ": count " + format_number(c) + which + " is not an integer");
    if (c < 0) throw Error(what + ": count " + format_number(c) + which + " is negative");
    if (c > double(tokens))
      throw Error(what + ": count " + format_number(c) + which + " exceeds T=" + std::to_string(tokens) +
                  " (a token routes to an expert at most once)");
    counts[e] = int32_t(c);
    sum += counts[e];
  }
  if (sum != tokens * topk)
    throw Error(what + ": counts sum to " + std::to_string(sum) + ", expected T*k=" + std::to_string(tokens * topk));
  return counts;
}

void route_from_logits(const Shape& shape, const Routing& routing, uint64_t seed, Routes& routes) {
  if (!routes.logits.empty()) return;
  if (routing.scoring != Scoring::softmax)
    throw Error("logits for a skewed distribution: softmax scoring only (sigmoid scores carry an expert bias)");
  const int64_t T = shape.tokens, E = shape.experts, k = shape.topk;
  routes.logits.resize(size_t(T * E));
  for (int64_t t = 0; t < T; ++t) {
    Rng r(seed, stream_id(Stream::logits, uint64_t(t)));
    Normal normal(r);
    float* row = routes.logits.data() + t * E;
    // The others below 4, the chosen from 6 up in slot order: the routing picks exactly the ids.
    for (int64_t e = 0; e < E; ++e) row[e] = std::min(4.0f, float(normal()));
    for (int64_t j = 0; j < k; ++j) row[routes.topk.ids[size_t(t * k + j)]] = 6.0f + 0.25f * float(k - 1 - j);
  }
  const TopK wanted = routes.topk;
  if (T > 0) routes.topk = route_ref(routes.logits.data(), T, E, k, routing, nullptr);
  routes.topk.tokens = T;
  routes.topk.topk = k;
  // The routing ranks the raw logits (softmax), so it picks exactly the wanted experts; checked.
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> a(wanted.ids.begin() + t * k, wanted.ids.begin() + (t + 1) * k);
    std::vector<int32_t> b(routes.topk.ids.begin() + t * k, routes.topk.ids.begin() + (t + 1) * k);
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    if (a != b)
      throw Error("logits for a skewed distribution: the routing (" + describe(routing) +
                  ") does not pick the distribution's experts for token " + std::to_string(t));
  }
}

Routes make_routes(const Shape& shape, const Routing& routing, const Distribution& dist, uint64_t seed) {
  validate(shape);
  validate(routing, shape);
  const int64_t T = shape.tokens, E = shape.experts, k = shape.topk;
  Routes out;
  if (dist.kind == DistKind::random) {
    random_routes(shape, routing, seed, out);
    return out;
  }
  out.topk.tokens = T;
  out.topk.topk = k;
  out.topk.ids.resize(size_t(T * k));
  out.topk.weights.resize(size_t(T * k));

  const bool zipf = dist.kind == DistKind::zipf;
  std::vector<double> log_ranks;
  if (zipf) {
    check_zipf_exponent(dist.param);
    log_ranks = zipf_log_ranks(E, dist.param);
  } else {
    Rng plan(seed, stream_id(Stream::plan, 0));
    out.target_counts = target_counts(shape, dist, plan);
    lay_out(out.target_counts, T, k, plan, out.topk.ids.data());
  }

  parallel_for(
      T,
      [&](int64_t begin, int64_t end) {
        std::vector<std::pair<double, int32_t>> keys;
        for (int64_t t = begin; t < end; ++t) {
          Rng r(seed, stream_id(Stream::token, uint64_t(t)));
          int32_t* ids = out.topk.ids.data() + t * k;
          if (zipf) {
            zipf_draw(r, log_ranks, k, keys, ids);
          } else {
            shuffle(ids, k, r);
          }
          random_weights(r, k, routing.scale, out.topk.weights.data() + t * k);
        }
      },
      64);
  return out;
}

std::vector<int32_t> expert_counts(const TopK& topk, int64_t experts) {
  std::vector<int32_t> c(static_cast<size_t>(std::max<int64_t>(experts, 0)), 0);
  // Out-of-range ids are not counted, as the GPU dispatch drops them.
  for (const int32_t id : topk.ids)
    if (id >= 0 && id < experts) ++c[size_t(id)];
  return c;
}

std::vector<double> zipf_inclusion(int64_t experts, int64_t topk, double s, uint64_t seed, int64_t samples) {
  if (experts <= 0 || experts > kMaxExperts)
    throw Error("zipf_inclusion: experts = " + std::to_string(experts) + " out of range");
  if (topk <= 0 || topk > experts)
    throw Error("zipf_inclusion: topk = " + std::to_string(topk) + " must be in [1, experts]");
  check_zipf_exponent(s);
  if (samples <= 0 || uint64_t(samples) > kMaxStreamIndex)
    throw Error("zipf_inclusion: samples = " + std::to_string(samples) + " out of range");

  const std::vector<double> log_ranks = zipf_log_ranks(experts, s);
  std::vector<int64_t> total(static_cast<size_t>(experts), 0);
  std::mutex total_mutex;
  parallel_for(
      samples,
      [&](int64_t begin, int64_t end) {
        std::vector<int64_t> local(static_cast<size_t>(experts), 0);
        std::vector<std::pair<double, int32_t>> keys;
        std::vector<int32_t> ids(static_cast<size_t>(topk));
        for (int64_t i = begin; i < end; ++i) {
          Rng r(seed, stream_id(Stream::inclusion, uint64_t(i)));
          zipf_draw(r, log_ranks, topk, keys, ids.data());
          for (const int32_t e : ids) ++local[size_t(e)];
        }
        // Integer sums: the same whatever the chunking.
        std::lock_guard<std::mutex> lock(total_mutex);
        for (size_t e = 0; e < total.size(); ++e) total[e] += local[e];
      },
      1024);
  std::vector<double> p(static_cast<size_t>(experts));
  for (size_t e = 0; e < p.size(); ++e) p[e] = double(total[e]) / double(samples);
  return p;
}

}  // namespace loom
