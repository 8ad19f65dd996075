#include "common/bf16.hpp"
#include "bench/bench.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <ostream>

#include "bench/device_buffer.hpp"
#include "bench/sol_gemm.hpp"
#include "bench/sol_read.hpp"
#include "common/build_info.hpp"
#include "diag/chain_trace.cuh"
#include "common/device_info.hpp"
#include "pipeline/layer_ref.hpp"
#include "pipeline/moe_pipeline.hpp"

namespace loom::bench {

namespace {

// Device copies of the expert weights (rotated to keep L2 cold), made on demand.
class DeviceWeights {
 public:
  explicit DeviceWeights(const LayerWeights& w) : w_(w) {}
  void ensure_copies(int n) {
    while (int(w1_.size()) < n) {
      if (w1_.empty()) {
        w1_.push_back(w_.shape.dtype == DType::fp8 ? DeviceBuffer::from(w_.w1_q) : DeviceBuffer::from(w_.w1));
        if (w_.shape.mode == Mode::ffn)
          w2_.push_back(w_.shape.dtype == DType::fp8 ? DeviceBuffer::from(w_.w2_q) : DeviceBuffer::from(w_.w2));
      } else {
        w1_.push_back(w1_.front().clone());
        if (w_.shape.mode == Mode::ffn) w2_.push_back(w2_.front().clone());
      }
    }
  }
  const DeviceBuffer& w1(int c) const { return w1_[size_t(c)]; }
  const DeviceBuffer& w2(int c) const { return w2_[size_t(c)]; }
  const DeviceBuffer& w1_scales() {
    if (!w1_scales_.get()) w1_scales_ = DeviceBuffer::from(w_.w1_scales);
    return w1_scales_;
  }
  const DeviceBuffer& w2_scales() {
    if (!w2_scales_.get()) w2_scales_ = DeviceBuffer::from(w_.w2_scales);
    return w2_scales_;
  }

 private:
  const LayerWeights& w_;
  std::vector<DeviceBuffer> w1_, w2_;
  DeviceBuffer w1_scales_, w2_scales_;
};

// Streaming read over the routed experts' weight matrices (codes or bf16 values; the fp32 block
// scales add < 0.5 % and are left out of the read).
SolFigures measure_sol(const BenchOptions& opt, const Shape& s, const std::vector<int32_t>& counts,
                       const DeviceInfo& dev, GpuTimer& timer, DeviceWeights& weights, std::ostream& log) {
  SolFigures sol;
  std::vector<int32_t> hit;
  for (int32_t e = 0; e < int32_t(counts.size()); ++e)
    if (counts[size_t(e)] > 0) hit.push_back(e);
  const int64_t elem = s.dtype == DType::fp8 ? 1 : 2;
  ReadArgs base;
  if (s.mode == Mode::single) {
    base.group[0] = {nullptr, elem * s.inter * s.hidden, elem * s.inter * s.hidden};
    base.groups = 1;
  } else {
    base.group[0] = {nullptr, elem * 2 * s.inter * s.hidden, elem * 2 * s.inter * s.hidden};
    base.group[1] = {nullptr, elem * s.hidden * s.inter, elem * s.hidden * s.inter};
    base.groups = 2;
  }
  base.segments = int64_t(hit.size());
  const int64_t read_bytes = base.total_bytes();
  const ColdPlan cold = plan_cold_l2(read_bytes, dev.l2_bytes, opt.max_copies);
  weights.ensure_copies(cold.copies);
  DeviceBuffer ids = DeviceBuffer::from(hit);
  DeviceBuffer sink(sizeof(uint32_t));
  std::vector<ReadArgs> per_copy;
  for (int c = 0; c < cold.copies; ++c) {
    ReadArgs a = base;
    a.group[0].base = weights.w1(c).get();
    if (s.mode == Mode::ffn) a.group[1].base = weights.w2(c).get();
    a.seg_ids = ids.as<int32_t>();
    a.sink = sink.as<uint32_t>();
    per_copy.push_back(a);
  }
  log << "  SoL read: " << hit.size() << " experts, " << (read_bytes >> 20) << " MiB, L2 " << cold.str() << "\n";
  const ReadResult rr = measure_stream_read(timer, dev, per_copy, cold.mode, opt.timer);
  sol.read = rr.stats;
  sol.read_config = rr.config.str();
  sol.read_loads_us = rr.loads_median_us;
  sol.read_bulk_us = rr.bulk_median_us;
  log << "  SoL read: fastest reader " << sol.read_config << " (medians: 16-byte loads " << rr.loads_median_us
      << " us, bulk copies " << rr.bulk_median_us << " us)\n";
  sol.read_bytes = read_bytes;

  const std::vector<GemmShape> shapes = sol_gemm_shapes(s);
  const ColdPlan gcold = plan_cold_l2(DenseGemm::touched_bytes(s.dtype, shapes), dev.l2_bytes, opt.max_copies);
  DenseGemm gemm(s.dtype, shapes, gcold.copies, opt.seed);
  gemm.autotune(timer, 20);
  log << "  SoL GEMM: " << gemm.algo() << ", L2 " << gcold.str() << "\n";
  sol.gemm = timer.time([&](cudaStream_t st, int c) { gemm.enqueue(st, c); }, gcold.copies, gcold.mode, opt.timer);
  sol.gemm_algo = gemm.algo();
  sol.measured = true;
  return sol;
}

// Pearson correlation of two equally long samples (0 when either is constant).
double correlation(const std::vector<double>& x, const std::vector<double>& y) {
  const double n = double(x.size());
  double mx = 0, my = 0;
  for (size_t i = 0; i < x.size(); ++i) mx += x[i] / n, my += y[i] / n;
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < x.size(); ++i)
    sxy += (x[i] - mx) * (y[i] - my), sxx += (x[i] - mx) * (x[i] - mx), syy += (y[i] - my) * (y[i] - my);
  return sxx > 0 && syy > 0 ? sxy / std::sqrt(sxx * syy) : 0.0;
}

// Where the GEMM's CTAs end, over the traced replays: per SM (even and odd replays apart) and per
// CTA, the mean of how much later than the replay's median CTA its GEMM CTA ended.
struct GemmLateness {
  std::vector<double> sm_sum[2], sm_n[2], cta_sum, cta_n;
  std::vector<uint64_t> first_sm;  // per CTA, its SM (+ 1) in the first replay
  int64_t same_sm = 0, seen = 0;
  GemmLateness() {
    for (int h = 0; h < 2; ++h) sm_sum[h].assign(trace::kMaxCtas, 0.0), sm_n[h].assign(trace::kMaxCtas, 0.0);
    cta_sum.assign(trace::kMaxCtas, 0.0), cta_n.assign(trace::kMaxCtas, 0.0), first_sm.assign(trace::kMaxCtas, 0);
  }
  void add(const trace::Stamps& s, uint64_t t0, int replay) {
    auto at = [&](int event, int b) { return s.cta[size_t(event) * trace::kMaxCtas + size_t(b)]; };
    std::vector<double> ends;
    for (int b = 0; b < trace::kMaxCtas; ++b)
      if (at(trace::kGemmSm, b) > 0 && at(trace::kGemmEnd, b) > 0) ends.push_back(double(at(trace::kGemmEnd, b) - t0) / 1000.0);
    if (ends.empty()) return;
    std::sort(ends.begin(), ends.end());
    const double mid = ends[ends.size() / 2];
    for (int b = 0; b < trace::kMaxCtas; ++b) {
      const uint64_t sm = at(trace::kGemmSm, b), end = at(trace::kGemmEnd, b);
      if (sm == 0 || sm > uint64_t(trace::kMaxCtas) || end == 0) continue;
      const double late = double(end - t0) / 1000.0 - mid;
      sm_sum[replay % 2][size_t(sm - 1)] += late, sm_n[replay % 2][size_t(sm - 1)] += 1;
      cta_sum[size_t(b)] += late, cta_n[size_t(b)] += 1;
      if (first_sm[size_t(b)] == 0) first_sm[size_t(b)] = sm;
      same_sm += first_sm[size_t(b)] == sm, ++seen;
    }
  }
  void print(std::ostream& log) const {
    if (seen == 0) return;
    log << "  GEMM end, us after the replay's median CTA, per SM (SM: mean):\n";
    std::vector<double> even, odd;
    std::string row;
    for (size_t sm = 0; sm < size_t(trace::kMaxCtas); ++sm) {
      if (sm_n[0][sm] == 0 || sm_n[1][sm] == 0) continue;
      even.push_back(sm_sum[0][sm] / sm_n[0][sm]);
      odd.push_back(sm_sum[1][sm] / sm_n[1][sm]);
      char cell[32];
      std::snprintf(cell, sizeof cell, " %3zu:%+5.2f", sm, (sm_sum[0][sm] + sm_sum[1][sm]) / (sm_n[0][sm] + sm_n[1][sm]));
      row += cell;
      if (even.size() % 10 == 0) log << "   " << row << "\n", row.clear();
    }
    if (!row.empty()) log << "   " << row << "\n";
    char line[160];
    std::snprintf(line, sizeof line,
                  "    correlation of the even and the odd replays' means over %zu SMs: %.2f; CTAs on their first "
                  "replay's SM: %lld %%\n",
                  even.size(), even.size() > 2 ? correlation(even, odd) : 0.0, (long long)(100 * same_sm / seen));
    log << line << "    per CTA (blockIdx order):";
    for (int b = 0; b < trace::kMaxCtas; ++b)
      if (cta_n[size_t(b)] > 0) {
        std::snprintf(line, sizeof line, " %.2f", cta_sum[size_t(b)] / cta_n[size_t(b)]);
        log << line;
      }
    log << "\n";
  }
};

// Chain trace: `runs` cold graph replays of the end-to-end run, each stamping its traced points;
// prints per point the median time (us after the run's first stamp) at which the first and the
// last CTA reached it, the CTAs' spread (10th / 50th / 90th percentile, and the correlation over the
// CTAs with each one's GEMM end), and which SMs end the GEMM late.
void trace_chain(int runs, const std::function<void(cudaStream_t)>& enqueue, GpuTimer& timer, std::ostream& log) {
  cudaStream_t st = timer.stream();
  cudaGraph_t g = nullptr;
  cudaGraphExec_t exec = nullptr;
  LOOM_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  enqueue(st);
  LOOM_CUDA_CHECK(cudaStreamEndCapture(st, &g));
  LOOM_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
  LOOM_CUDA_CHECK(cudaGraphDestroy(g));
  std::vector<std::vector<double>> first(trace::kEventCount), last(trace::kEventCount), corr(trace::kEventCount);
  std::vector<std::vector<double>> quantile[3];  // per event, per replay: the CTAs' 10th / 50th / 90th percentile
  for (auto& q : quantile) q.resize(trace::kEventCount);
  GemmLateness lateness;
  // LOOM_TRACE_WARM_L2=1: no flush between the replays (what a warm L2 changes on the chain).
  const char* warm_env = std::getenv("LOOM_TRACE_WARM_L2");
  const bool warm_l2 = warm_env != nullptr && std::string(warm_env) == "1";
  if (warm_l2) log << "  chain trace with a warm L2 (LOOM_TRACE_WARM_L2=1)\n";
  for (int r = 0; r < runs + 3; ++r) {  // the first three are warm-up
    trace::reset(st);
    if (!warm_l2) timer.flush_l2(st);
    LOOM_CUDA_CHECK(cudaGraphLaunch(exec, st));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(st));
    const trace::Stamps s = trace::read();
    const uint64_t t0 = *std::min_element(s.first.begin(), s.first.end());
    if (r < 3) continue;
    lateness.add(s, t0, r);
    for (int e = 0; e < trace::kEventCount; ++e) {
      if (s.last[size_t(e)] == 0) continue;
      first[size_t(e)].push_back(double(s.first[size_t(e)] - t0) / 1000.0);
      last[size_t(e)].push_back(double(s.last[size_t(e)] - t0) / 1000.0);
      std::vector<double> t, t_ended, end;  // the CTAs' times; those of the CTAs with a GEMM end, and the ends
      for (int b = 0; b < trace::kMaxCtas; ++b) {
        const uint64_t v = s.cta[size_t(e) * trace::kMaxCtas + size_t(b)];
        const uint64_t v_end = s.cta[size_t(trace::kGemmEnd) * trace::kMaxCtas + size_t(b)];
        if (v == 0) continue;
        t.push_back(double(v - t0) / 1000.0);
        if (v_end > 0) t_ended.push_back(t.back()), end.push_back(double(v_end - t0) / 1000.0);
      }
      if (t.size() < 2) continue;
      std::sort(t.begin(), t.end());
      for (int q = 0; q < 3; ++q) quantile[q][size_t(e)].push_back(t[(t.size() - 1) * size_t(1 + 4 * q) / 10]);
      if (end.size() > 2) corr[size_t(e)].push_back(correlation(t_ended, end));
    }
  }
  LOOM_CUDA_CHECK(cudaGraphExecDestroy(exec));
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  log << "  chain trace (" << runs << " cold replays; us after the first stamp, median; first CTA / last CTA;\n"
      << "  over the CTAs: 10th / 50th / 90th percentile; correlation with the CTA's GEMM end):\n";
  for (int e = 0; e < trace::kEventCount; ++e) {
    if (first[size_t(e)].empty()) continue;
    char line[200];
    int len = std::snprintf(line, sizeof line, "    %-40s %8.2f %8.2f", trace::event_name(e), median(first[size_t(e)]),
                            median(last[size_t(e)]));
    if (!quantile[0][size_t(e)].empty())
      len += std::snprintf(line + len, sizeof line - size_t(len), "   %8.2f %8.2f %8.2f", median(quantile[0][size_t(e)]),
                           median(quantile[1][size_t(e)]), median(quantile[2][size_t(e)]));
    if (!corr[size_t(e)].empty())
      std::snprintf(line + len, sizeof line - size_t(len), "   %6.2f", median(corr[size_t(e)]));
    log << line << "\n";
  }
  lateness.print(log);
}

// The layer on the GPU: one checked run against the CPU reference, then end-to-end and GEMM-only
// timings, cold and warm.
void measure_gpu(const BenchOptions& opt, const Plan& plan, const Shape& s, const Routes& routes,
                 const std::vector<bf16>& hidden, const LayerResult* reference, const DeviceInfo& dev, GpuTimer& timer,
                 DeviceWeights& weights, Record& r, std::ostream& log) {
  const bool from_logits = !routes.logits.empty();
  DeviceBuffer d_hidden = DeviceBuffer::from(hidden);
  DeviceBuffer d_logits, d_bias, d_ids, d_weights;
  if (from_logits) {
    d_logits = DeviceBuffer::from(routes.logits);
    if (!routes.expert_bias.empty()) d_bias = DeviceBuffer::from(routes.expert_bias);
  } else {
    d_ids = DeviceBuffer::from(routes.topk.ids);
    d_weights = DeviceBuffer::from(routes.topk.weights);
  }
  DeviceBuffer d_out(size_t(s.tokens * s.out_cols()) * 4);
  DeviceBuffer d_ws(workspace_bytes(plan));
  Inputs in;
  in.tokens = s.tokens;
  in.hidden = d_hidden.get();
  in.router_logits = d_logits.as<float>();
  in.expert_bias = d_bias.as<float>();
  in.topk_ids = d_ids.as<int32_t>();
  in.topk_weights = d_weights.as<float>();

  const int64_t touched = r.work.bytes();
  const ColdPlan cold = plan_cold_l2(touched, dev.l2_bytes, opt.max_copies);
  weights.ensure_copies(cold.copies);
  const bool fp8 = s.dtype == DType::fp8;  // bf16 weights have no scales
  if (fp8) {  // uploaded now, not inside a timed (captured) lambda
    weights.w1_scales();
    if (s.mode == Mode::ffn) weights.w2_scales();
  }
  auto weights_of = [&](int c) {
    Weights w;
    w.w1 = weights.w1(c).get();
    if (fp8) w.w1_scales = weights.w1_scales().as<float>();
    if (s.mode == Mode::ffn) {
      w.w2 = weights.w2(c).get();
      if (fp8) w.w2_scales = weights.w2_scales().as<float>();
    }
    return w;
  };

  // Correctness first: the timed configuration, poisoned output, compared with the reference.
  // NaN poison, on the timing stream (a non-blocking stream does not order against cudaMemset).
  LOOM_CUDA_CHECK(cudaMemsetAsync(d_out.get(), 0xff, d_out.bytes(), timer.stream()));
  run(plan, weights_of(0), in, d_out.get(), d_ws.get(), timer.stream());
  LOOM_CUDA_CHECK(cudaStreamSynchronize(timer.stream()));
  const LayerStatus st = read_status(plan, d_ws.get(), timer.stream());
  if (reference) {
    std::vector<float> got = d_out.to_host<float>();
    if (s.mode == Mode::ffn) {  // bf16 [T, H]: the buffer's first half
      const std::vector<uint16_t> b = d_out.to_host<uint16_t>();
      for (size_t i = 0; i < size_t(s.tokens * s.out_cols()); ++i) got[i] = bf16_to_float(bf16{b[i]});
    }
    const ErrorStats e = relative_error(got.data(), reference->out.data(), s.tokens, s.out_cols());
    r.check_overall = e.overall;
    r.check_worst_row = e.worst_row;
    // fp8 ffn: the reference re-quantises its own act, and ~1 % of the GPU's intermediate codes
    // round the other way on GEMM 1's accumulation noise (docs/numerics.md); the GPU tests hold
    // GEMM 2 and the combine to 2e-3 on the GPU's own intermediate. bf16 has no such step.
    const bool loose = s.mode == Mode::ffn && s.dtype == DType::fp8;
    const bool ok = e.overall <= (loose ? 1e-2 : 2e-3) && e.worst_row <= (loose ? 5e-2 : 1e-2);
    log << "  check vs CPU reference: rel err " << e.overall << ", worst row " << e.worst_row
        << (ok ? " (ok)" : " (FAILED)") << "\n";
    if (!ok) r.note += (r.note.empty() ? "" : "; ") + std::string("CHECK FAILED against the CPU reference");
  }
  if (st.dropped_routes || st.nan_tokens)
    r.note += (r.note.empty() ? "" : "; ") + std::to_string(st.dropped_routes) + " dropped routes, " +
              std::to_string(st.nan_tokens) + " NaN tokens";

  TimerOptions topt = opt.timer;
  auto e2e = [&](cudaStream_t st2, int c) { run(plan, weights_of(c), in, d_out.get(), d_ws.get(), st2); };
  auto gemm = [&](cudaStream_t st2, int c) {
    run_stages(plan, weights_of(c), in, d_out.get(), d_ws.get(), st2, Stages::gemm_only);
  };
  Timed t_e2e{"e2e", timer.time(e2e, cold.copies, cold.mode, topt), timer.time(e2e, 1, L2Mode::warm, topt)};
  Timed t_gemm{"gemm", timer.time(gemm, cold.copies, cold.mode, topt), timer.time(gemm, 1, L2Mode::warm, topt)};
  r.gpu.push_back(t_e2e);
  r.gpu.push_back(t_gemm);
  // Each glue kernel alone (on the workspace the runs above prepared), and the glue chain without
  // the GEMM: where the end-to-end time beyond the GEMM goes.
  TimerOptions brief = topt;
  brief.reps = std::min(topt.reps, 200);
  const Chain chain = chain_for(plan, s.tokens, from_logits);
  const Launches& launched = launches_for(plan, s.tokens, from_logits);
  for (const auto& [name, stages] : {std::pair{"route", Stages::route_only}, std::pair{"dispatch", Stages::dispatch_only},
                                     std::pair{"quant", Stages::quant_only}, std::pair{"glue_chain", Stages::glue_only}}) {
    // Each launch is timed once, under the name of what it does (the quantisation may ride in the
    // routing launch, the dispatch too).
    if (stages == Stages::route_only && !from_logits) continue;
    if (stages == Stages::quant_only && (chain.quant_with_route || chain.dispatch_with_quant)) continue;
    if (stages == Stages::dispatch_only && (chain.fused_route_dispatch || chain.expert_bins)) continue;
    const std::string label = stages == Stages::route_only      ? chain.route_label()
                              : stages == Stages::dispatch_only ? chain.dispatch_label()
                                                                : std::string(name);
    auto f = [&, st3 = stages](cudaStream_t st2, int c) {
      run_stages(plan, weights_of(c), in, d_out.get(), d_ws.get(), st2, st3);
    };
    r.gpu.push_back(Timed{label, timer.time(f, cold.copies, cold.mode, brief), Stats{}});
  }
  // The glue's floor: a device-to-device copy moving as many bytes as the glue must (half read,
  // half written), timed as the glue is (graph replays, cold L2).
  r.work.glue_bytes = glue_bytes(s, from_logits, chain.sorted_rows);
  {
    const size_t half = size_t((r.work.glue_bytes / 2 + 15) / 16 * 16);
    DeviceBuffer src(half), dst(half);
    auto copy = [&](cudaStream_t st2, int) {
      LOOM_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), half, cudaMemcpyDeviceToDevice, st2));
    };
    r.gpu.push_back(Timed{"glue_copy", timer.time(copy, 1, L2Mode::flush, brief), Stats{}});
  }
  // ffn: each part of the GEMM stage alone (gemm = all four in order).
  const bool act_in_gemm1 = s.mode == Mode::ffn && (launched.bf16 || fused_act(launched.gemm));
  if (s.mode == Mode::ffn)
    for (const auto& [name, stages] : {std::pair{"gemm1", Stages::ffn_gemm1}, std::pair{"act", Stages::ffn_act},
                                       std::pair{"gemm2", Stages::ffn_gemm2}, std::pair{"out", Stages::ffn_out}}) {
      if (stages == Stages::ffn_act && act_in_gemm1) continue;  // GEMM 1's epilogue computes it
      auto f = [&, st3 = stages](cudaStream_t st2, int c) {
        run_stages(plan, weights_of(c), in, d_out.get(), d_ws.get(), st2, st3);
      };
      r.gpu.push_back(Timed{name, timer.time(f, cold.copies, cold.mode, brief), Stats{}});
    }
  if (opt.trace_chain > 0) trace_chain(opt.trace_chain, [&](cudaStream_t st2) { e2e(st2, 0); }, timer, log);
  log << "  loom e2e " << t_e2e.cold.median_us << " us (" << t_e2e.cold.l2 << "), GEMM alone " << t_gemm.cold.median_us
      << " us\n";
}

}  // namespace

std::vector<Record> run_bench(const BenchOptions& opt, std::ostream& log) {
  validate(opt.shape);
  validate(opt.routing, opt.shape);
  for (int64_t t : opt.tokens) {
    Shape s = opt.shape;
    s.tokens = t;
    validate(s);
  }
  std::string why_no_device;
  const std::optional<DeviceInfo> dev = query_device(&why_no_device);
  std::unique_ptr<GpuTimer> timer;
  if (dev) timer = std::make_unique<GpuTimer>(*dev);

  log << "generating weights (" << describe(opt.shape) << ", seed " << opt.seed << ")\n";
  const LayerWeights weights = make_weights(opt.shape, opt.seed, opt.weight_values);
  DeviceWeights device_weights(weights);

  std::vector<Record> records;
  for (int64_t t : opt.tokens) {
    Shape s = opt.shape;
    s.tokens = t;
    Record r;
    r.preset = opt.preset;
    r.shape = s;
    r.routing = opt.routing;
    r.distribution = to_string(opt.dist);
    if (opt.weight_values == WeightValues::normal) r.distribution += ", normal weights";  // the record says which data
    r.seed = opt.seed;
    r.commit = build_commit();
    r.device = dev;
    const uint64_t batch_seed = opt.seed * 1000003ull + uint64_t(t);
    Routes routes = make_routes(s, opt.routing, opt.dist, batch_seed);
    if (opt.dist_logits) route_from_logits(s, opt.routing, batch_seed, routes);
    const std::vector<bf16> hidden = make_hidden(s, batch_seed);
    const std::vector<int32_t> counts = expert_counts(routes.topk, s.experts);
    r.work = layer_work(s, counts, opt.dist.kind == DistKind::random);
    log << "T=" << t << ": " << r.work.experts_hit << " experts hit\n";

    // The GPU path when the device and the shape allow it; otherwise the CPU reference, whose
    // wall time is reported as CPU time only.
    std::optional<Plan> gpu_plan;
    std::string why_cpu;
    if (!dev) {
      why_cpu = why_no_device;
    } else {
      try {
        gpu_plan = plan(s, opt.routing, opt.layer);
      } catch (const Error& e) {
        why_cpu = e.what();
      }
    }
    const bool want_reference = t > 0 && r.work.flops / 1e9 <= opt.max_cpu_gflop && (!gpu_plan || opt.check);
    std::optional<LayerResult> reference;
    double reference_ms = -1;
    if (want_reference) {
      const auto t0 = std::chrono::steady_clock::now();
      // (ffn deterministic: the combine's route rows rounded to bf16, docs/numerics.md)
      // (bf16: GEMM 2 stores bf16 route rows in both modes)
      reference = layer_ref(weights, hidden.data(), routes.topk, nullptr,
                            s.mode == Mode::ffn && (opt.layer.deterministic || s.dtype == DType::bf16));
      const auto t1 = std::chrono::steady_clock::now();
      reference_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
      if (reference->out.size() != size_t(s.tokens * s.out_cols()))
        throw Error("CPU reference returned a wrong-sized output");
    }
    if (t == 0) r.note = "T=0: empty output, nothing launched";
    if (gpu_plan) {
      r.path = "gpu";
      r.config = describe(*gpu_plan);
      if (t > 0) {
        const bool from_logits = !routes.logits.empty();
        const Launches& l = launches_for(*gpu_plan, t, from_logits);
        r.gemm_config = l.gemm_key();
        r.launches = l.summary(from_logits);
      }
      if (t > 0)
        measure_gpu(opt, *gpu_plan, s, routes, hidden, reference ? &*reference : nullptr, *dev, *timer,
                    device_weights, r, log);
    } else {
      r.path = "cpu-reference";
      r.config = "CPU reference (double accumulation); GPU path unavailable: " + why_cpu;
      r.cpu_reference_ms = t == 0 ? 0 : reference_ms;
      if (t > 0 && !reference)
        r.note = "CPU reference skipped: " + std::to_string(int64_t(r.work.flops / 1e9)) +
                 " GFLOP exceeds --max-cpu-gflop";
    }

    if (!dev) {
      r.sol.why_not = why_no_device;
    } else if (!opt.measure_sol) {
      r.sol.why_not = "disabled (--no-sol)";
    } else if (t == 0) {
      r.sol.why_not = "T=0";
    } else {
      r.sol = measure_sol(opt, s, counts, *dev, *timer, device_weights, log);
    }
    records.push_back(std::move(r));
  }
  return records;
}

}  // namespace loom::bench
