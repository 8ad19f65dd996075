// run(): the launches of the plan's bucket for the batch, enqueued with their parameters on the
// workspace (route -> dispatch -> quantise in whichever launches the bucket fuses them -> GEMM ->
// the deterministic combine; dtype bf16: route -> dispatch -> gather -> GEMM 1 -> GEMM 2 ->
// combine), chained with PDL.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>

#include "common/cuda_check.hpp"
#include "common/device_info.hpp"
#include "contract/device_layout.hpp"
#include "dispatch/dispatch_quant_sm90.cuh"
#include "dispatch/dispatch_sm90.cuh"
#include "dispatch/expert_bins_clear_sm90.cuh"
#include "dispatch/gather_rows_sm90.cuh"
#include "dispatch/route_dispatch_small_sm90.cuh"
#include "gemm/combine_rows_sm90.cuh"
#include "gemm/gemm_bf16.hpp"
#include "gemm/gemm_fp8.hpp"
#include "gemm/to_bf16_sm90.cuh"
#include "loom/loom.hpp"
#include "pipeline/moe_pipeline.hpp"
#include "pipeline/plan_buckets.hpp"
#include "quant/quant_gather_sm90.cuh"
#include "quant/silu_mul_quant_sm90.cuh"
#include "route/route_quant_sm90.cuh"
#include "route/route_topk_sm90.cuh"

namespace loom {

namespace {

template <class T>
T* at(void* ws, size_t offset) {
  return reinterpret_cast<T*>(static_cast<uint8_t*>(ws) + offset);
}

}  // namespace

void run(const Plan& p, const Weights& w, const Inputs& in, void* output, void* workspace, cudaStream_t stream) {
  run_stages(p, w, in, output, workspace, stream, Stages::all);
}

GemmLaunch gemm_launch_for(const Plan& p, const Weights& w, const Inputs& in, void* output, void* workspace) {
  GemmLaunch g;
  run_stages(p, w, in, output, workspace, nullptr, Stages::none, &g);
  return g;
}

void run_stages(const Plan& p, const Weights& w, const Inputs& in, void* output, void* workspace, cudaStream_t stream,
                Stages stages, GemmLaunch* gemm, const QuantisedHidden* quantised) {
  const Shape& s = p.shape;
  if (in.tokens < 0 || in.tokens > s.tokens)
    throw Error("run: tokens = " + std::to_string(in.tokens) + " outside the plan's [0, " + std::to_string(s.tokens) +
                "]");
  if (in.tokens == 0) return;  // empty output, nothing launched
  const bool from_logits = in.router_logits != nullptr;
  if (from_logits == (in.topk_ids != nullptr))
    throw Error("run: give router_logits or topk_ids/topk_weights, exactly one of them");
  if (!from_logits && !in.topk_weights) throw Error("run: topk_ids needs topk_weights");
  if (from_logits && s.topk > s.experts)
    throw Error("run: this plan's topk exceeds its experts: it runs precomputed routes only (plan_routed)");
  const bool ffn = s.mode == Mode::ffn, fp8 = s.dtype == DType::fp8;
  if (quantised && (!fp8 || from_logits || !quantised->codes || !quantised->scales))
    throw Error("run: quantised hidden rows are for an FP8 plan on precomputed routes, codes and scales both");
  if ((!in.hidden && !quantised) || !output || !workspace || !w.w1) throw Error("run: null device pointer");
  if (fp8 && !w.w1_scales) throw Error("run: fp8 weights need w1_scales");
  if (ffn && (!w.w2 || (fp8 && !w.w2_scales)))
    throw Error(fp8 ? "run: ffn mode needs w2 and w2_scales" : "run: ffn mode needs w2");
  // TMA and the kernels' vector loads and stores start on 16-byte boundaries; the workspace's
  // carve-up is in 256-byte units.
  const std::pair<const void*, const char*> buffers[] = {
      {in.hidden, "hidden"},           {in.router_logits, "router_logits"}, {in.expert_bias, "expert_bias"},
      {in.topk_ids, "topk_ids"},       {in.topk_weights, "topk_weights"},   {w.w1, "w1"},
      {w.w1_scales, "w1_scales"},      {w.w2, "w2"},                        {w.w2_scales, "w2_scales"},
      {output, "output"}};
  for (const auto& [ptr, name] : buffers)
    if ((reinterpret_cast<uintptr_t>(ptr) & 15u) != 0) throw Error(std::string("run: ") + name + " must be 16-byte aligned");
  if ((reinterpret_cast<uintptr_t>(workspace) & 255u) != 0) throw Error("run: workspace must be 256-byte aligned");

  const Plan::Layout& L = p.layout;
  const int T = int(in.tokens), E = int(s.experts), k = int(s.topk);
  DeviceInfo dev;  // what the launchers need, fixed at plan time (no device query per run)
  dev.sm_count = p.sm_count;
  dev.l2_bytes = p.l2_bytes;
  const Launches& launches = launches_for(p, T, from_logits);  // everything decided by plan()
  const Chain& chain = launches.chain;
  GemmConfig gc = launches.gemm;
  const bool sorted = chain.sorted_rows;
  const int64_t x_rows = sorted ? padded_rows(int64_t(T) * k) : padded_rows(T);
  if (x_rows > L.x_rows)
    throw Error("run: " + std::to_string(x_rows) + " activation rows exceed the plan's " + std::to_string(L.x_rows) +
                " (internal: plan() and run() chose different activation layouts)");
  const bool pdl = p.options.pdl;
  int32_t* topk_ids = from_logits ? at<int32_t>(workspace, L.topk_ids) : const_cast<int32_t*>(in.topk_ids);
  float* topk_weights = from_logits ? at<float>(workspace, L.topk_weights) : const_cast<float*>(in.topk_weights);
  LayerStatus* status = at<LayerStatus>(workspace, L.status);

  const bool rows_only = stages == Stages::route_rows;
  if (rows_only && (!ffn || !p.options.deterministic || !launches.combine_rows))
    throw Error("run: the route rows stage needs a deterministic ffn plan");
  const bool all = stages == Stages::all || rows_only, glue = all || stages == Stages::glue_only;
  const bool do_route = glue || stages == Stages::route_only, do_dispatch = glue || stages == Stages::dispatch_only;
  const bool do_quant = glue || stages == Stages::quant_only, do_gemm = all || stages == Stages::gemm_only;
  const bool do_gemm1 = do_gemm || stages == Stages::ffn_gemm1, do_act = do_gemm || stages == Stages::ffn_act;
  const bool do_gemm2 = do_gemm || stages == Stages::ffn_gemm2;
  const bool do_out = (do_gemm && !rows_only) || stages == Stages::ffn_out;
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
  // alone would wait for ids nobody writes, so it walks the hit list the last full run left.
  const bool early_ids = chain.early_ids && do_route && do_gemm;
  if (chain.early_ids && !early_ids) std::get<WeightsOnMConfig>(gc).rows = WmRows::gather;
  rp.early_ids = early_ids ? at<uint32_t>(workspace, L.early_ids) : nullptr;
  // Routing then dispatch+quantise: the routing kernel also writes the token masks the dispatch
  // would otherwise count from the ids (every word, every run: nothing to clear).
  uint32_t* token_masks = chain.token_masks ? at<uint32_t>(workspace, L.token_masks) : nullptr;
  rp.token_masks = token_masks;
  dp.token_masks = token_masks;
  // Options::debug_checks: synchronise, read the status, throw on dropped routes or NaN logits.
  auto debug_check = [&] {
    if (!p.options.debug_checks) return;
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
    const LayerStatus st = read_status(p, workspace, stream);
    if (st.dropped_routes || st.nan_tokens)
      throw Error("run: " + std::to_string(st.dropped_routes) + " routes with expert ids outside [0, " +
                  std::to_string(E) + ") dropped, " + std::to_string(st.nan_tokens) + " tokens with NaN router logits");
  };

  if (!fp8) {  // the BF16 layer: route -> dispatch -> gather -> GEMM 1 (SiLU*up) -> GEMM 2 -> combine
    const int64_t rows = padded_rows(int64_t(T) * k);
    if (from_logits && do_route) launch_route_topk(rp, stream, pdl);
    if (do_dispatch) {
      if (chain.dispatch_small)
        launch_dispatch_small(dp, stream, pdl);
      else
        launch_dispatch(dp, stream, pdl);
    }
    GatherRowsParams gr;
    gr.hidden = static_cast<const uint16_t*>(in.hidden);
    gr.route_row = dp.route_row;
    gr.rows = at<uint16_t>(workspace, L.x);
    gr.tokens = T;
    gr.topk = k;
    gr.hidden_dim = int(s.hidden);
    if (do_quant) launch_gather_rows(gr, stream, pdl);
    GemmBf16Params g1;
    g1.weights = static_cast<const bf16*>(w.w1);
    g1.x = at<const bf16>(workspace, L.x);
    g1.x_rows = rows;
    g1.offsets = dp.offsets;
    g1.epilogue = Bf16Epilogue::act;
    g1.out = at<void>(workspace, L.act);
    g1.inter = int(s.inter);
    g1.experts = E;
    g1.n = int(2 * s.inter);
    g1.k = int(s.hidden);
    g1.weights_on_m = launches.bf16_weights_on_m;
    if (do_gemm1) launch_gemm_bf16(g1, dev, stream, pdl);
    GemmBf16Params g2 = g1;
    g2.weights = static_cast<const bf16*>(w.w2);
    g2.x = at<const bf16>(workspace, L.act);
    g2.x_rows = rows;
    g2.epilogue = Bf16Epilogue::rows;
    g2.row_weight = dp.row_weight;
    g2.out = at<void>(workspace, L.y);
    g2.store_bf16 = true;  // the weighted route rows in bf16, as the deterministic FP8 layer's (docs/numerics.md)
    g2.n = int(s.hidden);
    g2.k = int(s.inter);
    if (do_gemm2) launch_gemm_bf16(g2, dev, stream, pdl);
    CombineRowsParams cp;
    cp.y_bf16 = at<const uint16_t>(workspace, L.y);
    cp.route_row = dp.route_row;
    cp.tokens = T;
    cp.topk = k;
    cp.cols = int(s.hidden);
    cp.out_bf16 = static_cast<uint16_t*>(output);
    if (do_out) launch_combine_rows(cp, stream, pdl);
    debug_check();
    return;
  }
  QuantGatherParams qp;  // token order (the GEMM gathers by token) or expert-sorted rows
  qp.hidden = static_cast<const uint16_t*>(in.hidden);
  if (quantised) {  // copied into the GEMM's layout where the stage would have quantised
    qp.codes = quantised->codes;
    qp.code_scales = quantised->scales;
  }
  qp.route_row = sorted ? dp.route_row : nullptr;
  qp.tokens = T;
  qp.hidden_dim = int(s.hidden);
  qp.topk = k;
  qp.padded_rows = x_rows;
  qp.a_sorted = at<uint8_t>(workspace, L.x);
  qp.a_scales = at<float>(workspace, L.x_scales);
  // As the GEMM reads them (row quads for the hand-off and tokens-on-M kernels).
  qp.scale_layout = scale_layout(gc);
  qp.fragment_order = x_source(gc) == XSource::token_fragments;
  // The fast combine accumulates into the output: clear it here, ordered before the GEMM (ffn: GEMM
  // 1 stores rows, and the intermediate's kernel clears GEMM 2's accumulator; where GEMM 1 computes
  // the intermediate itself, the accumulator is cleared here too).
  const bool act_in_gemm1 = ffn && fused_act(gc);
  // ffn GEMM 1 on a config that reduces (split K where the chooser splits, balanced shares by key):
  // its partial sums meet in h's sorted rows, cleared here (the first T*k rows: every routed row).
  const bool gemm1_reduces = ffn && !act_in_gemm1 && !combine_stores_rows(gc);
  if (gemm1_reduces) {
    qp.zero_out = at<float>(workspace, L.h);
    qp.zero_cols = int(k * 2 * s.inter);
  } else {
    qp.zero_out = p.options.deterministic || (ffn && !act_in_gemm1) ? nullptr
                  : act_in_gemm1                                    ? at<float>(workspace, L.acc)
                                                                    : static_cast<float*>(output);
    qp.zero_cols = ffn ? s.hidden : s.inter;
  }
  // The GEMM's work queue resets itself at the end of every launch; the kernel before the GEMM
  // zeroes it once more (its generic word clear), so no run depends on how the previous one ended.
  int32_t* gemm_queue = at<int32_t>(workspace, L.gemm_queue);
  if (uses_work_queue(gc) || act_in_gemm1) {
    qp.zero_words = gemm_queue;
    qp.zero_word_count = act_in_gemm1 ? 2 * kWorkQueueWords : kWorkQueueWords;  // GEMM 2's beside it
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
    else if (chain.dispatch_small)
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
  if (ffn) {  // GEMM 1: w13, each sorted row's gate and up values, unweighted
    gp.weights = static_cast<const uint8_t*>(w.w1);
    gp.row_weight = nullptr;
    gp.out = at<float>(workspace, L.h);
    gp.n = int(2 * s.inter);
    gp.segment_rows = int(s.inter);  // gate and up rows each in their own 128-row blocks
    gp.combine = gemm1_reduces ? CombineMode::atomic : CombineMode::store;
    gp.reduce_rows = gemm1_reduces;
    if (act_in_gemm1) {  // ... or the intermediate itself, as GEMM 2 reads it
      const GemmConfig& gc2 = launches.gemm2;
      gp.out = nullptr;
      gp.act.codes = at<uint8_t>(workspace, L.act);
      gp.act.scales = at<float>(workspace, L.act_scales);
      gp.act.rows = padded_rows(int64_t(T) * k);
      gp.act.scale_layout = scale_layout(gc2);
      gp.act.fragment_order = x_source(gc2) == XSource::sorted_fragments;
      gp.act.inter = int(s.inter);
    }
  }
  gp.work_queue = uses_work_queue(gc) ? gemm_queue : nullptr;
  gp.hit_list = hit_list;
  // A weights-on-M GEMM on a dense walk requests its first weights (an eighth of L2 over the grid)
  // before its PDL wait, while the kernels before it finish.
  if (std::holds_alternative<WeightsOnMConfig>(gc)) gp.prewait_prefetch_bytes = p.l2_bytes / 8;
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
  if (ffn ? do_gemm1 : do_gemm) launch_gemm_fp8(gp, gc, dev, stream, pdl);

  // ffn: the intermediate, then GEMM 2 on it (expert-sorted rows, K = I), combined into the fp32
  // accumulator, which the last pass rounds to the bf16 output.
  GemmFp8Params gp2;
  float* acc = ffn ? at<float>(workspace, L.acc) : nullptr;
  if (ffn) {
    const GemmConfig& gc2 = launches.gemm2;
    const int64_t rows2 = padded_rows(int64_t(T) * k);
    SiluMulQuantParams sq;
    sq.h = gp.out;
    sq.offsets = dp.offsets;
    sq.experts = E;
    sq.inter = int(s.inter);
    sq.padded_rows = rows2;
    sq.codes = at<uint8_t>(workspace, L.act);
    sq.scales = at<float>(workspace, L.act_scales);
    sq.scale_layout = scale_layout(gc2);
    sq.fragment_order = x_source(gc2) == XSource::sorted_fragments;
    if (!p.options.deterministic) {
      sq.zero_out = acc;
      sq.zero_count = int64_t(T) * s.hidden;
    }
    int32_t* queue2 = at<int32_t>(workspace, L.gemm2_queue);
    if (uses_work_queue(gc2)) {
      sq.zero_words = queue2;
      sq.zero_word_count = kWorkQueueWords;
    }
    if (do_act && !act_in_gemm1) launch_silu_mul_quant(sq, p.sm_count, stream, pdl);

    gp2.weights = static_cast<const uint8_t*>(w.w2);
    gp2.weight_scales = w.w2_scales;
    gp2.x = sq.codes;
    gp2.x_scales = sq.scales;
    gp2.x_scale_layout = sq.scale_layout;
    gp2.x_rows = rows2;
    gp2.offsets = dp.offsets;
    gp2.row_token = dp.row_token;
    gp2.row_weight = dp.row_weight;
    gp2.out = p.options.deterministic ? at<float>(workspace, L.y) : acc;
    gp2.experts = E;
    gp2.n = int(s.hidden);
    gp2.k = int(s.inter);
    gp2.combine = p.options.deterministic ? CombineMode::store : CombineMode::atomic;
    // Deterministic: the weighted rows in bf16 (docs/numerics.md), half the bytes the combine reads.
    gp2.store_bf16 = p.options.deterministic;
    gp2.work_queue = uses_work_queue(gc2) ? queue2 : nullptr;
    gp2.hit_list = hit_list;  // the fused small-batch kernel's, for a compact walk
    // GEMM 2's walk reads only what the dispatch wrote, which GEMM 1 waited for before it let the
    // SiLU*up kernel launch: a compact walk is built, and its first weights (a quarter of L2)
    // requested, before its PDL wait. (On a dense walk this measured slower: session 44's journal.)
    if (const auto* wm2 = std::get_if<WeightsOnMConfig>(&gc2); wm2 && !wm2->dense) {
      gp2.prewait_prefetch_bytes = p.l2_bytes / 4;
      gp2.walk_inputs_ready = true;
    }
    if (do_gemm2) launch_gemm_fp8(gp2, gc2, dev, stream, pdl);
  }

  if (launches.combine_rows && (ffn ? do_out : all)) {
    CombineRowsParams cp;
    if (ffn)
      cp.y_bf16 = reinterpret_cast<const uint16_t*>(gp2.out);
    else
      cp.y = gp.out;
    cp.route_row = dp.route_row;
    cp.tokens = T;
    cp.topk = k;
    cp.cols = int(ffn ? s.hidden : s.inter);
    // ffn: the combine rounds to the bf16 output itself (no accumulator pass).
    if (ffn)
      cp.out_bf16 = static_cast<uint16_t*>(output);
    else
      cp.out = static_cast<float*>(output);
    launch_combine_rows(cp, stream, pdl);
  }
  if (ffn && do_out && !launches.combine_rows) {
    ToBf16Params tb;
    tb.in = acc;
    tb.out = static_cast<uint16_t*>(output);
    tb.count = int64_t(T) * s.hidden;
    launch_to_bf16(tb, p.sm_count, stream, pdl);
  }

  debug_check();
}

LayerStatus read_status(const Plan& p, const void* workspace, cudaStream_t stream) {
  LayerStatus st;
  LOOM_CUDA_CHECK(cudaMemcpyAsync(&st, static_cast<const uint8_t*>(workspace) + p.layout.status, sizeof st,
                                  cudaMemcpyDeviceToHost, stream));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
  return st;
}

}  // namespace loom
