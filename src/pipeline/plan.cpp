// plan(): validate the shape, decide once what every batch size launches (the buckets), size the
// workspace for it; describe(); the device a plan is made for.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>

#include "common/device_info.hpp"
#include "contract/device_layout.hpp"
#include "dispatch/dispatch_quant_sm90.cuh"
#include "dispatch/dispatch_sm90.cuh"
#include "dispatch/route_dispatch_small_sm90.cuh"
#include "gemm/gemm_fp8.hpp"
#include "gemm/select/choose.hpp"
#include "loom/loom.hpp"
#include "pipeline/moe_pipeline.hpp"
#include "pipeline/plan_buckets.hpp"
#include "quant/quant_ref.hpp"

namespace loom {

// The BF16 kernels' names where a config key would be: tokens on M (the default, prefill) and
// weights on M (decode; by key only: measured no faster than tokens on M, journal session 48).
constexpr const char* kBf16GemmName = "bf16.tM.128x256";
constexpr const char* kBf16DecodeName = "bf16.wM.64x64";

bool is_bf16_key(const std::string& k) { return k.empty() || k == kBf16GemmName || k == kBf16DecodeName; }

namespace {

// Routes from which the routing kernel hands dispatch+quantise its token masks (counting the ids
// in every CTA's shared memory was slower from there on).
constexpr int64_t kTokenMasksMinRoutes = 4096;
// Token counts up to which plan() decides every batch size on its own; above, where every choice
// is monotone in T, it finds the next change by doubling steps and bisection.
constexpr int64_t kExactBucketTokens = 16384;

DeviceInfo device_info(const DeviceSpec& d) {
  DeviceInfo i;
  i.name = d.name;
  i.major = d.major;
  i.minor = d.minor;
  i.sm_count = d.sm_count;
  i.l2_bytes = d.l2_bytes;
  i.smem_per_block_optin = d.smem_per_block;
  return i;
}

// Why a config whose combine is not the options' cannot run.
std::string combine_mismatch(bool deterministic) {
  return deterministic ? "reduces into the output: the deterministic combine needs a config that stores rows"
                       : "stores route rows: the fast combine needs a config that reduces";
}

// Everything a batch of `tokens` launches, routed from logits or from precomputed ids.
Launches decide(const Shape& s, const Routing& r, const Options& o, const DeviceInfo& dev,
                const std::optional<GemmConfig>& override_config, int64_t tokens, bool from_logits) {
  Launches l;
  Chain& c = l.chain;
  const int T = int(tokens), k = int(s.topk), E = int(s.experts);
  c.fused_route_dispatch = from_logits && o.fuse_small_batch && route_dispatch_small_fits(T, k, E, r);
  // The routes can reach the GEMM in expert bins (routes from logits, fast combine, not fused).
  const bool bins_possible = from_logits && !c.fused_route_dispatch && !o.deterministic && o.expert_bins;
  GemmProblem pr;
  pr.tokens = tokens;
  pr.topk = s.topk;
  pr.experts = s.experts;
  pr.n = s.inter;
  pr.k = s.hidden;
  pr.deterministic = o.deterministic;
  pr.routes_in_bins = bins_possible;
  l.gemm = override_config ? *override_config : choose_gemm_config(pr, dev);
  l.combine_rows = o.deterministic;
  auto fail = [&](const std::string& why) {
    l.error = "gemm_config " + key(l.gemm) + " " + why;
    return l;
  };
  if (combine_stores_rows(l.gemm) != o.deterministic)
    return fail(combine_mismatch(o.deterministic));
  const XSource xs = x_source(l.gemm);
  if (xs == XSource::sorted_fragments)
    return fail("reads the ffn intermediate's sorted rows in fragment order: ffn GEMM 2 only");
  c.sorted_rows = xs == XSource::sorted_rows;
  c.quant_with_route = from_logits && !c.sorted_rows;
  WeightsOnMConfig* wm = std::get_if<WeightsOnMConfig>(&l.gemm);
  const bool reads_bins = std::holds_alternative<ResidentConfig>(l.gemm) ||
                          std::holds_alternative<TokensOnMConfig>(l.gemm) || (wm && wm->rows == WmRows::bins);
  c.expert_bins = bins_possible && reads_bins;
  if (wm && wm->rows == WmRows::bins && !c.expert_bins)
    return fail("reads expert bins: routes from router logits, the fast combine and Options::expert_bins");
  if (std::holds_alternative<ResidentConfig>(l.gemm) && o.deterministic)
    return fail("combines by bulk reductions only (fast combine)");
  // Routes from logits have distinct ids per token, which the fused kernel's token masks need.
  c.dispatch_with_quant = from_logits && c.sorted_rows && !c.fused_route_dispatch && dispatch_quant_fits(T, k, E);
  c.token_masks = c.dispatch_with_quant && tokens * s.topk >= kTokenMasksMinRoutes;
  c.dispatch_small = o.fuse_small_batch && dispatch_small_fits(T, k, E);
  if (wm) {
    // The fused small kernel lists the experts with rows (a hit list); for a few routes routed by
    // one CTA it also publishes their ids as ranked, and the gathering GEMM's compact walk starts
    // its weight loads on them before its PDL wait.
    const bool early_possible = c.fused_route_dispatch && tokens * s.topk <= kEarlyIdWords &&
                                route_dispatch_small_ctas(T) == 1 && !wm->dense;
    if (wm->rows == WmRows::gather && early_possible && !override_config) wm->rows = WmRows::early;
    if (wm->rows == WmRows::early && !early_possible)
      return fail("starts on early expert ids: softmax routes from logits, at most " + std::to_string(kEarlyIdWords) +
                  " routes on one routing CTA, a compact walk");
    c.early_ids = wm->rows == WmRows::early;
    // The producer's dry walk: under PDL, where the walk's indices are valid before the wait.
    wm->warm_up = wm->warm_up && o.pdl && (wm->dense || c.fused_route_dispatch || wm->rows == WmRows::bins);
    if (wm->rows != WmRows::sorted && tokens > kGatherMaxTokens && wm->rows != WmRows::bins)
      return fail("gathers by token: batches of at most " + std::to_string(kGatherMaxTokens) +
                  " tokens (or from expert bins)");
  }
  return l;
}

// ffn: GEMM 1 is decided as a single-mode GEMM of N = 2I that stores rows (the intermediate needs
// each sorted row's gate and up values, unweighted), from sorted-row offsets (no expert bins);
// GEMM 2 reads the intermediate as expert-sorted rows: where the chooser takes tokens on M, their
// sorted-row instance (the intermediate in fragment order), else weights on M on sorted rows;
// reducing into the fp32 accumulator (fast) or storing weighted rows (deterministic).
Launches decide_ffn(const Shape& s, const Routing& r, const Options& o, const DeviceInfo& dev,
                    const std::optional<GemmConfig>& override_config, int64_t tokens, bool from_logits) {
  Shape s1 = s;
  s1.mode = Mode::single;
  s1.inter = 2 * s.inter;
  Options o1 = o;
  o1.deterministic = true;
  o1.expert_bins = false;
  // A fused-intermediate override (tM.wide...act) is decided as its row-storing twin, then put back;
  // so is a weights-on-M override that reduces (over split K or balanced shares: the partial sums
  // meet in h's sorted rows, GemmFp8Params::reduce_rows), fast combine only (float atomics).
  // Without an override, the fast combine: GEMM 1 splits K where the single-mode chooser would (fewer
  // (expert, 128-row) units than SMs; its partial sums meet in h, which the glue clears). Balanced
  // shares, the chooser's other reducing walk, measured no faster than storing (session 45's journal).
  std::optional<GemmConfig> given = override_config;
  if (!given && !o.deterministic) {
    Options of = o1;
    of.deterministic = false;
    const Launches fast = decide(s1, r, of, dev, std::nullopt, tokens, from_logits);
    if (const auto* wm = std::get_if<WeightsOnMConfig>(&fast.gemm); fast.error.empty() && wm && wm->split_k > 1)
      given = *wm;
  }
  std::optional<GemmConfig> g1 = given;
  const bool act_override = override_config && fused_act(*override_config);
  if (act_override) {
    TokensOnMConfig twin = std::get<TokensOnMConfig>(*override_config);
    twin.act = false;
    twin.store = true;
    g1 = twin;
  }
  const auto* wm_over = given ? std::get_if<WeightsOnMConfig>(&*given) : nullptr;
  bool reduce_override = wm_over && !wm_over->store;
  if (reduce_override) {
    WeightsOnMConfig twin = *wm_over;
    twin.store = true;
    twin.split_k = 1;
    twin.balanced = false;
    g1 = twin;
  }
  Launches l = decide(s1, r, o1, dev, g1, tokens, from_logits);
  if (!override_config && given && !l.error.empty()) {  // the chooser's split cannot run: store instead
    l = decide(s1, r, o1, dev, std::nullopt, tokens, from_logits);
    reduce_override = false;
  }
  l.ffn = true;
  // A twin's failure is the override's: say so by the key it was given.
  if (g1 && override_config && !l.error.empty()) {
    const std::string twin_key = key(*g1), given_key = key(*override_config);
    if (const size_t at = l.error.find(twin_key); at != std::string::npos) l.error.replace(at, twin_key.size(), given_key);
  }
  if (reduce_override && l.error.empty()) {
    WeightsOnMConfig back = std::get<WeightsOnMConfig>(l.gemm);  // with what decide() settled (rows, warm-up)
    back.store = false;
    back.split_k = wm_over->split_k;
    back.balanced = wm_over->balanced;
    try {
      if (o.deterministic)
        throw Error("GEMM 1 reduces its partial sums with float atomics: the deterministic combine needs one "
                    "that stores rows");
      validate(back);
      check_shape(back, 2 * s.inter, s.hidden, s.experts, tokens);
      l.gemm = back;
    } catch (const Error& e) {
      if (override_config) l.error = "gemm_config " + key(*override_config) + ": " + e.what();
      // else the chooser's split cannot run: l.gemm stays its row-storing twin
    }
  }
  // GEMM 1 stores its rows and the intermediate's kernel follows: on the H200 that measured faster
  // than the fused epilogue at every batch the chooser gives token tiles (journal, session 43). The
  // fused epilogue runs when asked for by key.
  if (act_override && l.error.empty()) {
    try {
      check_shape(*override_config, 2 * s.inter, s.hidden, s.experts, tokens);
      l.gemm = *override_config;
    } catch (const Error& e) {
      l.error = "gemm_config " + key(*override_config) + ": " + e.what();
    }
  }
  l.combine_rows = o.deterministic;
  GemmProblem p2;
  p2.tokens = tokens;
  p2.topk = s.topk;
  p2.experts = s.experts;
  p2.n = s.hidden;
  p2.k = s.inter;
  p2.deterministic = o.deterministic;
  const GemmConfig chosen = choose_gemm_config(p2, dev);
  if (!o.gemm2_config.empty()) {
    l.gemm2 = parse_gemm_key(o.gemm2_config);
  } else if (const auto* tm = std::get_if<TokensOnMConfig>(&chosen)) {
    TokensOnMConfig g2 = *tm;
    g2.sorted = true;
    l.gemm2 = g2;
  } else {
    p2.allow_tokens_on_m = false;
    WeightsOnMConfig g2 = std::get<WeightsOnMConfig>(choose_gemm_config(p2, dev));
    // The chooser's walk: compact (the experts with rows) unless nearly every expert has rows; a
    // dense walk of mostly empty experts spends a unit's round trip on each.
    g2.rows = WmRows::sorted;
    g2.store = o.deterministic;
    g2.balanced = false;
    g2.dynamic = true;
    g2.warm_up = false;
    if (g2.store) g2.split_k = 1;
    l.gemm2 = g2;
  }
  if (l.error.empty()) {
    try {
      validate(l.gemm2);
      const XSource xs2 = x_source(l.gemm2);
      if (xs2 != XSource::sorted_rows && xs2 != XSource::sorted_fragments)
        throw Error("GEMM 2 reads the intermediate by sorted row: a wM.sorted or tM.<tall|wide>.sorted config");
      if (combine_stores_rows(l.gemm2) != o.deterministic)
        throw Error(combine_mismatch(o.deterministic));
      if (const auto* wm = std::get_if<WeightsOnMConfig>(&l.gemm2); wm && wm->balanced)
        throw Error("balanced shares are for gathered rows");
      check_shape(l.gemm2, s.hidden, s.inter, s.experts, tokens * s.topk);
    } catch (const Error& e) {
      l.error = "ffn GEMM 2 (" + key(l.gemm2) + "): " + e.what();
    }
  }
  return l;
}

// dtype bf16 (the ffn layer): routing (from logits), the dispatch, the gather of the bf16 rows
// into expert-sorted order, GEMM 1 with the SiLU*up epilogue, GEMM 2 storing bf16 route rows, and
// the combine (bitwise deterministic in both modes until a reducing epilogue lands). The GEMMs run
// on single CTAs or, by key, on CTA pairs sharing the weights; GEMM 1 reads the gather's sorted
// copy or, by key, the hidden rows by token.
Launches decide_bf16(const Shape& s, const Options& o, int64_t tokens) {
  Launches l;
  l.ffn = true;
  l.bf16 = true;
  l.bf16_weights_on_m = o.gemm_config == kBf16DecodeName;
  l.combine_rows = true;
  l.chain.sorted_rows = true;  // the gather writes the sorted copy GEMM 1 reads
  l.chain.dispatch_small = o.fuse_small_batch && dispatch_small_fits(int(tokens), int(s.topk), int(s.experts));
  return l;
}

bool same(const Launches& a, const Launches& b) {
  return a.chain == b.chain && key(a.gemm) == key(b.gemm) && a.combine_rows == b.combine_rows && a.error == b.error &&
         a.ffn == b.ffn && a.bf16 == b.bf16 && a.bf16_weights_on_m == b.bf16_weights_on_m &&
         (!a.ffn || key(a.gemm2) == key(b.gemm2));
}

std::vector<PlanBuckets::Bucket> make_buckets(const Shape& s, const Routing& r, const Options& o,
                                              const DeviceInfo& dev, const std::optional<GemmConfig>& override_config) {
  auto one = [&](int64_t t, bool from_logits) {
    if (s.dtype == DType::bf16) return decide_bf16(s, o, t);
    return s.mode == Mode::ffn ? decide_ffn(s, r, o, dev, override_config, t, from_logits)
                               : decide(s, r, o, dev, override_config, t, from_logits);
  };
  auto at = [&](int64_t t) { return std::pair{one(t, true), one(t, false)}; };
  auto equal = [](const std::pair<Launches, Launches>& a, const std::pair<Launches, Launches>& b) {
    return same(a.first, b.first) && same(a.second, b.second);
  };
  std::vector<PlanBuckets::Bucket> out;
  int64_t t = 1;
  while (t <= s.tokens) {
    const auto here = at(t);
    int64_t last = t;
    if (t < kExactBucketTokens) {
      const int64_t stop = std::min(s.tokens, kExactBucketTokens - 1);
      while (last < stop && equal(at(last + 1), here)) ++last;
    } else {
      int64_t step = 1, beyond = s.tokens + 1;  // the first count known to differ (or past the end)
      while (last + step <= s.tokens) {
        if (!equal(at(last + step), here)) {
          beyond = last + step;
          break;
        }
        last += step;
        step *= 2;
      }
      while (beyond - last > 1) {
        const int64_t mid = last + (beyond - last) / 2;
        if (equal(at(mid), here))
          last = mid;
        else
          beyond = mid;
      }
    }
    out.push_back(PlanBuckets::Bucket{t, last, here.first, here.second});
    t = last + 1;
  }
  return out;
}

// Buffers start on 1 KiB boundaries (TMA needs 16 B; 1 KiB keeps every carve-up simple).
size_t carve(size_t& cursor, size_t bytes) {
  const size_t at = cursor;
  cursor += (bytes + 1023) / 1024 * 1024;
  return at;
}

}  // namespace

DeviceSpec current_device() {
  std::string why;
  const auto dev = query_device(&why);
  if (!dev) throw CudaError("no GPU: " + why);
  return DeviceSpec{dev->name, dev->major, dev->minor, dev->sm_count, dev->l2_bytes, dev->smem_per_block_optin};
}

DeviceSpec device_spec(const std::string& name) {
  // As cudaGetDeviceProperties reports them for the SXM parts.
  if (name == "h200") return DeviceSpec{"NVIDIA H200 (described)", 9, 0, 132, int64_t(60) << 20, 227 * 1024};
  if (name == "h100") return DeviceSpec{"NVIDIA H100 80GB HBM3 (described)", 9, 0, 132, int64_t(50) << 20, 227 * 1024};
  throw Error("unknown device '" + name + "' (known: h200, h100)");
}

Plan plan(const Shape& s, const Routing& r, const Options& o) { return plan(s, r, o, current_device()); }

namespace {
Plan make_plan(const Shape& s, const Routing& r, const Options& o, const DeviceSpec& device);
}  // namespace

Plan plan(const Shape& s, const Routing& r, const Options& o, const DeviceSpec& device) {
  validate(s);
  validate(r, s);
  return make_plan(s, r, o, device);
}

Plan plan_routed(const Shape& s, const Options& o, const DeviceSpec& device) {
  Shape v = s;  // every check but topk <= experts: the slots of a row need not be distinct experts
  v.topk = std::min(s.topk, s.experts);
  validate(v);
  return make_plan(s, Routing{}, o, device);
}

namespace {

Plan make_plan(const Shape& s, const Routing& r, const Options& o, const DeviceSpec& device) {
  const bool bf16 = s.dtype == DType::bf16;
  if (bf16 && s.mode != Mode::ffn)
    throw Error("dtype bf16 runs the ffn layer (mode ffn); the one-GEMM single mode is fp8 only");
  if (bf16 && (!is_bf16_key(o.gemm_config) || !o.gemm2_config.empty()))
    throw Error(std::string("the bf16 layer's GEMM configs are ") + kBf16GemmName + " and " + kBf16DecodeName +
                " (gemm_config; both GEMMs), got gemm_config '" + o.gemm_config + "', gemm2_config '" +
                o.gemm2_config + "'");
  if (s.experts > kGpuMaxExperts)
    throw Error("experts = " + std::to_string(s.experts) + " exceeds the GPU limit " + std::to_string(kGpuMaxExperts));
  if (s.topk > kGpuMaxTopk)
    throw Error("topk = " + std::to_string(s.topk) + " exceeds the GPU limit " + std::to_string(kGpuMaxTopk));
  if (device.major != 9) throw Error("loom's kernels are built for sm_90a; device " + device.name + " is not sm_90");
  if (device.sm_count < 1 || device.l2_bytes < 1) throw Error("device " + device.name + ": no SM count or L2 size");
  const DeviceInfo dev = device_info(device);
  if (!o.gemm2_config.empty() && s.mode != Mode::ffn)
    throw Error("gemm2_config is ffn GEMM 2's: single mode has one GEMM (gemm_config)");
  std::optional<GemmConfig> override_config;
  if (!o.gemm_config.empty() && !bf16) {
    override_config = parse_gemm_key(o.gemm_config);  // ffn: GEMM 1's
    check_shape(*override_config, s.mode == Mode::ffn ? 2 * s.inter : s.inter, s.hidden, s.experts, s.tokens);
  }

  Plan p;
  p.shape = s;
  p.routing = r;
  p.options = o;
  p.sm_count = device.sm_count;
  p.l2_bytes = device.l2_bytes;
  p.device_name = device.name;
  auto buckets = std::make_shared<PlanBuckets>();
  buckets->buckets = make_buckets(s, r, o, dev, override_config);
  // An override the shape or options cannot run at all is an error now, not at the first run.
  bool runnable = false;
  for (const auto& b : buckets->buckets) runnable = runnable || b.from_logits.error.empty() || b.from_ids.error.empty();
  if (!runnable) throw Error(buckets->buckets.front().from_logits.error);

  // What the buckets need of the workspace: activation rows (one per token, or one per route where
  // the sorted copy is read), expert bins, a work queue.
  const bool ffn = s.mode == Mode::ffn;
  const int64_t T = s.tokens, K = s.hidden, N = ffn ? 2 * s.inter : s.inter, R = s.routes(), Rp = padded_rows(R);
  int64_t x_rows = padded_rows(T);
  bool bins = false;
  for (const auto& b : buckets->buckets)
    for (const Launches* l : {&b.from_logits, &b.from_ids}) {
      if (!l->error.empty()) continue;
      if (l->chain.sorted_rows) x_rows = std::max(x_rows, padded_rows(b.last * s.topk));
      bins = bins || l->chain.expert_bins;
    }
  size_t c = 0;
  Plan::Layout& L = p.layout;
  L.topk_ids = carve(c, size_t(R) * 4);
  L.topk_weights = carve(c, size_t(R) * 4);
  L.nan_flags = carve(c, size_t(T));
  L.offsets = carve(c, size_t(s.experts + 1) * 4);
  L.route_row = carve(c, size_t(R) * 4);
  L.row_token = carve(c, size_t(R) * 4);
  L.row_weight = carve(c, size_t(R) * 4);
  // fp8: e4m3 codes and their scales; bf16: the rows themselves.
  L.x = carve(c, size_t(x_rows) * size_t(K) * (bf16 ? 2 : 1));
  L.x_scales = carve(c, bf16 ? 0 : size_t(scale_floats(quant_blocks(K), x_rows)) * 4);  // either layout
  // Stored rows: single mode's deterministic combine, ffn GEMM 2's (N = H there).
  // Deterministic: the weighted route rows, fp32 (single mode) or bf16 (ffn GEMM 2's, rounded).
  // bf16: GEMM 2's weighted route rows in bf16 in both modes.
  L.y = carve(c, o.deterministic || bf16 ? size_t(R) * size_t(ffn ? s.hidden : N) * (ffn ? 2 : 4) : 0);
  // The GEMM's work queue (scheduler/work_queue.cuh), and beside it ffn GEMM 2's, so that one clear
  // of 2 kWorkQueueWords words resets both.
  L.gemm_queue = carve(c, 2 * kWorkQueueWords * sizeof(int32_t));
  L.hit_list = carve(c, size_t(s.experts + 1) * 16);  // experts with rows, from the fused small kernel
  L.early_ids = carve(c, size_t(kEarlyIdWords) * 4);  // ... and the routes' ids as soon as ranked
  L.token_masks = carve(c, size_t((T + 31) / 32) * size_t(s.experts) * 4);  // routing -> dispatch+quantise
  L.slice_counts = carve(c, dispatch_slice_count_bytes(T, s.topk, s.experts));  // multi-CTA dispatch
  // Expert bins: T slots per expert (ids are distinct per token, so no bin overflows).
  L.bin_stride = bins ? T : 0;
  L.bin_counts = carve(c, L.bin_stride > 0 ? size_t(s.experts) * kBinCountStride * 4 : 0);
  L.bin_token = carve(c, size_t(s.experts) * size_t(L.bin_stride) * 4);
  L.bin_weight = carve(c, size_t(s.experts) * size_t(L.bin_stride) * 4);
  L.status = carve(c, sizeof(LayerStatus));
  // bf16: GEMM 1 writes the intermediate itself, in bf16 (no h, no scales).
  L.h = carve(c, ffn && !bf16 ? size_t(Rp) * size_t(N) * 4 : 0);
  L.act = carve(c, ffn ? size_t(Rp) * size_t(s.inter) * (bf16 ? 2 : 1) : 0);
  L.act_scales = carve(c, ffn && !bf16 ? size_t(scale_floats(quant_blocks(s.inter), Rp)) * 4 : 0);  // either layout
  L.gemm2_queue = L.gemm_queue + kWorkQueueWords * sizeof(int32_t);
  // The fast combine's fp32 accumulator (the deterministic combine writes the bf16 output itself).
  L.acc = carve(c, ffn && !o.deterministic && !bf16 ? size_t(T) * size_t(s.hidden) * 4 : 0);
  L.total = c;
  L.x_rows = x_rows;
  p.buckets = buckets;
  const Launches& top = buckets->buckets.back().from_logits;
  p.gemm_config = top.error.empty() ? top.gemm_key() : "(" + top.error + ")";
  return p;
}

}  // namespace

size_t workspace_bytes(const Plan& p) { return p.layout.total; }

const PlanBuckets::Bucket& PlanBuckets::find(int64_t tokens) const {
  auto it = std::upper_bound(buckets.begin(), buckets.end(), tokens,
                             [](int64_t t, const Bucket& b) { return t < b.first; });
  return *(it - 1);
}

const Launches& launches_for(const Plan& p, int64_t tokens, bool from_logits) {
  if (!p.buckets) throw Error("run: the plan was not made by loom::plan()");
  if (tokens < 1 || tokens > p.shape.tokens)
    throw Error("run: tokens = " + std::to_string(tokens) + " outside the plan's [1, " + std::to_string(p.shape.tokens) +
                "]");
  const PlanBuckets::Bucket& b = p.buckets->find(tokens);
  const Launches& l = from_logits ? b.from_logits : b.from_ids;
  if (!l.error.empty())
    throw Error("run: " + l.error + (from_logits ? " (routes from router logits)" : " (routes from top-k ids)"));
  return l;
}

std::string Chain::dispatch_label() const { return dispatch_with_quant ? "dispatch+quant" : "dispatch"; }

std::string Chain::route_label() const {
  return std::string(expert_bins ? "clear+route" : "route") + (fused_route_dispatch ? "+dispatch" : "") +
         (quant_with_route ? "+quant" : "") + (expert_bins ? "+bins" : "");
}

std::string Launches::gemm_key() const {
  if (bf16) return bf16_weights_on_m ? kBf16DecodeName : kBf16GemmName;
  return key(gemm);
}

std::string Launches::summary(bool from_logits) const {
  if (!error.empty()) return "(cannot run: " + error + ")";
  std::string s;
  auto add = [&](const std::string& x) { s += (s.empty() ? "" : " -> ") + x; };
  if (bf16) {
    if (from_logits) add("route");
    add(chain.dispatch_small ? "dispatch(1 CTA)" : "count+dispatch");
    add("gather(bf16)");
    add("gemm1 " + gemm_key() + " act");
    add("gemm2 " + gemm_key() + " rows");
    add("combine+bf16");
    return s;
  }
  if (from_logits) add(chain.route_label());
  if (!chain.quant_with_route && !chain.sorted_rows) add("quant");
  if (!chain.fused_route_dispatch && !chain.expert_bins)
    add(chain.dispatch_with_quant ? "dispatch+quant" : chain.dispatch_small ? "dispatch(1 CTA)" : "count+dispatch");
  if (chain.sorted_rows && !chain.dispatch_with_quant) add("quant(sorted)");
  add((ffn ? "gemm1 " : "gemm ") + key(gemm));
  if (ffn) {
    if (!fused_act(gemm)) add("silu*up+quant");
    add("gemm2 " + key(gemm2));
  }
  if (combine_rows) add(ffn ? "combine+bf16" : "combine");  // ffn: the combine writes the bf16 output
  else if (ffn) add("bf16");
  return s;
}

std::string describe(const Plan& p) {
  std::ostringstream o;
  o << "shape: " << describe(p.shape) << " (tokens = most per run)\n"
    << "routing: " << describe(p.routing) << "\n"
    << "device: " << p.device_name << ", " << p.sm_count << " SMs, L2 " << (p.l2_bytes >> 20) << " MiB\n"
    << "combine: "
    << (p.options.deterministic || p.shape.dtype == DType::bf16
            ? "deterministic (row stores + slot-order sum, no float atomics)"
            : "fast (reductions into the output from the GEMM epilogue)")
    << "\n"
    << "launch: " << (p.options.pdl ? "programmatic dependent launch" : "plain stream order")
    << (p.options.debug_checks ? ", debug checks after each run" : "") << "\n"
    << "gemm config: " << (p.options.gemm_config.empty() ? "the chooser's" : "override " + p.options.gemm_config)
    << "; at " << p.shape.tokens << " tokens from logits: " << p.gemm_config << "\n"
    << "expert bins: " << (p.layout.bin_stride > 0 ? std::to_string(p.layout.bin_stride) + " slots per expert"
                                                    : std::string("not used by this plan")) << "\n"
    << "workspace: " << p.layout.total << " bytes\n"
    << "launches by token count (from router logits | from top-k ids):\n";
  for (const auto& b : p.buckets->buckets) {
    o << "  T=" << b.first;
    if (b.last > b.first) o << ".." << b.last;
    o << ": " << b.from_logits.summary(true) << " | " << b.from_ids.summary(false) << "\n";
  }
  o << "gemm configs:\n";
  std::vector<std::string> seen;
  if (p.shape.dtype == DType::bf16 && p.gemm_config == kBf16DecodeName)
    o << "  " << p.gemm_config << ": bf16 weights on M, 64 weight rows x 64 of an expert's sorted rows, A and B "
      << "by TMA, 12 stages, fp32 accumulation over K; GEMM 1 SiLU*up into the bf16 intermediate (32 columns' "
      << "gate and up rows a unit), GEMM 2 bf16 route rows, stored by token column\n";
  else if (p.shape.dtype == DType::bf16)
    o << "  " << p.gemm_config << ": bf16 tokens on M, 128 expert rows x 256 weight rows, A and B by TMA, "
      << "3 stages, fp32 accumulation over K; GEMM 1 SiLU*up into the bf16 intermediate, GEMM 2 bf16 route "
      << "rows, both staged in shared memory and stored by TMA\n";
  for (const auto& b : p.buckets->buckets)
    for (const Launches* l : {&b.from_logits, &b.from_ids}) {
      if (!l->error.empty() || l->bf16) continue;
      for (const GemmConfig* g : {&l->gemm, l->ffn ? &l->gemm2 : nullptr}) {
        if (!g) continue;
        const std::string k = key(*g);
        if (std::find(seen.begin(), seen.end(), k) != seen.end()) continue;
        seen.push_back(k);
        o << "  " << k << ": " << describe(*g) << "\n";
      }
    }
  return o.str();
}

}  // namespace loom
