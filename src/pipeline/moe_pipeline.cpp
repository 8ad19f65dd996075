// plan() and run(): the seed pipeline (route + token-order quantise) -> dispatch -> FP8 grouped GEMM
// gathering its rows by token (fused weighted combine, or row stores + deterministic combine),
// chained with PDL.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "common/cuda_check.hpp"
#include "common/device_info.hpp"
#include "dispatch/dispatch_quant_sm90.cuh"
#include "dispatch/dispatch_sm90.cuh"
#include "dispatch/expert_bins_clear_sm90.cuh"
#include "dispatch/route_dispatch_small_sm90.cuh"
#include "gemm/combine_rows_sm90.cuh"
#include "gemm/gemm_fp8.hpp"
#include "loom/loom.hpp"
#include "contract/device_layout.hpp"
#include "pipeline/moe_pipeline.hpp"
#include "quant/quant_gather_sm90.cuh"
#include "quant/quant_ref.hpp"
#include "route/route_quant_sm90.cuh"
#include "route/route_topk_sm90.cuh"

namespace loom {

namespace {

// Routes from which the routing kernel hands dispatch+quantise its token masks (see chain_for).
constexpr int64_t kTokenMasksMinRoutes = 4096;

// The GEMM config for a run of `tokens`. routes_in_bins: the run's routes can reach the GEMM in
// expert bins (routes_through_bins).
GemmFp8Config gemm_config_for(const Shape& s, const Options& o, int64_t tokens, const DeviceInfo& dev,
                              bool routes_in_bins) {
  return choose_gemm_fp8_config(tokens, s.topk, s.experts, s.inter, s.hidden, o.deterministic, dev, true,
                                routes_in_bins);
}

// The largest batch of at most `tokens` whose GEMM reads the expert-sorted copy (0: none): batches
// above kGatherMaxTokens that use_token_fragments leaves to it: sorted rows, then (where K allows)
// wide register tiles, then register tiles, up to the kernel's 32-bit limit, where a largest batch
// may take sorted rows again. So a downward scan; above kTokenFragmentsMinRowsPerExpert rows per
// expert every batch takes fragments if the largest does. Without expert bins (routes from ids), so
// the wide tiles from their higher threshold: the copy then holds every batch either way.
int64_t largest_sorted_batch(const Shape& s, const Options& o, int64_t tokens) {
  auto fragments = [&](int64_t t) { return use_token_fragments(t, s.topk, s.experts, s.hidden); };
  if (tokens <= kGatherMaxTokens) return 0;
  if (!fragments(tokens)) return tokens;
  const int64_t all_fragments_from =
      int64_t(std::ceil(kTokenFragmentsMinRowsPerExpert * double(s.experts) / double(s.topk)));
  for (int64_t t = std::min(tokens, all_fragments_from); t > kGatherMaxTokens; --t)
    if (!fragments(t)) return t;
  return 0;
}

// Whether some batch of at most `tokens` routes into expert bins (Options::expert_bins), with the
// fast combine: the gathering GEMM above kGatherMaxTokens tokens while experts have at most
// kGatherBinsMaxRowsPerExpert rows (so the smallest such batch decides), and the register-loaded
// GEMM, which batches take from a rows-per-expert threshold up to the kernel's 32-bit limit
// (use_token_fragments), so checking the largest batch below that limit suffices.
bool plan_uses_bins(const Shape& s, const Options& o, int64_t tokens) {
  if (!o.expert_bins || o.deterministic) return false;
  const int64_t smallest_above_gather = kGatherMaxTokens + 1;
  if (tokens >= smallest_above_gather &&
      double(smallest_above_gather) * double(s.topk) / double(s.experts) <= kGatherBinsMaxRowsPerExpert)
    return true;
  const int64_t below_limit = std::min(tokens, ((int64_t(1) << 31) - 1) / std::max<int64_t>(s.hidden, 1));
  return use_token_fragments(below_limit, s.topk, s.experts, s.hidden, true);
}

// Buffers start on 1 KiB boundaries (TMA needs 16 B; 1 KiB keeps every carve-up simple).
size_t carve(size_t& cursor, size_t bytes) {
  const size_t at = cursor;
  cursor += (bytes + 1023) / 1024 * 1024;
  return at;
}

template <class T>
T* at(void* ws, size_t offset) {
  return reinterpret_cast<T*>(static_cast<uint8_t*>(ws) + offset);
}

}  // namespace

Plan plan(const Shape& s, const Routing& r, const Options& o) {
  validate(s);
  validate(r, s);
  if (s.mode != Mode::single)
    throw Error("the GPU path runs mode single only for now; ffn mode has the CPU reference (layer_ref) only");
  if (s.dtype != DType::fp8)
    throw Error("the GPU path runs dtype fp8 only for now; bf16 has the CPU reference (layer_ref) only");
  if (s.experts > kGpuMaxExperts)
    throw Error("experts = " + std::to_string(s.experts) + " exceeds the GPU limit " + std::to_string(kGpuMaxExperts));
  if (s.topk > kGpuMaxTopk)
    throw Error("topk = " + std::to_string(s.topk) + " exceeds the GPU limit " + std::to_string(kGpuMaxTopk));
  std::string why;
  const auto dev = query_device(&why);
  if (!dev) throw Error("plan needs a GPU: " + why);
  if (dev->major != 9) throw Error("loom's kernels are built for sm_90a; device " + dev->name + " is not sm_90");

  Plan p;
  p.shape = s;
  p.routing = r;
  p.options = o;
  p.sm_count = dev->sm_count;
  p.l2_bytes = dev->l2_bytes;
  p.device_name = dev->name;
  const int64_t T = s.tokens, Tp = padded_rows(T), K = s.hidden, N = s.inter;
  // Activation rows: one per token, or one per route for the largest batch of the plan that takes
  // the sorted copy (batches above kGatherMaxTokens that use_token_fragments leaves to it).
  const int64_t sorted_tokens = largest_sorted_batch(s, o, T);
  const int64_t R = s.routes();
  const int64_t x_rows = std::max(Tp, sorted_tokens > 0 ? padded_rows(sorted_tokens * s.topk) : int64_t(0));
  size_t c = 0;
  Plan::Layout& L = p.layout;
  L.topk_ids = carve(c, size_t(R) * 4);
  L.topk_weights = carve(c, size_t(R) * 4);
  L.nan_flags = carve(c, size_t(T));
  L.offsets = carve(c, size_t(s.experts + 1) * 4);
  L.route_row = carve(c, size_t(R) * 4);
  L.row_token = carve(c, size_t(R) * 4);
  L.row_weight = carve(c, size_t(R) * 4);
  L.x = carve(c, size_t(x_rows) * size_t(K));
  L.x_scales = carve(c, size_t(scale_floats(quant_blocks(K), x_rows)) * 4);  // either layout
  L.y = carve(c, o.deterministic ? size_t(R) * size_t(N) * 4 : 0);
  L.gemm_queue = carve(c, 2 * sizeof(int32_t));  // the GEMM's dynamic unit queue (sorted rows)
  L.hit_list = carve(c, size_t(s.experts + 1) * 16);  // experts with rows, from the fused small kernel
  L.early_ids = carve(c, size_t(kEarlyIdWords) * 4);  // ... and the routes' ids as soon as ranked
  L.token_masks = carve(c, size_t((T + 31) / 32) * size_t(s.experts) * 4);  // routing -> dispatch+quantise
  L.slice_counts = carve(c, dispatch_slice_count_bytes(T, s.topk, s.experts));  // multi-CTA dispatch
  // Expert bins: T slots per expert (ids are distinct per token, so no bin overflows).
  L.bin_stride = plan_uses_bins(s, o, T) ? T : 0;
  L.bin_counts = carve(c, L.bin_stride > 0 ? size_t(s.experts) * kBinCountStride * 4 : 0);
  L.bin_token = carve(c, size_t(s.experts) * size_t(L.bin_stride) * 4);
  L.bin_weight = carve(c, size_t(s.experts) * size_t(L.bin_stride) * 4);
  L.status = carve(c, sizeof(LayerStatus));
  L.total = c;
  L.x_rows = x_rows;
  // As run() will launch it for the plan's largest batch from router logits.
  p.gemm_config = gemm_config_for(s, o, s.tokens, *dev, routes_through_bins(p, s.tokens, true)).str();
  return p;
}

size_t workspace_bytes(const Plan& p) { return p.layout.total; }

std::string describe(const Plan& p) {
  std::ostringstream o;
  o << "shape: " << describe(p.shape) << " (tokens = most per run)\n"
    << "routing: " << describe(p.routing) << "\n"
    << "device: " << p.device_name << ", " << p.sm_count << " SMs, L2 " << (p.l2_bytes >> 20) << " MiB\n"
    << "kernels (GEMM gathering by token): route (warp per token) + quantise (1x128, bit-exact, token order) in one "
       "launch -> dispatch (counts, scan, stable rows; one CTA up to " << kSmallBatchMaxRoutes
    << " routes; for softmax up to " << kSmallBatchMaxTokens
    << " tokens routing, dispatch and quantise are one launch, routed by a cluster of 4 CTAs above 8 tokens; up to "
    << kEarlyIdWords << " routes on one CTA it publishes each token's expert ids as ranked, and the GEMM starts its "
       "weight loads on them before its PDL wait) -> GEMM; "
       "above " << kGatherMaxTokens << " tokens, below the wide tiles' start (at most " << kGatherBinsMaxRowsPerExpert
    << " routed rows per expert), from logits with the fast combine, a one-CTA counter clear -> route + quantise + "
       "append each route to its expert's bin -> GEMM walking (expert, weight block, chunk of <= "
    << kGatherMaxTokens << " rows) units, or, where nearly every expert has rows and up to "
    << kResidentRowsMaxRowsPerExpert << " rows per expert, the GEMM holding each expert's rows in shared memory "
       "over all of K while its weights stream past (weight rows on M)\n"
    << "kernels (GEMM copying rows by token through a shared-memory ring, from " << kTokenFragmentsMinRowsPerExpert
    << " routed rows per expert, where K is a multiple of 256 from " << kWideTilesRowsPerExpert[0] << " ("
    << kWideTilesFromBinsRowsPerExpert << " with expert bins), in 64 x 256 tiles below " << kTallTilesRowsPerExpert
    << "): route + quantise (token order, codes in wgmma A-fragment order) in one launch -> "
       "dispatch (a per-slice count kernel, then the dispatch) -> GEMM; with the fast combine and expert bins "
       "(routes from logits), a one-CTA counter clear -> route + quantise + append each route to its expert's "
       "bin -> GEMM reading the bins, no dispatch kernel\n"
    << "kernels (GEMM on sorted rows): route -> dispatch + quantise+gather into expert order in one launch (every "
       "CTA builds the layout from token masks; up to E * ceil(T/32) mask words in shared memory, else dispatch "
       "(a per-slice count kernel, then the dispatch) and quantise+gather; "
       "from " << kTokenMasksMinRoutes << " routes the routing kernel writes the masks) -> GEMM\n"
    << "GEMM at " << p.shape.tokens << " tokens: " << p.gemm_config << "\n"
    << "combine: "
    << (p.options.deterministic ? "deterministic (row stores + slot-order sum, no float atomics)"
                                : "fast (red.global.add.v4.f32 from the GEMM epilogue)")
    << "\n"
    << "launch: " << (p.options.pdl ? "programmatic dependent launch" : "plain stream order")
    << (p.options.debug_checks ? ", debug checks after each run" : "") << "\n"
    << "expert bins: " << (p.layout.bin_stride > 0 ? std::to_string(p.layout.bin_stride) + " slots per expert"
                                                    : std::string("not used by this plan")) << "\n"
    << "workspace: " << p.layout.total << " bytes\n";
  return o.str();
}

bool fused_route_dispatch(const Plan& p, int64_t tokens, bool from_logits) {
  return from_logits && p.options.fuse_small_batch &&
         route_dispatch_small_fits(int(tokens), int(p.shape.topk), int(p.shape.experts), p.routing);
}

bool routes_through_bins(const Plan& p, int64_t tokens, bool from_logits) {
  return from_logits && !fused_route_dispatch(p, tokens, from_logits) && !p.options.deterministic &&
         p.layout.bin_stride >= tokens;
}

GemmFp8Config gemm_config_for(const Plan& p, int64_t tokens, bool from_logits) {
  DeviceInfo dev;  // what the chooser needs, fixed at plan time (no device query per run)
  dev.sm_count = p.sm_count;
  dev.l2_bytes = p.l2_bytes;
  return gemm_config_for(p.shape, p.options, tokens, dev, routes_through_bins(p, tokens, from_logits));
}

Chain chain_for(const Plan& p, int64_t tokens, bool from_logits) {
  const Shape& s = p.shape;
  Chain c;
  const XSource x_source = gemm_config_for(p, tokens, from_logits).x_source;
  c.sorted_rows = x_source == XSource::sorted_rows;
  c.fused_route_dispatch = fused_route_dispatch(p, tokens, from_logits);
  c.quant_with_route = from_logits && !c.sorted_rows;
  // Expert bins: the register-loaded GEMM, and the gathering GEMM above kGatherMaxTokens tokens,
  // read each expert's rows from the bins the routing fills.
  c.expert_bins = routes_through_bins(p, tokens, from_logits) && !c.sorted_rows &&
                  (x_source == XSource::token_fragments || tokens > kGatherMaxTokens);
  // Routes from logits have distinct ids per token, which the fused kernel's token masks need.
  c.dispatch_with_quant = from_logits && c.sorted_rows && !c.fused_route_dispatch &&
                          dispatch_quant_fits(tokens, s.topk, s.experts);
  // The routing kernel writes token masks for it from 4096 routes on. Measured e2e (qwen35-single,
  // two builds and one environment switch, x2): T=512 / 1024 / 2048 83.7 / 99.0 / 129.3 vs 86.4 /
  // 101.0 / 131.6 us counting the ids (shared-memory atomics in every CTA); T=256 79.1 either way.
  c.token_masks = c.dispatch_with_quant && tokens * s.topk >= kTokenMasksMinRoutes;
  return c;
}

std::string Chain::dispatch_label() const { return dispatch_with_quant ? "dispatch+quant" : "dispatch"; }

std::string Chain::route_label() const {
  return std::string(expert_bins ? "clear+route" : "route") + (fused_route_dispatch ? "+dispatch" : "") +
         (quant_with_route ? "+quant" : "") + (expert_bins ? "+bins" : "");
}

void run(const Plan& p, const Weights& w, const Inputs& in, void* output, void* workspace, cudaStream_t stream) {
  run_stages(p, w, in, output, workspace, stream, Stages::all);
}

GemmLaunch gemm_launch_for(const Plan& p, const Weights& w, const Inputs& in, void* output, void* workspace) {
  GemmLaunch g;
  run_stages(p, w, in, output, workspace, nullptr, Stages::none, &g);
  return g;
}

void run_stages(const Plan& p, const Weights& w, const Inputs& in, void* output, void* workspace, cudaStream_t stream,
                Stages stages, GemmLaunch* gemm) {
  const Shape& s = p.shape;
  if (in.tokens < 0 || in.tokens > s.tokens)
    throw Error("run: tokens = " + std::to_string(in.tokens) + " outside the plan's [0, " + std::to_string(s.tokens) +
                "]");
  if (in.tokens == 0) return;  // empty output, nothing launched
  const bool from_logits = in.router_logits != nullptr;
  if (from_logits == (in.topk_ids != nullptr))
    throw Error("run: give router_logits or topk_ids/topk_weights, exactly one of them");
  if (!from_logits && !in.topk_weights) throw Error("run: topk_ids needs topk_weights");
  if (!in.hidden || !output || !workspace || !w.w1 || !w.w1_scales) throw Error("run: null device pointer");

  const Plan::Layout& L = p.layout;
  const int T = int(in.tokens), E = int(s.experts), k = int(s.topk);
  DeviceInfo dev;  // what the launchers need, fixed at plan time (no device query per run)
  dev.sm_count = p.sm_count;
  dev.l2_bytes = p.l2_bytes;
  const GemmFp8Config gc = gemm_config_for(p, T, from_logits);  // as chain_for chose
  const Chain chain = chain_for(p, T, from_logits);  // the same config choice, so the same layout
  const bool sorted = chain.sorted_rows;
  const int64_t x_rows = sorted ? padded_rows(int64_t(T) * k) : padded_rows(T);
  if (x_rows > L.x_rows)
    throw Error("run: " + std::to_string(x_rows) + " activation rows exceed the plan's " + std::to_string(L.x_rows) +
                " (internal: plan() and run() chose different activation layouts)");
  const bool pdl = p.options.pdl;
  int32_t* topk_ids = from_logits ? at<int32_t>(workspace, L.topk_ids) : const_cast<int32_t*>(in.topk_ids);
  float* topk_weights = from_logits ? at<float>(workspace, L.topk_weights) : const_cast<float*>(in.topk_weights);
  LayerStatus* status = at<LayerStatus>(workspace, L.status);

  const bool all = stages == Stages::all, glue = all || stages == Stages::glue_only;
  const bool do_route = glue || stages == Stages::route_only, do_dispatch = glue || stages == Stages::dispatch_only;
  const bool do_quant = glue || stages == Stages::quant_only, do_gemm = all || stages == Stages::gemm_only;
  const bool fused = chain.fused_route_dispatch;
  RouteTopkParams rp;
  if (from_logits) {
    rp.logits = in.router_logits;
    rp.bias = in.expert_bias;
    rp.topk_ids = topk_ids;
    rp.topk_weights = topk_weights;
    rp.nan_flags = at<uint8_t>(workspace, L.nan_flags);
    rp.tokens = T;
    rp.experts = E;
    rp.topk = k;
    rp.routing = p.routing;
  }

  DispatchParams dp;
  dp.topk_ids = topk_ids;
  dp.topk_weights = topk_weights;
  dp.nan_flags = from_logits ? at<uint8_t>(workspace, L.nan_flags) : nullptr;
  dp.tokens = T;
  dp.topk = k;
  dp.experts = E;
  dp.offsets = at<int32_t>(workspace, L.offsets);
  dp.route_row = at<int32_t>(workspace, L.route_row);
  dp.row_token = at<int32_t>(workspace, L.row_token);
  dp.row_weight = at<float>(workspace, L.row_weight);
  dp.status = status;
  dp.slice_counts = at<int32_t>(workspace, L.slice_counts);
  // The fused small-batch kernel also lists the experts with rows for the GEMM's compact walk.
  int4* hit_list = chain.fused_route_dispatch ? at<int4>(workspace, L.hit_list) : nullptr;
  dp.hit_list = hit_list;
  // ... and, for a few routes routed by one CTA, their early ids, on which the GEMM's weight loads
  // start before its PDL wait. Only when that GEMM runs after it in this run: a GEMM launched
  // alone would wait for ids nobody writes.
  const bool early_ids = fused && do_route && do_gemm && int64_t(T) * k <= kEarlyIdWords &&
                         route_dispatch_small_ctas(T) == 1 && gc.x_source == XSource::gather_by_token && !gc.dense;
  rp.early_ids = early_ids ? at<uint32_t>(workspace, L.early_ids) : nullptr;
  // Routing then dispatch+quantise: the routing kernel also writes the token masks the dispatch
  // would otherwise count from the ids (every word, every run: nothing to clear).
  uint32_t* token_masks = chain.token_masks ? at<uint32_t>(workspace, L.token_masks) : nullptr;
  rp.token_masks = token_masks;
  dp.token_masks = token_masks;
  QuantGatherParams qp;  // token order (the GEMM gathers by token) or expert-sorted rows
  qp.hidden = static_cast<const uint16_t*>(in.hidden);
  qp.route_row = sorted ? dp.route_row : nullptr;
  qp.tokens = T;
  qp.hidden_dim = int(s.hidden);
  qp.topk = k;
  qp.padded_rows = x_rows;
  qp.a_sorted = at<uint8_t>(workspace, L.x);
  qp.a_scales = at<float>(workspace, L.x_scales);
  // The hand-off GEMM reads the scales in row quads, which the sorted copy also writes faster; the
  // register-loaded GEMM (token fragments) reads them so, a sector per row for four K blocks.
  qp.scale_layout = (sorted && gc.handoff_epilogue) || gc.x_source == XSource::token_fragments
                        ? ScaleLayout::row_quads
                        : ScaleLayout::group_major;
  qp.fragment_order = gc.x_source == XSource::token_fragments;
  // The fast combine accumulates into the output: clear it here, ordered before the GEMM.
  qp.zero_out = p.options.deterministic ? nullptr : static_cast<float*>(output);
  qp.zero_cols = s.inter;
  // The GEMM's dynamic unit queue starts every run at zero: the kernel just before the GEMM clears it.
  int32_t* gemm_queue = at<int32_t>(workspace, L.gemm_queue);
  if (gc.dynamic) {
    qp.zero_words = gemm_queue;
    qp.zero_word_count = 2;
  }

  // The chain. Token order: from logits, routing and quantisation share one launch (small softmax
  // batches also dispatch in it); from precomputed top-k ids, quantise then dispatch. Sorted rows:
  // routing, dispatch, then the quantisation that writes each token to its sorted rows.
  const bool quant_rides_with_route = chain.quant_with_route;
  RouteTopkParams rp_bins = rp;
  if (chain.expert_bins) {
    rp_bins.bin_counts = at<int32_t>(workspace, L.bin_counts);
    rp_bins.bin_token = at<int32_t>(workspace, L.bin_token);
    rp_bins.bin_weight = at<float>(workspace, L.bin_weight);
    rp_bins.bin_stride = int(L.bin_stride);
    rp_bins.status = status;
  }
  if (from_logits && do_route && chain.expert_bins) {
    ExpertBinsClearParams bc;
    bc.bin_counts = rp_bins.bin_counts;
    bc.status = status;
    bc.experts = E;
    launch_expert_bins_clear(bc, stream, pdl);
    launch_route_quant(rp_bins, qp, stream, pdl);
  } else if (from_logits && do_route) {
    if (fused)
      launch_route_dispatch_small(rp, dp, quant_rides_with_route ? &qp : nullptr, stream, pdl);
    else if (quant_rides_with_route)
      launch_route_quant(rp, qp, stream, pdl);
    else
      launch_route_topk(rp, stream, pdl);
  }
  if (!quant_rides_with_route && !sorted && do_quant) launch_quant_gather(qp, stream, pdl);
  if (!fused && !chain.expert_bins && do_dispatch) {
    if (chain.dispatch_with_quant)
      // With do_route, the routing kernel was launched just before: it waits before it triggers us.
      launch_dispatch_quant(dp, qp, p.sm_count, stream, pdl, do_route);
    else if (p.options.fuse_small_batch && dispatch_small_fits(T, k, E))
      launch_dispatch_small(dp, stream, pdl);
    else
      launch_dispatch(dp, stream, pdl);
  }
  if (sorted && !chain.dispatch_with_quant && do_quant) launch_quant_gather(qp, stream, pdl);

  GemmFp8Params gp;
  gp.weights = static_cast<const uint8_t*>(w.w1);
  gp.weight_scales = w.w1_scales;
  gp.x = qp.a_sorted;
  gp.x_scales = qp.a_scales;
  gp.x_scale_layout = qp.scale_layout;
  gp.x_rows = x_rows;
  gp.offsets = dp.offsets;
  gp.row_token = dp.row_token;
  gp.row_weight = dp.row_weight;
  gp.out = p.options.deterministic ? at<float>(workspace, L.y) : static_cast<float*>(output);
  gp.experts = E;
  gp.n = int(s.inter);
  gp.k = int(s.hidden);
  gp.combine = p.options.deterministic ? CombineMode::store : CombineMode::atomic;
  gp.work_queue = gc.dynamic ? gemm_queue : nullptr;
  gp.hit_list = hit_list;
  gp.early_ids = rp.early_ids;
  gp.early_routes = early_ids ? T * k : 0;
  if (chain.expert_bins) {
    gp.offsets = nullptr;
    gp.expert_counts = rp_bins.bin_counts;
    gp.expert_stride = rp_bins.bin_stride;
    gp.row_token = rp_bins.bin_token;
    gp.row_weight = rp_bins.bin_weight;
  }
  if (gemm) *gemm = GemmLaunch{gp, gc};
  if (do_gemm) launch_gemm_fp8(gp, gc, dev, stream, pdl);

  if (p.options.deterministic && all) {
    CombineRowsParams cp;
    cp.y = gp.out;
    cp.route_row = dp.route_row;
    cp.tokens = T;
    cp.topk = k;
    cp.cols = int(s.inter);
    cp.out = static_cast<float*>(output);
    launch_combine_rows(cp, stream, pdl);
  }

  if (p.options.debug_checks) {
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
    const LayerStatus st = read_status(p, workspace, stream);
    if (st.dropped_routes || st.nan_tokens)
      throw Error("run: " + std::to_string(st.dropped_routes) + " routes with expert ids outside [0, " +
                  std::to_string(E) + ") dropped, " + std::to_string(st.nan_tokens) + " tokens with NaN router logits");
  }
}

LayerStatus read_status(const Plan& p, const void* workspace, cudaStream_t stream) {
  LayerStatus st;
  LOOM_CUDA_CHECK(cudaMemcpyAsync(&st, static_cast<const uint8_t*>(workspace) + p.layout.status, sizeof st,
                                  cudaMemcpyDeviceToHost, stream));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
  return st;
}

}  // namespace loom
