// The routing kernel against the CPU reference (route_ref), on fresh random logits every run with
// the awkward rows mixed in (NaN, +-inf, exact ties, signed zeros, wide spreads), outputs poisoned
// before each launch and a poisoned tail after them that must survive.
//
// softmax: ids exactly; weights within 2e-6 relative per element (fp32 tanhf/expf against double),
//          rows summing to scale when renormalised; nan_flags exactly.
// sigmoid: the kernel ranks by fp32 scores, the reference by double ones, so a row may differ where
//          two competing scores (experts or groups) differ by less than 1e-5 relative: such rows
//          are proven to be genuine near-ties, counted (a handful at most), and their weights
//          checked for the experts the kernel chose; every other row must match exactly.
// RouteTopkGpu* skip without an sm_90 device; RouteTopkLauncher* are host-only argument checks.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "common/rng.hpp"
#include "dispatch/dispatch_ref.hpp"
#include "gpu_test.hpp"
#include "loom/types.hpp"
#include "ptx/pdl.cuh"
#include "route/route_ref.hpp"
#include "route/route_topk_sm90.cuh"
#include "test_seed.hpp"

#if __has_include("bench/device_buffer.hpp")  // the harness (tools/) is built: the GPU tests too
#define LOOM_ROUTE_GPU_TESTS 1
#include "bench/device_buffer.hpp"
#endif

namespace loom {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

Routing softmax_routing(bool renormalize, float softcap, float scale) {
  Routing r;
  r.scoring = Scoring::softmax;
  r.renormalize = renormalize;
  r.softcap = softcap;
  r.scale = scale;
  return r;
}

Routing sigmoid_routing(int n_group, int topk_group, bool renormalize, float scale) {
  Routing r;
  r.scoring = Scoring::sigmoid;
  r.n_group = n_group;
  r.topk_group = topk_group;
  r.renormalize = renormalize;
  r.scale = scale;
  return r;
}

// ---------------------------------------------------------------------------------------------
// Host-only: the launcher's argument checks (they run before any CUDA call).

TEST(RouteTopkLauncher, RejectsUnsupportedShapesAndBadArguments) {
  int32_t ids[16];
  float weights[16], logits[1024] = {};
  uint8_t flags[1];
  RouteTopkParams ok;
  ok.logits = logits;
  ok.topk_ids = ids;
  ok.topk_weights = weights;
  ok.nan_flags = flags;
  ok.tokens = 1;
  ok.experts = 64;
  ok.topk = 8;
  ok.routing = softmax_routing(true, 0.0f, 1.0f);

  auto with = [&](auto change) {
    RouteTopkParams p = ok;
    change(p);
    return p;
  };
  EXPECT_THROW(launch_route_topk(with([](auto& p) { p.experts = 513; }), nullptr, false), Error);
  EXPECT_THROW(launch_route_topk(with([](auto& p) { p.topk = 17; }), nullptr, false), Error);
  EXPECT_THROW(launch_route_topk(with([](auto& p) { p.experts = 513; p.tokens = 0; }), nullptr, false), Error);
  EXPECT_THROW(launch_route_topk(with([](auto& p) { p.topk = 17; p.experts = 512; }), nullptr, true), Error);
  EXPECT_THROW(launch_route_topk(with([](auto& p) { p.experts = 4; p.topk = 5; }), nullptr, false), Error);
  EXPECT_THROW(launch_route_topk(with([](auto& p) { p.experts = 0; p.topk = 1; }), nullptr, false), Error);
  EXPECT_THROW(launch_route_topk(with([](auto& p) { p.topk = 0; }), nullptr, false), Error);
  EXPECT_THROW(launch_route_topk(with([](auto& p) { p.tokens = -1; }), nullptr, false), Error);
  // Routing rules (loom::validate): groups are sigmoid-only, must divide E and hold k experts.
  EXPECT_THROW(launch_route_topk(with([](auto& p) { p.routing.n_group = 2; }), nullptr, false), Error);
  EXPECT_THROW(launch_route_topk(with([](auto& p) { p.routing = sigmoid_routing(3, 1, true, 1.0f); }), nullptr,
                                 false),
               Error);
  EXPECT_THROW(launch_route_topk(with([](auto& p) { p.routing = sigmoid_routing(16, 1, true, 1.0f); }), nullptr,
                                 false),
               Error);  // k = 8 > 4 experts in one kept group
  EXPECT_THROW(launch_route_topk(with([](auto& p) { p.routing.softcap = -1.0f; }), nullptr, false), Error);
  EXPECT_THROW(launch_route_topk(with([](auto& p) { p.routing.scale = kInf; }), nullptr, false), Error);
  // Null device pointers with work to do.
  EXPECT_THROW(launch_route_topk(with([](auto& p) { p.logits = nullptr; }), nullptr, false), Error);
  EXPECT_THROW(launch_route_topk(with([](auto& p) { p.topk_ids = nullptr; }), nullptr, false), Error);
  EXPECT_THROW(launch_route_topk(with([](auto& p) { p.topk_weights = nullptr; }), nullptr, false), Error);
  EXPECT_THROW(launch_route_topk(with([](auto& p) { p.nan_flags = nullptr; }), nullptr, false), Error);
  // The error names the problem.
  try {
    launch_route_topk(with([](auto& p) { p.experts = 513; }), nullptr, false);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("513"), std::string::npos) << e.what();
  }
}

#ifdef LOOM_ROUTE_GPU_TESTS

using bench::DeviceBuffer;

constexpr int64_t kGuard = 37;              // poisoned elements after each output that must survive
constexpr int32_t kPoisonId = 0x7fffffff;   // ids are poisoned with kPoisonId - (i % 251)
constexpr uint8_t kPoisonFlag = 0xAA;
constexpr double kWeightRel = 2e-6;         // per weight, relative
constexpr double kWeightFloor = 1e-37;      // absolute, for weights in the fp32 subnormal range
constexpr double kNearTieRel = 1e-5;        // sigmoid: scores this close may be ordered either way

// ---------------------------------------------------------------------------------------------
// Inputs.

struct Problem {
  int64_t tokens = 0, experts = 0, topk = 0;
  Routing routing;
  std::vector<float> logits;  // [T, E]
  std::vector<float> bias;    // [E] or empty (none)
  const float* bias_or_null() const { return bias.empty() ? nullptr : bias.data(); }
  std::string str() const {
    std::ostringstream o;
    o << "T=" << tokens << " E=" << experts << " k=" << topk << " " << describe(routing)
      << (bias.empty() ? "" : " bias");
    return o.str();
  }
};

enum class RowKind { plain, ties, some_nan, all_nan, pos_inf, neg_inf, all_neg_inf, signed_zeros, mixed, wide };

// One row of logits. `sigma` scales the plain values; `wide` spreads them over +-100 (softmax
// only: sigmoid saturates there in fp32 and every such row would be a near-tie).
void fill_row(Rng& rng, RowKind kind, double sigma, float* row, int64_t experts) {
  for (int64_t e = 0; e < experts; ++e) row[e] = float(sigma * rng.normal());
  switch (kind) {
    case RowKind::plain: break;
    case RowKind::ties:  // few distinct values: many exact ties, decided by the lower id
      for (int64_t e = 0; e < experts; ++e) row[e] = float(std::round(row[e] * 2.0) / 2.0);
      break;
    case RowKind::some_nan:
      for (int64_t e = 0; e < experts; ++e)
        if (rng.below(4) == 0) row[e] = kNaN;
      row[rng.below(uint64_t(experts))] = kNaN;
      break;
    case RowKind::all_nan: std::fill(row, row + experts, kNaN); break;
    case RowKind::pos_inf:
      for (int i = 0, n = 1 + int(rng.below(3)); i < n; ++i) row[rng.below(uint64_t(experts))] = kInf;
      break;
    case RowKind::neg_inf:
      for (int64_t e = 0; e < experts; ++e)
        if (rng.below(3) == 0) row[e] = -kInf;
      break;
    case RowKind::all_neg_inf: std::fill(row, row + experts, -kInf); break;
    case RowKind::signed_zeros: {  // +0 and -0 must tie (decided by id), not order by sign bit
      const float values[] = {0.0f, -0.0f, -0.0f, -1.0f, -0.5f};
      for (int64_t e = 0; e < experts; ++e) row[e] = values[rng.below(std::size(values))];
      break;
    }
    case RowKind::mixed: {
      const float values[] = {kNaN, kInf, -kInf, 0.0f, -0.0f, 1.0f, 1.5f};
      for (int64_t e = 0; e < experts; ++e)
        if (rng.below(2) == 0) row[e] = values[rng.below(std::size(values))];
      break;
    }
    case RowKind::wide:
      for (int64_t e = 0; e < experts; ++e) row[e] = float(100.0 * rng.uniform(-1.0, 1.0));
      break;
  }
}

// Random logits: most rows plain, the rest one of the special kinds (any kind when T is tiny).
std::vector<float> random_logits(Rng& rng, int64_t tokens, int64_t experts, double sigma, bool allow_wide) {
  const RowKind special[] = {RowKind::ties,    RowKind::some_nan,    RowKind::all_nan,
                             RowKind::pos_inf, RowKind::neg_inf,     RowKind::all_neg_inf,
                             RowKind::signed_zeros, RowKind::mixed,  RowKind::wide};
  const size_t n_special = std::size(special) - (allow_wide ? 0 : 1);
  std::vector<float> logits(size_t(tokens * experts));
  for (int64_t t = 0; t < tokens; ++t) {
    const bool plain = tokens > 3 ? rng.below(5) < 3 : rng.below(3) == 0;
    const RowKind kind = plain ? RowKind::plain : special[rng.below(n_special)];
    fill_row(rng, kind, sigma, logits.data() + t * experts, experts);
  }
  return logits;
}

std::vector<float> random_bias(Rng& rng, int64_t experts) {
  std::vector<float> b(static_cast<size_t>(experts));
  for (auto& v : b) v = float(0.05 * rng.normal());
  return b;
}

// ---------------------------------------------------------------------------------------------
// Running the kernel.

struct GpuOutput {
  std::vector<int32_t> ids;
  std::vector<float> weights;
  std::vector<uint8_t> flags;
};

int32_t poison_id(size_t i) { return kPoisonId - int32_t(i % 251); }

struct Outputs {  // poisoned device outputs with a guard tail
  DeviceBuffer ids, weights, flags;
  int64_t n = 0, tokens = 0;
  Outputs(int64_t tokens_, int64_t topk) : n(tokens_ * topk), tokens(tokens_) {
    std::vector<int32_t> i(size_t(n + kGuard));
    for (size_t j = 0; j < i.size(); ++j) i[j] = poison_id(j);
    ids = DeviceBuffer::from(i);
    weights = DeviceBuffer::from(std::vector<float>(size_t(n + kGuard), kNaN));
    flags = DeviceBuffer::from(std::vector<uint8_t>(size_t(tokens + kGuard), kPoisonFlag));
  }
  // Downloads the outputs and checks the guard tails are untouched.
  GpuOutput fetch() const {
    GpuOutput out{ids.to_host<int32_t>(), weights.to_host<float>(), flags.to_host<uint8_t>()};
    for (int64_t j = n; j < n + kGuard; ++j) {
      EXPECT_EQ(out.ids[size_t(j)], poison_id(size_t(j))) << "ids written past [T, k] at " << j;
      EXPECT_TRUE(std::isnan(out.weights[size_t(j)])) << "weights written past [T, k] at " << j;
    }
    for (int64_t j = tokens; j < tokens + kGuard; ++j)
      EXPECT_EQ(out.flags[size_t(j)], kPoisonFlag) << "nan_flags written past [T] at " << j;
    out.ids.resize(size_t(n));
    out.weights.resize(size_t(n));
    out.flags.resize(size_t(tokens));
    return out;
  }
};

RouteTopkParams params(const Problem& pr, const DeviceBuffer& logits, const DeviceBuffer& bias, const Outputs& out) {
  RouteTopkParams p;
  p.logits = logits.as<float>();
  p.bias = pr.bias.empty() ? nullptr : bias.as<float>();
  p.topk_ids = out.ids.as<int32_t>();
  p.topk_weights = out.weights.as<float>();
  p.nan_flags = out.flags.as<uint8_t>();
  p.tokens = int(pr.tokens);
  p.experts = int(pr.experts);
  p.topk = int(pr.topk);
  p.routing = pr.routing;
  return p;
}

// With pdl the run also writes the token masks (RouteTopkParams::token_masks, poisoned first), which
// must be exactly the masks of the ids it wrote, with no bits for the padding tokens of the last word.
GpuOutput run_gpu(const Problem& pr, bool pdl) {
  const DeviceBuffer logits = DeviceBuffer::from(pr.logits), bias = DeviceBuffer::from(pr.bias);
  const Outputs out(pr.tokens, pr.topk);
  const int64_t words = (pr.tokens + 31) / 32, mask_words = words * pr.experts;
  DeviceBuffer masks(size_t(std::max<int64_t>(mask_words, 1)) * 4);
  LOOM_CUDA_CHECK(cudaMemset(masks.get(), 0xa5, masks.bytes()));
  RouteTopkParams p = params(pr, logits, bias, out);
  if (pdl) p.token_masks = masks.as<uint32_t>();
  launch_route_topk(p, nullptr, pdl);
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  GpuOutput got = out.fetch();
  if (pdl && mask_words > 0) {
    const std::vector<uint32_t> want = token_masks_ref(got.ids.data(), pr.tokens, pr.topk, pr.experts);
    const std::vector<uint32_t> have = masks.to_host<uint32_t>();
    int64_t wrong = 0;
    for (size_t i = 0; i < want.size(); ++i) wrong += have[i] != want[i];
    EXPECT_EQ(wrong, 0) << pr.str() << ": token mask words differ from the masks of the ids";
  }
  return got;
}

// ---------------------------------------------------------------------------------------------
// Checking.

// Reports the first few failures of a comparison in full and counts the rest.
struct Failures {
  explicit Failures(std::string what_) : what(std::move(what_)) {}
  std::string what;
  int64_t count = 0;
  std::ostringstream first;
  void add(const std::string& msg) {
    if (count++ < 6) first << "\n  " << msg;
  }
  ~Failures() {
    if (count) ADD_FAILURE() << what << ": " << count << " mismatches" << first.str();
  }
};

std::string row_str(const int32_t* ids, int64_t k) {
  std::ostringstream o;
  for (int64_t j = 0; j < k; ++j) o << (j ? " " : "") << ids[j];
  return o.str();
}

bool weight_close(float got, double expected, double& max_rel) {
  if (std::isnan(got)) return false;
  const double err = std::abs(double(got) - expected);
  if (std::abs(expected) >= 1e-30) max_rel = std::max(max_rel, err / std::abs(expected));
  return err <= kWeightRel * std::abs(expected) + kWeightFloor;
}

void check_flags(const Problem& pr, const GpuOutput& got, Failures& fail) {
  for (int64_t t = 0; t < pr.tokens; ++t) {
    const float* row = pr.logits.data() + t * pr.experts;
    const uint8_t expect = std::any_of(row, row + pr.experts, [](float l) { return std::isnan(l); }) ? 1 : 0;
    if (got.flags[size_t(t)] != expect)
      fail.add("token " + std::to_string(t) + ": nan_flag " + std::to_string(got.flags[size_t(t)]) + ", expected " +
               std::to_string(expect));
  }
}

void check_distinct_in_range(const Problem& pr, const GpuOutput& got, int64_t t, Failures& fail) {
  std::set<int32_t> seen;
  for (int64_t j = 0; j < pr.topk; ++j) {
    const int32_t id = got.ids[size_t(t * pr.topk + j)];
    if (id < 0 || id >= pr.experts || !seen.insert(id).second) {
      fail.add("token " + std::to_string(t) + ": ids " + row_str(got.ids.data() + t * pr.topk, pr.topk) +
               " are not k distinct experts");
      return;
    }
  }
}

// Renormalised rows sum to scale (unless the reference row has no mass at all).
void check_row_sums(const Problem& pr, const TopK& ref, const GpuOutput& got, Failures& fail) {
  if (!pr.routing.renormalize) return;
  for (int64_t t = 0; t < pr.tokens; ++t) {
    double ref_sum = 0, sum = 0;
    for (int64_t j = 0; j < pr.topk; ++j) {
      ref_sum += std::abs(ref.weights[size_t(t * pr.topk + j)]);
      sum += got.weights[size_t(t * pr.topk + j)];
    }
    if (ref_sum == 0) continue;
    const double scale = pr.routing.scale;
    if (!(std::abs(sum - scale) <= 4e-6 * std::abs(scale)))
      fail.add("token " + std::to_string(t) + ": renormalised weights sum to " + std::to_string(sum) +
               ", expected " + std::to_string(scale));
  }
}

// Softmax: ids exactly, weights per element, sums, flags. Returns the largest relative weight error.
double check_softmax(const Problem& pr, const GpuOutput& got) {
  const TopK ref = route_ref(pr.logits.data(), pr.tokens, pr.experts, pr.topk, pr.routing);
  Failures fail(pr.str());
  double max_rel = 0;
  const int64_t k = pr.topk;
  for (int64_t t = 0; t < pr.tokens; ++t) {
    const int32_t* g = got.ids.data() + t * k;
    const int32_t* r = ref.ids.data() + t * k;
    if (!std::equal(g, g + k, r)) {
      fail.add("token " + std::to_string(t) + ": ids " + row_str(g, k) + ", expected " + row_str(r, k));
      continue;
    }
    for (int64_t j = 0; j < k; ++j) {
      const size_t i = size_t(t * k + j);
      if (!weight_close(got.weights[i], ref.weights[i], max_rel))
        fail.add("token " + std::to_string(t) + " slot " + std::to_string(j) + ": weight " +
                 std::to_string(got.weights[i]) + ", expected " + std::to_string(ref.weights[i]));
    }
  }
  check_row_sums(pr, ref, got, fail);
  check_flags(pr, got, fail);
  return max_rel;
}

// The reference's ranking rule on double keys: larger first, NaN last, ties to the lower index.
bool ranks_before(const std::vector<double>& key, int32_t a, int32_t b) {
  const double ka = key[size_t(a)], kb = key[size_t(b)];
  if (std::isnan(ka) != std::isnan(kb)) return std::isnan(kb);
  if (!std::isnan(ka) && ka != kb) return ka > kb;
  return a < b;
}

bool near_tie(double a, double b) {
  if (a == b) return true;
  if (std::isnan(a) || std::isnan(b) || std::isinf(a) || std::isinf(b)) return false;
  return std::abs(a - b) <= kNearTieRel * std::max(std::abs(a), std::abs(b));
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Expected weights of the experts the kernel chose (the reference's formula, for any id list).
std::vector<double> sigmoid_weights(const Problem& pr, int64_t t, const int32_t* ids) {
  std::vector<double> w(size_t(pr.topk));
  double sum = 0;
  for (int64_t j = 0; j < pr.topk; ++j) {
    const float l = pr.logits[size_t(t * pr.experts + ids[j])];
    w[size_t(j)] = std::isnan(l) ? 0.0 : sigmoid(l);
    sum += w[size_t(j)];
  }
  for (auto& v : w) v = (pr.routing.renormalize && sum > 0 ? v / sum : v) * double(pr.routing.scale);
  return w;
}

// A sigmoid row whose ids differ from the reference's: true when the kernel's choice is the
// reference's up to near-ties. The kept groups may differ only by groups whose scores are within
// kNearTieRel of the last kept group's; then, for some such set of kept groups, the kernel's slot j
// must hold the reference's j-th best candidate or one whose score is within kNearTieRel of it.
bool explained_by_near_ties(const Problem& pr, int64_t t, const int32_t* got, std::string& why) {
  const int64_t E = pr.experts, k = pr.topk;
  const int n_group = pr.routing.n_group, topk_group = pr.routing.topk_group;
  const int64_t size = E / n_group;
  const float* row = pr.logits.data() + t * E;
  std::vector<double> key(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    key[size_t(e)] = std::isnan(row[e]) ? std::nan("") : sigmoid(row[e]) + (pr.bias.empty() ? 0.0 : pr.bias[size_t(e)]);

  std::vector<double> group_score(static_cast<size_t>(n_group));
  for (int g = 0; g < n_group; ++g) {
    std::vector<int32_t> m(static_cast<size_t>(size));
    std::iota(m.begin(), m.end(), int32_t(g * size));
    std::sort(m.begin(), m.end(), [&](int32_t a, int32_t b) { return ranks_before(key, a, b); });
    group_score[size_t(g)] = size >= 2 ? key[size_t(m[0])] + key[size_t(m[1])] : key[size_t(m[0])];
  }
  std::vector<int32_t> order(static_cast<size_t>(n_group));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return ranks_before(group_score, a, b); });

  // Kept-group sets the kernel may legitimately have chosen.
  std::vector<std::vector<bool>> kept_sets;
  {
    const double boundary = group_score[size_t(order[size_t(topk_group - 1)])];
    std::vector<int32_t> sure, band;  // kept whatever the rounding; close to the boundary
    for (size_t i = 0; i < order.size(); ++i) {
      const int32_t g = order[i];
      if (topk_group < n_group && near_tie(group_score[size_t(g)], boundary))
        band.push_back(g);
      else if (int64_t(i) < topk_group)
        sure.push_back(g);
    }
    const int64_t need = topk_group - int64_t(sure.size());
    if (need < 0 || need > int64_t(band.size())) {
      why = "inconsistent group band";
      return false;
    }
    if (band.size() > 12) {
      // Too many tied groups to enumerate (e.g. one expert per group and many near-equal scores):
      // check the one kept set that explains the kernel's ids best: the band groups it chose, plus
      // the lowest-scoring band groups (they displace the fewest candidates).
      std::vector<bool> in_band(size_t(n_group), false), kept(size_t(n_group), false);
      for (int32_t g : band) in_band[size_t(g)] = true;
      for (int32_t g : sure) kept[size_t(g)] = true;
      int64_t chosen = 0;
      for (int64_t j = 0; j < k; ++j) {
        const int32_t id = got[j];
        if (id < 0 || id >= E) {
          why = "id out of range";
          return false;
        }
        const int64_t g = id / size;
        if (in_band[size_t(g)] && !kept[size_t(g)]) {
          kept[size_t(g)] = true;
          ++chosen;
        }
      }
      if (chosen > need) {
        why = "more tied groups kept than the band allows";
        return false;
      }
      for (auto it = band.rbegin(); it != band.rend() && chosen < need; ++it)  // band: best group first
        if (!kept[size_t(*it)]) {
          kept[size_t(*it)] = true;
          ++chosen;
        }
      kept_sets.push_back(kept);
    } else {
      std::vector<bool> pick(band.size(), false);
      std::fill(pick.begin(), pick.begin() + need, true);
      std::sort(pick.begin(), pick.end());
      do {
        std::vector<bool> kept(size_t(n_group), false);
        for (int32_t g : sure) kept[size_t(g)] = true;
        for (size_t i = 0; i < band.size(); ++i)
          if (pick[i]) kept[size_t(band[i])] = true;
        kept_sets.push_back(kept);
      } while (std::next_permutation(pick.begin(), pick.end()));
    }
  }

  for (const auto& kept : kept_sets) {
    std::vector<int32_t> cand;
    for (int64_t e = 0; e < E; ++e)
      if (kept[size_t(e / size)]) cand.push_back(int32_t(e));
    std::sort(cand.begin(), cand.end(), [&](int32_t a, int32_t b) { return ranks_before(key, a, b); });
    bool ok = int64_t(cand.size()) >= k;
    for (int64_t j = 0; ok && j < k; ++j) {
      const int32_t id = got[j];
      ok = id >= 0 && id < E && kept[size_t(id / size)] &&
           (id == cand[size_t(j)] || near_tie(key[size_t(id)], key[size_t(cand[size_t(j)])]));
    }
    if (ok) return true;
  }
  why = "not a near-tie";
  return false;
}

struct SigmoidStats {
  double max_rel = 0;
  int64_t rows = 0, near_tie_rows = 0;
};

// Sigmoid: ids exactly except proven near-ties; weights of the chosen experts; sums; flags.
void check_sigmoid(const Problem& pr, const GpuOutput& got, SigmoidStats& stats) {
  const TopK ref = route_ref(pr.logits.data(), pr.tokens, pr.experts, pr.topk, pr.routing, pr.bias_or_null());
  Failures fail(pr.str());
  const int64_t k = pr.topk;
  stats.rows += pr.tokens;
  for (int64_t t = 0; t < pr.tokens; ++t) {
    const int32_t* g = got.ids.data() + t * k;
    const int32_t* r = ref.ids.data() + t * k;
    check_distinct_in_range(pr, got, t, fail);
    std::vector<double> expected(ref.weights.begin() + t * k, ref.weights.begin() + (t + 1) * k);
    if (!std::equal(g, g + k, r)) {
      std::string why;
      if (!explained_by_near_ties(pr, t, g, why)) {
        fail.add("token " + std::to_string(t) + ": ids " + row_str(g, k) + ", expected " + row_str(r, k) + " (" +
                 why + ")");
        continue;
      }
      ++stats.near_tie_rows;
      expected = sigmoid_weights(pr, t, g);
    }
    for (int64_t j = 0; j < k; ++j) {
      const size_t i = size_t(t * k + j);
      if (!weight_close(got.weights[i], expected[size_t(j)], stats.max_rel))
        fail.add("token " + std::to_string(t) + " slot " + std::to_string(j) + ": weight " +
                 std::to_string(got.weights[i]) + ", expected " + std::to_string(expected[size_t(j)]));
    }
  }
  check_row_sums(pr, ref, got, fail);
  check_flags(pr, got, fail);
}

void expect_few_near_ties(const SigmoidStats& s) {
  std::printf("[ route    ] sigmoid: %lld rows, %lld near-tie rows, max weight rel err %.3g\n",
              static_cast<long long>(s.rows), static_cast<long long>(s.near_tie_rows), s.max_rel);
  EXPECT_LE(s.near_tie_rows, 2 + s.rows / 500) << "fp32 and double scores disagree far too often";
}

// ---------------------------------------------------------------------------------------------
// Softmax.

TEST(RouteTopkGpu, SoftmaxMatchesReferenceAcrossShapes) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  Rng rng(seed);
  double max_rel = 0;
  bool pdl = false;
  for (int64_t E : {8, 64, 256, 512})
    for (int64_t k : {1, 2, 8, 16})
      for (int64_t T : {1, 3, 17, 128, 1000})
        for (float cap : {0.0f, 2.5f})  // 2.5: strongly saturating; capped logits stay within 2.5
          for (bool renorm : {true, false}) {
            if (k > E) continue;
            Problem pr;
            pr.tokens = T;
            pr.experts = E;
            pr.topk = k;
            pr.routing = softmax_routing(renorm, cap, renorm ? 1.75f : 0.625f);
            pr.logits = random_logits(rng, T, E, 3.0, /*allow_wide=*/true);
            SCOPED_TRACE(pr.str());
            pdl = !pdl;
            const GpuOutput got = run_gpu(pr, pdl);
            max_rel = std::max(max_rel, check_softmax(pr, got));
          }
  std::printf("[ route    ] softmax: max weight rel err %.3g\n", max_rel);
}

TEST(RouteTopkGpu, SoftmaxRealisticSoftcap) {
  // A Grok-like router: soft-cap 30 over logits of unit scale (capped values stay small, so fp32
  // keeps 2e-6; near |capped| = 30 fp32 itself has only ~1e-6 absolute resolution).
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  Rng rng(seed);
  double max_rel = 0;
  for (auto [E, k] : {std::pair<int64_t, int64_t>{8, 2}, {64, 8}, {256, 16}})
    for (bool renorm : {true, false}) {
      Problem pr;
      pr.tokens = 1000;
      pr.experts = E;
      pr.topk = k;
      pr.routing = softmax_routing(renorm, 30.0f, 1.0f);
      pr.logits.resize(size_t(pr.tokens * E));
      for (auto& l : pr.logits) l = float(rng.normal());
      SCOPED_TRACE(pr.str());
      max_rel = std::max(max_rel, check_softmax(pr, run_gpu(pr, true)));
    }
  std::printf("[ route    ] softmax cap 30: max weight rel err %.3g\n", max_rel);
}

TEST(RouteTopkGpu, SoftmaxSpecialValuesByHand) {
  LOOM_REQUIRE_GPU();
  const int64_t E = 8, k = 3;
  const float z = 0.0f, nz = -0.0f;
  const std::vector<float> rows = {
      nz,    z,     -1,    nz,    z,     -2,    -3,    -4,     // 0: -0 ties +0: ids 0 1 3
      kNaN,  kNaN,  kNaN,  kNaN,  kNaN,  kNaN,  kNaN,  kNaN,   // 1: all NaN: ids 0 1 2, weights 0
      -kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf,  // 2: no mass: weights 0 (no cap)
      kNaN,  -kInf, 2,     kInf,  kNaN,  kInf,  kInf,  -1,     // 3: +inf share the mass: 3 5 6
      kNaN,  -kInf, kNaN,  -kInf, kNaN,  kNaN,  kNaN,  kNaN,   // 4: NaN below -inf: 1 3 0
      1,     1,     1,     1,     1,     1,     1,     1,      // 5: all equal: 0 1 2, weights 1/8
  };
  const std::vector<std::vector<int32_t>> ids = {{0, 1, 3}, {0, 1, 2}, {0, 1, 2}, {3, 5, 6}, {1, 3, 0}, {0, 1, 2}};
  for (float cap : {0.0f, 4.0f})
    for (bool renorm : {false, true}) {
      Problem pr;
      pr.tokens = 6;
      pr.experts = E;
      pr.topk = k;
      pr.routing = softmax_routing(renorm, cap, 1.0f);
      pr.logits = rows;
      SCOPED_TRACE(pr.str());
      const GpuOutput got = run_gpu(pr, false);
      check_softmax(pr, got);
      for (int64_t t = 0; t < pr.tokens; ++t)
        EXPECT_EQ(std::vector<int32_t>(got.ids.begin() + t * k, got.ids.begin() + (t + 1) * k), ids[size_t(t)])
            << "token " << t;
      EXPECT_EQ(got.flags, (std::vector<uint8_t>{0, 1, 0, 1, 1, 0}));
      // Row 1: all NaN -> weights 0, never NaN.
      for (int j = 0; j < k; ++j) EXPECT_EQ(got.weights[size_t(1 * k + j)], 0.0f);
      // Row 2: all -inf: no mass without the cap; with it every logit becomes -cap, all equal.
      for (int j = 0; j < k; ++j)
        EXPECT_FLOAT_EQ(got.weights[size_t(2 * k + j)], cap == 0 ? 0.0f : renorm ? 1.0f / 3 : 1.0f / 8);
      // Row 3 without the cap: three +inf share everything.
      if (cap == 0) {
        for (int j = 0; j < k; ++j) EXPECT_FLOAT_EQ(got.weights[size_t(3 * k + j)], 1.0f / 3);
      }
      // Row 5: all equal logits.
      for (int j = 0; j < k; ++j) EXPECT_FLOAT_EQ(got.weights[size_t(5 * k + j)], renorm ? 1.0f / 3 : 1.0f / 8);
    }
}

// ---------------------------------------------------------------------------------------------
// Sigmoid.

struct GroupCase {
  int64_t experts;
  int n_group, topk_group;
  int64_t topk;
};

TEST(RouteTopkGpu, SigmoidMatchesReferenceAcrossShapes) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  Rng rng(seed);
  std::vector<GroupCase> cases;
  for (int64_t E : {8, 64, 256, 512})
    for (int64_t k : {1, 2, 8, 16})
      if (k <= E) cases.push_back({E, 1, 1, k});
  // Grouped: DeepSeek-V3 (256 / 8 groups / keep 4 / k 8), and every shape of the group stage:
  // 2..32 lanes per group, one-expert and two-expert groups, more groups than lanes.
  cases.insert(cases.end(), {{256, 8, 4, 8},
                             {64, 4, 2, 2},
                             {512, 16, 3, 16},
                             {256, 2, 1, 16},
                             {8, 8, 3, 2},
                             {64, 32, 5, 8},
                             {512, 64, 8, 16},
                             {64, 64, 40, 16},
                             {512, 512, 100, 16},
                             {512, 256, 7, 1}});
  SigmoidStats stats;
  bool pdl = true;
  for (const GroupCase& c : cases)
    for (int64_t T : {1, 3, 17, 128, 1000})
      for (bool renorm : {true, false})
        for (bool with_bias : {true, false}) {
          Problem pr;
          pr.tokens = T;
          pr.experts = c.experts;
          pr.topk = c.topk;
          pr.routing = sigmoid_routing(c.n_group, c.topk_group, renorm, renorm ? 2.5f : 0.75f);
          pr.logits = random_logits(rng, T, c.experts, 2.0, /*allow_wide=*/false);
          if (with_bias) pr.bias = random_bias(rng, c.experts);
          SCOPED_TRACE(pr.str());
          pdl = !pdl;
          check_sigmoid(pr, run_gpu(pr, pdl), stats);
        }
  expect_few_near_ties(stats);
}

TEST(RouteTopkGpu, SigmoidSpecialValues) {
  // NaN / +-inf logits and biases, all-NaN rows, exact ties, logits far below fp32's exp range
  // (-150: the reference's weights are tiny but renormalise to ordinary values). Distinct logits
  // that far down would all score 0 in fp32 and tie, where the double reference still orders
  // them, so such rows use one value.
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  Rng rng(seed);
  const int64_t E = 16, T = 64;
  SigmoidStats stats;
  for (auto [n_group, topk_group, k] : {std::tuple<int, int, int64_t>{1, 1, 4}, {4, 2, 4}, {8, 3, 5}, {16, 5, 5}})
    for (bool renorm : {true, false})
      for (int bias_kind = 0; bias_kind < 3; ++bias_kind) {
        Problem pr;
        pr.tokens = T;
        pr.experts = E;
        pr.topk = k;
        pr.routing = sigmoid_routing(n_group, topk_group, renorm, 1.5f);
        pr.logits.resize(size_t(T * E));
        for (int64_t t = 0; t < T; ++t) {
          float* row = pr.logits.data() + t * E;
          const int kind = int(t % 8);
          for (int64_t e = 0; e < E; ++e) {
            float v = float(2.0 * rng.normal());
            if (kind == 1 && rng.below(3) == 0) v = kNaN;
            if (kind == 2) v = kNaN;
            if (kind == 3 && rng.below(3) == 0) v = rng.below(2) ? kInf : -kInf;
            if (kind == 4 && rng.below(4) != 0) v = -150.0f;  // expf(150) overflows; double does not
            if (kind == 5) v = float(int(rng.below(3)) - 1);          // exact ties
            if (kind == 6) v = rng.below(2) ? 0.0f : -0.0f;           // all tie at 0.5
            if (kind == 7) v = -kInf;                                 // no weight at all
            row[e] = v;
          }
        }
        if (bias_kind == 1) pr.bias = random_bias(rng, E);
        if (bias_kind == 2) {  // NaN and infinite biases too
          pr.bias = random_bias(rng, E);
          pr.bias[1] = kNaN;
          pr.bias[6] = kInf;
          pr.bias[11] = -kInf;
        }
        SCOPED_TRACE(pr.str());
        check_sigmoid(pr, run_gpu(pr, bias_kind == 1), stats);
      }
  expect_few_near_ties(stats);
}

TEST(RouteTopkGpu, SigmoidGroupStageByHand) {
  // route_ref's documented cases: a group scores the sum of its two best; a NaN among them sinks it.
  LOOM_REQUIRE_GPU();
  auto logit_of = [](double p) { return float(std::log(p / (1.0 - p))); };
  Problem pr;
  pr.tokens = 2;
  pr.experts = 4;
  pr.topk = 2;
  pr.routing = sigmoid_routing(2, 1, false, 1.0f);
  pr.logits = {logit_of(0.9), logit_of(0.1), logit_of(0.6), logit_of(0.6),   // max 0.9 loses to 0.6 + 0.6
               kNaN,          logit_of(0.9), logit_of(0.25), logit_of(0.2)};  // NaN group ranks last
  const GpuOutput got = run_gpu(pr, false);
  EXPECT_EQ(got.ids, (std::vector<int32_t>{2, 3, 2, 3}));
  EXPECT_NEAR(got.weights[0], 0.6, 1e-6);
  EXPECT_NEAR(got.weights[3], 0.2, 1e-6);
  EXPECT_EQ(got.flags, (std::vector<uint8_t>{0, 1}));
}

// ---------------------------------------------------------------------------------------------
// Launch behaviour.

TEST(RouteTopkGpu, ZeroTokensLaunchesNothing) {
  LOOM_REQUIRE_GPU();
  cudaStream_t stream;
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  RouteTopkParams p;  // every pointer null: a launch would fault or fail
  p.tokens = 0;
  p.experts = 256;
  p.topk = 8;
  p.routing = sigmoid_routing(8, 4, true, 1.0f);
  LOOM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  launch_route_topk(p, stream, true);
  launch_route_topk(p, stream, false);
  cudaGraph_t graph;
  LOOM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  size_t nodes = 123;
  LOOM_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
  EXPECT_EQ(nodes, 0u);
  LOOM_CUDA_CHECK(cudaGraphDestroy(graph));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  LOOM_CUDA_CHECK(cudaStreamDestroy(stream));
}

// A producer that lets its dependents launch at once, then writes the logits late; a consumer
// that copies the routing out after its own wait. With PDL the routing kernel starts while the
// producer spins: only its griddepcontrol.wait keeps it from reading the stale (all-NaN) logits.
__global__ void late_copy_kernel(const float* src, float* dst, int64_t n, long long spin_cycles) {
  ptx::pdl_wait();
  ptx::pdl_launch_dependents();
  const long long start = clock64();
  while (clock64() - start < spin_cycles) {
  }
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

__global__ void copy_routing_kernel(const int32_t* ids, const float* weights, const uint8_t* flags, int32_t* ids_out,
                                    float* weights_out, uint8_t* flags_out, int64_t n, int64_t tokens) {
  ptx::pdl_wait();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    ids_out[i] = ids[i];
    weights_out[i] = weights[i];
    if (i < tokens) flags_out[i] = flags[i];
  }
}

TEST(RouteTopkGpu, PdlChainWaitsForProducerAndFeedsConsumer) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  Rng rng(seed);
  cudaStream_t stream;
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (Scoring scoring : {Scoring::softmax, Scoring::sigmoid}) {
    Problem pr;
    pr.tokens = 512;
    pr.experts = 256;
    pr.topk = 8;
    pr.routing = scoring == Scoring::softmax ? softmax_routing(true, 0.0f, 1.0f) : sigmoid_routing(8, 4, true, 2.5f);
    pr.logits = random_logits(rng, pr.tokens, pr.experts, 2.0, false);
    if (scoring == Scoring::sigmoid) pr.bias = random_bias(rng, pr.experts);
    SCOPED_TRACE(pr.str());
    const int64_t n = pr.tokens * pr.topk;
    const DeviceBuffer staged = DeviceBuffer::from(pr.logits), bias = DeviceBuffer::from(pr.bias);
    const DeviceBuffer logits = DeviceBuffer::from(std::vector<float>(pr.logits.size(), kNaN));
    const Outputs routed(pr.tokens, pr.topk), copied(pr.tokens, pr.topk);
    launch_kernel(late_copy_kernel, dim3(8), dim3(256), 0, stream, false, staged.as<float>(), logits.as<float>(),
                  int64_t(pr.logits.size()), 2000000LL);  // ~1 ms
    launch_route_topk(params(pr, logits, bias, routed), stream, true);
    launch_kernel(copy_routing_kernel, dim3(16), dim3(256), 0, stream, true, routed.ids.as<int32_t>(),
                  routed.weights.as<float>(), routed.flags.as<uint8_t>(), copied.ids.as<int32_t>(),
                  copied.weights.as<float>(), copied.flags.as<uint8_t>(), n, pr.tokens);
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (scoring == Scoring::softmax) {
      check_softmax(pr, routed.fetch());
      check_softmax(pr, copied.fetch());
    } else {
      SigmoidStats stats;
      check_sigmoid(pr, routed.fetch(), stats);
      check_sigmoid(pr, copied.fetch(), stats);
    }
  }
  LOOM_CUDA_CHECK(cudaStreamDestroy(stream));
}

#endif  // LOOM_ROUTE_GPU_TESTS

}  // namespace
}  // namespace loom
