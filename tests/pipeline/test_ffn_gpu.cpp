// The ffn layer (w13 -> SiLU(gate)*up, requantised -> w2 -> weighted combine -> bf16) through
// plan()/run() against the CPU reference (layer_ref), the output poisoned first: decode to prefill
// batches (every GEMM-1 family the chooser picks), skew, empty experts, routes from logits and
// from ids, both combines; deterministic runs bitwise stable and equal to a graph replay.
//
// Two checks per run (docs/numerics.md, "ffn fp8 re-quantisation"):
//  - the intermediate the GPU left in the workspace, value by value against the reference's
//    SiLU(gate)*up: within half an E4M3 step on the GPU's own scale, plus GEMM 1's accumulation
//    noise. A code that rounds the other way on that noise passes; a wrong row, column, scale or
//    code does not.
//  - the output against the reference that runs GEMM 2 and the combine on that same intermediate:
//    2e-3 overall and 1e-2 per token row. Against the reference's own intermediate, the codes that
//    round the other way add ~3e-3 (the square root of the noise times the E4M3 step), more on a
//    row of few routes; that is printed, and bounded only loosely.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "bench/device_buffer.hpp"
#include "common/bf16.hpp"
#include "contract/device_layout.hpp"
#include "gemm/select/config.hpp"
#include "gpu_test.hpp"
#include "loom/loom.hpp"
#include "pipeline/gpu_reference.cuh"
#include "pipeline/layer_ref.hpp"
#include "pipeline/plan_buckets.hpp"
#include "quant/fp8_e4m3.hpp"
#include "quant/quant_ref.hpp"
#include "route/route_ref.hpp"
#include "test_seed.hpp"
#include "workload/workload.hpp"

namespace loom {
namespace {

using bench::DeviceBuffer;

struct FfnCase {
  int64_t tokens, hidden, inter, experts, topk;
  const char* dist;
  bool deterministic = false;
  bool from_logits = true;  // random distribution only: route on the GPU (softmax: the CPU's ids exactly)
  bool gpu_reference = false;  // large shapes: the independent GPU reference instead of layer_ref
  const char* gemm_config = nullptr;   // GEMM 1's config (Options::gemm_config), else the chooser's
  const char* gemm2_config = nullptr;  // GEMM 2's (Options::gemm2_config)
  int64_t plan_tokens = 0;  // > tokens: the plan (and workspace) for more tokens than the run carries
  bool normal_weights = false;  // normal weight values (heavy tails, as trained weights) instead of uniform
};

struct FfnRun {
  Shape shape;
  LayerWeights weights;
  Routes routes;
  std::vector<bf16> hidden;
  DeviceBuffer w1, w1s, w2, w2s, h, logits, ids, wts, out, ws;
  Plan plan;
  bool from_logits = false;
  bool deterministic = false;  // the references round each weighted route row to bf16, as the combine reads them

  FfnRun(const FfnCase& c, uint64_t seed) : deterministic(c.deterministic) {
    shape = Shape{c.tokens, c.hidden, c.inter, c.experts, c.topk, Mode::ffn, DType::fp8};
    weights = make_weights(shape, seed, c.normal_weights ? WeightValues::normal : WeightValues::uniform);
    routes = make_routes(shape, Routing{}, parse_distribution(c.dist), seed + 1);
    hidden = make_hidden(shape, seed + 2);
    w1 = DeviceBuffer::from(weights.w1_q);
    w1s = DeviceBuffer::from(weights.w1_scales);
    w2 = DeviceBuffer::from(weights.w2_q);
    w2s = DeviceBuffer::from(weights.w2_scales);
    h = DeviceBuffer::from(hidden);
    from_logits = c.from_logits && !routes.logits.empty();
    if (from_logits) {
      logits = DeviceBuffer::from(routes.logits);
    } else {
      ids = DeviceBuffer::from(routes.topk.ids);
      wts = DeviceBuffer::from(routes.topk.weights);
    }
    out = DeviceBuffer(size_t(std::max<int64_t>(1, shape.tokens * shape.hidden)) * 2);
    Options o;
    o.deterministic = c.deterministic;
    if (c.gemm_config) o.gemm_config = c.gemm_config;
    if (c.gemm2_config) o.gemm2_config = c.gemm2_config;
    Shape planned = shape;
    planned.tokens = std::max(c.tokens, c.plan_tokens);
    plan = loom::plan(planned, Routing{}, o);
    ws = DeviceBuffer(workspace_bytes(plan));
    test::fill(ws.get(), 0xff, ws.bytes());  // a run depends on no workspace contents
  }
  Inputs inputs() const {
    Inputs in;
    in.tokens = shape.tokens;
    in.hidden = h.get();
    in.router_logits = logits.as<float>();
    in.topk_ids = ids.as<int32_t>();
    in.topk_weights = wts.as<float>();
    return in;
  }
  Weights device_weights() const {
    Weights w;
    w.w1 = w1.get();
    w.w1_scales = w1s.as<float>();
    w.w2 = w2.get();
    w.w2_scales = w2s.as<float>();
    return w;
  }
  // One eager run on `stream`, output poisoned (bf16 NaN) first; the output's bf16 bits.
  std::vector<uint16_t> run_once(cudaStream_t stream = nullptr) {
    test::fill(out.get(), 0xff, out.bytes());
    run(plan, device_weights(), inputs(), out.get(), ws.get(), stream);
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<uint16_t> b = out.to_host<uint16_t>();
    b.resize(size_t(shape.tokens * shape.hidden));
    return b;
  }
  // The intermediate the last run left in the workspace, per route t*k+j, as GEMM 2 read it
  // (sorted row route_row[t*k+j]; fragment order and scale layout as the plan's GEMM 2 reads them).
  RouteIntermediate intermediate() const {
    const int64_t T = shape.tokens, k = shape.topk, I = shape.inter, ib = quant_blocks(I), routes = T * k;
    const int64_t rows = padded_rows(routes);
    const GemmConfig& g2 = launches_for(plan, T, from_logits).gemm2;
    const bool fragments = x_source(g2) == XSource::sorted_fragments;
    const ScaleLayout layout = scale_layout(g2);
    const Plan::Layout& L = plan.layout;
    auto bytes = [&](size_t offset, size_t n) {
      std::vector<uint8_t> v(n);
      LOOM_CUDA_CHECK(cudaMemcpy(v.data(), static_cast<const uint8_t*>(ws.get()) + offset, n, cudaMemcpyDeviceToHost));
      return v;
    };
    const std::vector<uint8_t> rr = bytes(L.route_row, size_t(routes) * 4), codes = bytes(L.act, size_t(rows * I));
    const std::vector<uint8_t> sb = bytes(L.act_scales, size_t(round_up(ib, 4) * rows) * 4);
    RouteIntermediate g;
    g.codes.assign(size_t(routes * I), 0);
    g.scales.assign(size_t(routes * ib), 0.0f);
    for (int64_t route = 0; route < routes; ++route) {
      int32_t row;
      std::memcpy(&row, rr.data() + route * 4, 4);
      if (row < 0) continue;  // dropped
      EXPECT_LT(row, routes) << "route " << route;
      if (row >= routes) continue;
      for (int64_t c = 0; c < I; ++c) {
        const int64_t w = c % 128 / 4, group_full = c / 128 * 128 + 128 <= I;
        const int64_t src = fragments && group_full ? fragment_word(int(w)) : w;
        g.codes[size_t(route * I + c)] = codes[size_t(row * I + c / 128 * 128 + 4 * src + c % 4)];
      }
      for (int64_t b = 0; b < ib; ++b)
        std::memcpy(&g.scales[size_t(route * ib + b)], sb.data() + scale_index(layout, b, row, rows) * 4, 4);
    }
    return g;
  }
};

// The GPU's intermediate against the reference's act, value by value (see the top of the file).
void check_intermediate(const RouteIntermediate& g, const std::vector<float>& act, const TopK& topk, int64_t experts,
                        int64_t inter) {
  const int64_t ib = quant_blocks(inter);
  int64_t flips = 0, values = 0, bad = 0;
  for (int64_t route = 0; route < topk.tokens * topk.topk; ++route) {
    const int32_t id = topk.ids[size_t(route)];
    if (id < 0 || id >= experts) continue;
    for (int64_t c = 0; c < inter; ++c) {
      const float scale = g.scales[size_t(route * ib + c / 128)];
      const float got = e4m3_to_float(g.codes[size_t(route * inter + c)]) * scale, want = act[size_t(route * inter + c)];
      // Half a step on the GPU's grid; the noise: GEMM 1's reduced-precision accumulation moves act
      // by ~1e-4 of the group's largest value (448 x scale).
      const double tol = double(e4m3_half_ulp(want / scale)) * scale * 1.001 + 2e-3 * 448.0 * scale;
      ++values;
      if (quant_value(want, scale) != g.codes[size_t(route * inter + c)]) ++flips;
      if (!(std::fabs(double(got) - double(want)) <= tol) && bad++ < 5)
        ADD_FAILURE() << "intermediate of route " << route << " (expert " << id << "), column " << c << ": GPU " << got
                      << " (scale " << scale << "), reference " << want << ", tolerance " << tol;
    }
  }
  EXPECT_EQ(bad, 0) << "intermediate values outside half an E4M3 step (+ noise) of the reference";
  // Codes other than the nearest on the GPU's own scale: act within GEMM 1's accumulation noise of a
  // rounding midpoint. 1.1 % on every shape measured (H200); twice that is more noise than the
  // per-128-K promotion leaves.
  EXPECT_LE(flips, values / 50 + 8) << "of " << values << " intermediate codes";
}

// The run's output (bf16 as float) and intermediate against the references of `topk` (what was
// routed).
void check_output(const FfnRun& r, const std::vector<float>& got, const TopK& topk, bool gpu_reference) {
  const Shape& s = r.shape;
  const RouteIntermediate mid = r.intermediate();
  std::vector<double> own, same;  // GEMM 2 on the reference's own intermediate; on the GPU's
  std::vector<float> act;
  if (gpu_reference) {
    if (r.deterministic) ADD_FAILURE() << "the GPU reference has no bf16 route rows: a deterministic case needs layer_ref";
    own = test::reference_ffn_fp8_gpu(r.weights, r.hidden, topk, nullptr, &act);
    same = test::reference_ffn_fp8_gpu(r.weights, r.hidden, topk, &mid);
  } else {
    LayerResult ref = layer_ref(r.weights, r.hidden.data(), topk, nullptr, r.deterministic);
    own = std::move(ref.out);
    act = std::move(ref.act);
    same = layer_ref(r.weights, r.hidden.data(), topk, &mid, r.deterministic).out;
  }
  check_intermediate(mid, act, topk, s.experts, s.inter);
  const ErrorStats e = relative_error(got.data(), same.data(), s.tokens, s.hidden);
  EXPECT_LE(e.overall, 2e-3) << "relative Frobenius error (GEMM 2 on the GPU's intermediate)";
  EXPECT_LE(e.worst_row, 1e-2) << "worst token row " << e.worst_row_index;
  const ErrorStats o = relative_error(got.data(), own.data(), s.tokens, s.hidden);
  std::printf("  T=%lld H=%lld I=%lld E=%lld k=%lld: vs the same intermediate %.2e (row %.2e), vs its own %.2e (row %.2e)\n",
              (long long)s.tokens, (long long)s.hidden, (long long)s.inter, (long long)s.experts, (long long)s.topk,
              e.overall, e.worst_row, o.overall, o.worst_row);
  // Only a gross bound: the codes that round the other way are few on a small layer, so their share
  // of the error has a long tail (measured up to 1.6e-2 at T=16, I=128, k=2).
  EXPECT_LE(o.overall, 5e-2) << "relative Frobenius error (the reference's own intermediate)";
}

std::vector<float> to_float(const std::vector<uint16_t>& bits) {
  std::vector<float> f(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) f[i] = bf16_to_float(bf16{bits[i]});
  return f;
}

void check_case(const FfnCase& c, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "T=" << c.tokens << " H=" << c.hidden << " I=" << c.inter << " E=" << c.experts
                                  << " k=" << c.topk << " " << c.dist
                                  << (c.deterministic ? " deterministic" : " fast") << (c.from_logits ? " logits" : " ids")
                                  << (c.gemm_config ? " GEMM 1 " : "") << (c.gemm_config ? c.gemm_config : "")
                                  << (c.gemm2_config ? " GEMM 2 " : "") << (c.gemm2_config ? c.gemm2_config : "")
                                  << (c.plan_tokens > c.tokens ? " plan for " : "")
                                  << (c.plan_tokens > c.tokens ? std::to_string(c.plan_tokens) : "")
                                  << (c.normal_weights ? " normal weights" : ""));
  FfnRun r(c, seed);
  check_output(r, to_float(r.run_once()), r.routes.topk, c.gpu_reference);
  const LayerStatus st = read_status(r.plan, r.ws.get(), nullptr);
  EXPECT_EQ(st.dropped_routes, 0u);
  EXPECT_EQ(st.nan_tokens, 0u);
}

// Decode to prefill on the qwen35-layer widths: gathered (1, 3, 17), sorted (128), token tiles
// (1000, 2048) for GEMM 1; skew; both combines; routes from ids.
TEST(FfnGpu, MatchesCpuReferenceFromDecodeToPrefill) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  std::vector<FfnCase> cases{{1, 2048, 512, 256, 8, "random"},
                             {3, 2048, 512, 256, 8, "random"},
                             {17, 2048, 512, 64, 2, "random"},
                             {128, 2048, 512, 256, 8, "random"},
                             {128, 2048, 512, 256, 8, "zipf:1.2", false, false},
                             {128, 2048, 512, 256, 8, "hot:0.9", true, false},
                             {128, 2048, 512, 64, 8, "balanced", false, false},
                             {300, 1024, 256, 8, 2, "concentrated", false, false},  // empty experts
                             {1000, 2048, 512, 64, 8, "random"},
                             {2048, 2048, 512, 256, 8, "random", true},
                             {2048, 1024, 384, 16, 4, "random", false, false},
                             // I not a multiple of 128: gate and up in blocks of their own, GEMM 2 on a
                             // partial K block
                             {17, 2048, 192, 64, 8, "random"},
                             {1000, 1024, 192, 16, 4, "zipf:1.2", false, false},
                             {300, 512, 320, 8, 2, "concentrated", true, false},
                             {2048, 1024, 80, 32, 8, "random"},
                             // GEMM 1 with the intermediate in its epilogue (asked for by key)
                             {1000, 2048, 512, 64, 8, "zipf:1.2", false, true, false, "tM.wide.s4.act.dyn"},
                             {2048, 1024, 384, 16, 4, "random", false, false, false, "tM.wide.s4.act.dyn.exl"},
                             // GEMM 2 with the hand-off epilogue (row-quad scales from the intermediate's kernel)
                             {512, 2048, 512, 64, 8, "random", false, true, false, nullptr,
                              "wM.sorted.s4.ho.red.dense.dyn.efw"},
                             // GEMM 1 over split K or balanced shares, reducing into h's sorted rows
                             // (asked for by key; the glue clears h)
                             {1, 2048, 512, 256, 8, "random", false, true, false, "wM.early.s8.red.compact.k2.warm"},
                             {3, 2048, 512, 64, 8, "random", false, true, false, "wM.gather.s8.red.compact.k3.efw"},
                             {17, 1024, 192, 16, 4, "zipf:1.2", false, false, false, "wM.gather.s8.red.compact.bal.efw"},
                             // A run of fewer tokens than its plan's (the PyTorch front plans for a
                             // power-of-two bucket of T): the workspace's layout is the plan's
                             {1, 2048, 512, 256, 8, "random", false, true, false, nullptr, nullptr, 16},
                             {17, 2048, 512, 64, 8, "random", true, true, false, nullptr, nullptr, 32},
                             {100, 1024, 256, 32, 4, "zipf:1.2", false, false, false, nullptr, nullptr, 128},
                             {1000, 2048, 512, 64, 8, "random", false, true, false, nullptr, nullptr, 1024},
                             // Normal weight values (the PyTorch tests' Gaussian weights were 1-2e-2 off)
                             {1, 2048, 512, 256, 8, "random", false, true, false, nullptr, nullptr, 0, true},
                             {128, 2048, 512, 256, 8, "random", false, true, false, nullptr, nullptr, 0, true},
                             {300, 512, 320, 8, 2, "concentrated", true, false, false, nullptr, nullptr, 0, true}};
  if (!test::sanitizer().empty())  // instrumented: the same paths on narrower layers
    cases = {{1, 512, 256, 16, 2, "random"},
             {17, 512, 256, 16, 2, "random"},
             {128, 512, 256, 64, 8, "random", true},
             {300, 512, 256, 8, 2, "concentrated", false, false},
             {1200, 512, 256, 16, 4, "random"},
             {300, 512, 192, 8, 2, "concentrated", true, false},
             {1200, 512, 256, 16, 4, "random", false, true, false, "tM.wide.s4.act.dyn"},
             {3, 512, 256, 16, 2, "random", false, true, false, "wM.gather.s8.red.compact.k2"}};
  for (const FfnCase& c : cases) check_case(c, seed);
}

// Wide layers and many experts: H = 7168, I = 1536, E = 512, k = 16; the largest against the
// independent GPU reference, which itself agrees with layer_ref on small shapes.
TEST(FfnGpu, WideLayersAndTheGpuReference) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  for (const FfnCase& c : {FfnCase{17, 256, 128, 8, 2, "random"}, FfnCase{64, 512, 384, 16, 4, "zipf:1.2", false, false}}) {
    SCOPED_TRACE(testing::Message() << "GPU reference vs layer_ref, T=" << c.tokens);
    FfnRun r(c, seed);
    const std::vector<double> gpu = test::reference_ffn_fp8_gpu(r.weights, r.hidden, r.routes.topk);
    const std::vector<double> cpu = layer_ref(r.weights, r.hidden.data(), r.routes.topk).out;
    const std::vector<float> g(gpu.begin(), gpu.end());
    const ErrorStats e = relative_error(g.data(), cpu.data(), c.tokens, c.hidden);
    EXPECT_LE(e.overall, 1e-5);  // summation order, and a rare act code on an E4M3 midpoint
    EXPECT_LE(e.worst_row, 1e-4);
  }
  if (!test::sanitizer().empty()) return;  // the reference itself is what the tools cover here
  check_case({3, 7168, 1536, 8, 1, "random"}, seed);
  check_case({17, 2048, 1536, 512, 16, "hot:0.9", false, false}, seed);
  check_case({1000, 7168, 512, 64, 2, "zipf:1.2", false, false, true}, seed);
  check_case({8192, 2048, 512, 256, 8, "random", false, true, true}, seed);
}

// The output of one graph replay of run() on a non-blocking stream (the output poisoned first).
std::vector<uint16_t> graph_replay(FfnRun& r) {
  test::Stream stream;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  LOOM_CUDA_CHECK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
  run(r.plan, r.device_weights(), r.inputs(), r.out.get(), r.ws.get(), stream.get());
  LOOM_CUDA_CHECK(cudaStreamEndCapture(stream.get(), &graph));
  LOOM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  test::fill(r.out.get(), 0xff, r.out.bytes());
  LOOM_CUDA_CHECK(cudaGraphLaunch(exec, stream.get()));
  stream.sync();
  std::vector<uint16_t> replay = r.out.to_host<uint16_t>();
  replay.resize(size_t(r.shape.tokens * r.shape.hidden));
  LOOM_CUDA_CHECK(cudaGraphExecDestroy(exec));
  LOOM_CUDA_CHECK(cudaGraphDestroy(graph));
  return replay;
}

// Deterministic combine: 20 runs bitwise equal, and equal to a graph replay, on weights-on-M
// (256 tokens) and token-tile (2048) GEMMs. Under a sanitizer: 5 runs on a narrower layer.
TEST(FfnGpu, DeterministicIsBitwiseStableAndMatchesGraphReplay) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  const bool tool = !test::sanitizer().empty();
  for (const int64_t tokens : {int64_t(256), int64_t(2048)}) {
    SCOPED_TRACE(testing::Message() << "T=" << tokens);
    FfnRun r({tokens, tool ? 512 : 2048, tool ? 256 : 512, 64, 8, "random", true}, seed);
    const std::vector<uint16_t> first = r.run_once();
    for (int i = 0; i < (tool ? 4 : 19); ++i) ASSERT_EQ(r.run_once(), first) << "run " << i + 2;
    EXPECT_EQ(graph_replay(r), first);
  }
}

// Fast combine (float reductions in any order): a graph replay within tolerance of an eager run.
TEST(FfnGpu, FastGraphReplayMatchesEagerRun) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  const int64_t hidden = test::sanitizer().empty() ? 2048 : 512;
  for (const int64_t tokens : {int64_t(17), int64_t(256), int64_t(2048)}) {
    SCOPED_TRACE(testing::Message() << "T=" << tokens);
    FfnRun r({tokens, hidden, 256, 64, 8, "random"}, seed);
    const std::vector<float> eager = to_float(r.run_once()), replay = to_float(graph_replay(r));
    const std::vector<double> ref(eager.begin(), eager.end());
    const ErrorStats e = relative_error(replay.data(), ref.data(), tokens, hidden);
    EXPECT_LE(e.overall, 2e-3);
    EXPECT_LE(e.worst_row, 1e-2) << "worst token row " << e.worst_row_index;
  }
}

// Ids outside [0, E) are dropped and counted; NaN router logits rank last and are counted; the
// output stays finite and matches the reference of what was routed.
TEST(FfnGpu, BadIdsAndNanLogitsAreCountedNotFatal) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  FfnRun r({16, 256, 128, 8, 2, "balanced", false, false}, seed);
  TopK bad = r.routes.topk;
  bad.ids[3] = -1;
  bad.ids[10] = 8;
  bad.ids[11] = 1 << 30;
  r.ids = DeviceBuffer::from(bad.ids);
  const std::vector<float> got = to_float(r.run_once());
  EXPECT_EQ(read_status(r.plan, r.ws.get(), nullptr).dropped_routes, 3u);
  check_output(r, got, bad, false);

  FfnRun n({16, 256, 128, 8, 2, "random"}, seed + 7);
  std::vector<float> logits = n.routes.logits;
  for (int x = 0; x < 8; ++x) logits[size_t(5 * 8 + x)] = NAN;  // token 5: all NaN
  logits[size_t(9 * 8 + 2)] = NAN;                              // token 9: one NaN
  n.logits = DeviceBuffer::from(logits);
  const std::vector<float> got2 = to_float(n.run_once());
  EXPECT_EQ(read_status(n.plan, n.ws.get(), nullptr).nan_tokens, 2u);
  for (float v : got2) ASSERT_TRUE(std::isfinite(v));
  check_output(n, got2, route_ref(logits.data(), 16, 8, 2, Routing{}), false);

  // Every route dropped: no routed row at all, and the (zero) output is still written.
  FfnRun z({16, 256, 128, 8, 2, "balanced", false, false}, seed + 9);
  TopK none = z.routes.topk;
  for (int32_t& id : none.ids) id = -1;
  z.ids = DeviceBuffer::from(none.ids);
  for (uint16_t b : z.run_once()) ASSERT_EQ(b & 0x7fff, 0) << "the output of a layer with no routed row is 0";
  EXPECT_EQ(read_status(z.plan, z.ws.get(), nullptr).dropped_routes, 32u);
}

TEST(FfnGpu, ZeroTokensLaunchesNothing) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  FfnRun r({4, 256, 128, 8, 2, "random"}, seed);
  test::fill(r.out.get(), 0x5a, r.out.bytes());
  Inputs in = r.inputs();
  in.tokens = 0;
  run(r.plan, r.device_weights(), in, r.out.get(), r.ws.get(), nullptr);
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  for (uint16_t b : r.out.to_host<uint16_t>()) ASSERT_EQ(b, 0x5a5a) << "T = 0 must not touch the output";
}

}  // namespace
}  // namespace loom
