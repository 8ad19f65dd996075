// The whole seed pipeline (plan/run) on the GPU against the CPU reference (small shapes) or the
// independent GPU reference (large shapes), outputs poisoned with NaN before each run; graph vs
// eager, deterministic mode, bad device data, edge cases.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "bench/device_buffer.hpp"
#include "gemm/gemm_fp8.hpp"
#include "gemm/select/choose.hpp"
#include "gpu_test.hpp"
#include "loom/loom.hpp"
#include "contract/device_layout.hpp"
#include "pipeline/gpu_reference.cuh"
#include "pipeline/layer_ref.hpp"
#include "pipeline/moe_pipeline.hpp"
#include "test_seed.hpp"
#include "workload/workload.hpp"

namespace loom {
namespace {

using bench::DeviceBuffer;

struct Case {
  int64_t tokens, hidden, inter, experts, topk;
  const char* dist;
  bool from_logits = true;  // random distribution only: route on the GPU
  Routing routing{};
  bool skew_logits = false;  // other distributions: route on the GPU from logits that pick their ids
};

// Device copies of one workload and a helper to run the layer on them.
struct Harness {
  Shape shape;
  Routing routing;
  LayerWeights weights;
  Routes routes;
  std::vector<bf16> hidden;
  DeviceBuffer w1, w1s, h, logits, bias, ids, wts, out, ws;
  Plan plan;

  Harness(const Case& c, uint64_t seed, const Options& opt = {}) {
    shape = Shape{c.tokens, c.hidden, c.inter, c.experts, c.topk, Mode::single, DType::fp8};
    routing = c.routing;
    weights = make_weights(shape, seed);
    routes = make_routes(shape, routing, parse_distribution(c.dist), seed + 1);
    if (c.skew_logits) route_from_logits(shape, routing, seed + 1, routes);
    hidden = make_hidden(shape, seed + 2);
    w1 = DeviceBuffer::from(weights.w1_q);
    w1s = DeviceBuffer::from(weights.w1_scales);
    h = DeviceBuffer::from(hidden);
    if (!routes.logits.empty() && c.from_logits) {
      logits = DeviceBuffer::from(routes.logits);
      if (!routes.expert_bias.empty()) bias = DeviceBuffer::from(routes.expert_bias);
    } else {
      ids = DeviceBuffer::from(routes.topk.ids);
      wts = DeviceBuffer::from(routes.topk.weights);
    }
    out = DeviceBuffer(size_t(std::max<int64_t>(1, shape.tokens * shape.inter)) * 4);
    plan = loom::plan(shape, routing, opt);
    ws = DeviceBuffer(workspace_bytes(plan));
    // cudaMalloc gives no particular contents: a run must not depend on any (e.g. the GEMM's work
    // queue, which the kernel before it clears; left as -1 it would send CTAs to invalid units).
    test::fill(ws.get(), 0xff, ws.bytes());
  }
  Inputs inputs() const {
    Inputs in;
    in.tokens = shape.tokens;
    in.hidden = h.get();
    in.router_logits = logits.as<float>();
    in.expert_bias = bias.as<float>();
    in.topk_ids = ids.as<int32_t>();
    in.topk_weights = wts.as<float>();
    return in;
  }
  Weights device_weights() const {
    Weights w;
    w.w1 = w1.get();
    w.w1_scales = w1s.as<float>();
    return w;
  }
  // One eager run with a NaN-poisoned output; returns the output.
  std::vector<float> run_once(cudaStream_t stream = nullptr) {
    test::fill(out.get(), 0xff, out.bytes());
    run(plan, device_weights(), inputs(), out.get(), ws.get(), stream);
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
    return out.to_host<float>();
  }
  // The routes the GPU used (for sigmoid routing, whose near-ties may legitimately differ).
  TopK device_routes() const {
    if (logits.get() == nullptr) return routes.topk;
    TopK t;
    t.tokens = shape.tokens;
    t.topk = shape.topk;
    t.ids.resize(size_t(shape.routes()));
    t.weights.resize(size_t(shape.routes()));
    LOOM_CUDA_CHECK(cudaMemcpy(t.ids.data(), static_cast<uint8_t*>(ws.get()) + plan.layout.topk_ids,
                               t.ids.size() * 4, cudaMemcpyDeviceToHost));
    LOOM_CUDA_CHECK(cudaMemcpy(t.weights.data(), static_cast<uint8_t*>(ws.get()) + plan.layout.topk_weights,
                               t.weights.size() * 4, cudaMemcpyDeviceToHost));
    return t;
  }
};

void expect_close(const std::vector<float>& got, const std::vector<double>& ref, int64_t rows, int64_t cols) {
  const ErrorStats e = relative_error(got.data(), ref.data(), rows, cols);
  EXPECT_LE(e.overall, 2e-3) << "relative Frobenius error";
  EXPECT_LE(e.worst_row, 1e-2) << "worst token row " << e.worst_row_index;
}

// Under compute-sanitizer (tests/gpu_test.hpp) a kernel runs hundreds of times slower: the heaviest
// tests take smaller shapes on the same paths, checked against the CPU reference (the GPU one, a
// double-precision GEMM through shared memory, is the slowest kernel of all there; its own test,
// GpuReferenceAgreesWithCpuReference, runs under the tools too).
bool instrumented() { return !test::sanitizer().empty(); }

// One run of the harness's workload against the reference (CPU, or the GPU one for large shapes).
void check_run(Harness& hs, const Case& c, bool gpu_reference) {
  gpu_reference = gpu_reference && !instrumented();
  const std::vector<float> got = hs.run_once();
  const TopK used = hs.device_routes();
  if (c.routing.scoring == Scoring::softmax && hs.logits.get()) {
    EXPECT_EQ(used.ids, hs.routes.topk.ids) << "softmax routing ranks raw logits: ids are exact";
  }
  const std::vector<double> ref = gpu_reference ? test::reference_single_fp8_gpu(hs.weights, hs.hidden, used)
                                                : layer_ref(hs.weights, hs.hidden.data(), used).out;
  expect_close(got, ref, c.tokens, c.inter);
}

void check_case(const Case& c, uint64_t seed, bool gpu_reference) {
  SCOPED_TRACE(testing::Message() << "T=" << c.tokens << " K=" << c.hidden << " N=" << c.inter << " E=" << c.experts
                                  << " k=" << c.topk << " " << c.dist);
  Harness hs(c, seed);
  check_run(hs, c, gpu_reference);
}

TEST(PipelineGpu, Qwen35SinglePreset) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  const Preset& p = find_preset("qwen35-single");
  check_case({p.shape.tokens, p.shape.hidden, p.shape.inter, p.shape.experts, p.shape.topk, "random"}, seed, false);
}

TEST(PipelineGpu, CoversEveryTokenExpertTopkAndWidth) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  check_case({1, 2048, 512, 8, 1, "balanced"}, seed, false);
  check_case({3, 7168, 4096, 64, 2, "zipf:1.2"}, seed, false);
  check_case({17, 2048, 512, 512, 16, "hot:0.9"}, seed, false);
  check_case({128, 2048, 512, 256, 8, "concentrated"}, seed, false);
  check_case({128, 2048, 512, 256, 8, "zipf:1.2"}, seed, false);
  check_case({128, 2048, 512, 256, 8, "hot:0.9"}, seed, false);
  check_case({17, 192, 80, 8, 2, "random"}, seed, false);  // partial 128-blocks in K and N
  // Routed on the GPU by the fused small-batch kernel (which also quantises, in extra CTAs).
  check_case({2, 2048, 512, 64, 8, "random"}, seed, false);
  check_case({8, 7168, 512, 256, 8, "random"}, seed, false);
  check_case({32, 2048, 512, 256, 8, "random"}, seed, false);
}

// Skewed routes from router logits, through the routing kernel and its expert bins: batches above
// 32 tokens with few rows per expert on average gather from the bins (chunk walk), where skew puts
// tens to hundreds of rows on some experts (several chunks each); larger batches, the
// register-loaded GEMM.
TEST(PipelineGpu, SkewedRoutesFromLogitsThroughExpertBins) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  const std::vector<Case> full{Case{128, 2048, 512, 256, 8, "hot:0.9"}, Case{128, 2048, 512, 256, 8, "zipf:1.2"},
                               Case{128, 2048, 512, 256, 8, "concentrated"}, Case{512, 2048, 512, 256, 8, "zipf:1.2"},
                               Case{40, 192, 80, 8, 2, "concentrated"}, Case{300, 2048, 512, 64, 2, "balanced"},
                               Case{2048, 2048, 512, 256, 8, "hot:0.9"}};
  // The same chains on narrower layers: resident rows, 64 x 256 and 128 x 128 token tiles.
  const std::vector<Case> small{Case{40, 192, 80, 8, 2, "concentrated"}, Case{128, 512, 256, 64, 8, "hot:0.9"},
                                Case{128, 512, 256, 64, 8, "zipf:1.2"}, Case{300, 512, 256, 16, 2, "balanced"},
                                Case{1200, 512, 256, 16, 4, "hot:0.9"}};
  for (Case c : instrumented() ? small : full) {
    SCOPED_TRACE(testing::Message() << "T=" << c.tokens << " E=" << c.experts << " k=" << c.topk << " " << c.dist);
    c.skew_logits = true;
    Harness hs(c, seed);
    const Chain chain = chain_for(hs.plan, c.tokens, true);
    EXPECT_TRUE(chain.expert_bins);
    EXPECT_FALSE(chain.sorted_rows);
    check_run(hs, c, c.tokens > 1000);
  }
}

TEST(PipelineGpu, LargeShapesAgainstGpuReference) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  if (instrumented()) {  // the same GEMM configs on narrower layers
    check_case({1000, 768, 256, 16, 8, "concentrated"}, seed, false);
    check_case({600, 512, 1024, 64, 2, "balanced"}, seed, false);
    check_case({2048, 512, 256, 32, 8, "random"}, seed, false);
    return;
  }
  check_case({1000, 7168, 512, 64, 8, "concentrated"}, seed, true);
  check_case({1000, 2048, 4096, 512, 2, "balanced"}, seed, true);
  check_case({8192, 2048, 512, 256, 8, "random"}, seed, true);
}

// One plan and workspace for up to 8192 tokens, run at batch sizes whose GEMMs read their rows
// three ways: gathered by token (16), the expert-sorted copy (512, 900), and by token into
// registers (5000, 8192 and 2048 in 128 x 128 tiles; 1536 in 64 x 256 tiles). Each batch against
// the GPU reference on its own tokens, the output poisoned first.
TEST(PipelineGpu, OnePlanServesEveryActivationLayout) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  // Instrumented: a plan for 2048 tokens of a narrower layer, batches on the same paths (16
  // gathered, 100 sorted, 140 in 64 x 256 tiles, 300 and 2048 in 128 x 128).
  const bool small = instrumented();
  const int64_t planned = small ? 2048 : 8192;
  Harness hs(small ? Case{planned, 512, 256, 32, 8, "random", /*from_logits=*/false}
                   : Case{planned, 2048, 512, 256, 8, "random", /*from_logits=*/false},
             seed);
  const std::vector<int64_t> batches =
      small ? std::vector<int64_t>{2048, 100, 16, 140, 300} : std::vector<int64_t>{8192, 900, 16, 5000, 512, 1536, 2048};
  for (const int64_t t : batches) {
    SCOPED_TRACE(testing::Message() << "batch of " << t << " on a plan for " << planned);
    EXPECT_EQ(use_token_fragments(t, hs.shape.topk, hs.shape.experts, hs.shape.hidden), t >= (small ? 120 : 1536));
    Inputs in = hs.inputs();
    in.tokens = t;
    LOOM_CUDA_CHECK(cudaMemset(hs.out.get(), 0xff, hs.out.bytes()));
    run(hs.plan, hs.device_weights(), in, hs.out.get(), hs.ws.get(), nullptr);
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> got = hs.out.to_host<float>();
    got.resize(size_t(t * hs.shape.inter));
    TopK used;
    used.tokens = t;
    used.topk = hs.shape.topk;
    used.ids.assign(hs.routes.topk.ids.begin(), hs.routes.topk.ids.begin() + t * hs.shape.topk);
    used.weights.assign(hs.routes.topk.weights.begin(), hs.routes.topk.weights.begin() + t * hs.shape.topk);
    const std::vector<bf16> h(hs.hidden.begin(), hs.hidden.begin() + t * hs.shape.hidden);
    expect_close(got,
                 small ? layer_ref(hs.weights, h.data(), used).out : test::reference_single_fp8_gpu(hs.weights, h, used),
                 t, hs.shape.inter);
  }
}

TEST(PipelineGpu, GpuReferenceAgreesWithCpuReference) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  for (const Case& c : {Case{17, 192, 80, 8, 2, "random"}, Case{64, 2048, 512, 64, 8, "zipf:1.2"}}) {
    const Shape s{c.tokens, c.hidden, c.inter, c.experts, c.topk, Mode::single, DType::fp8};
    const LayerWeights w = make_weights(s, seed);
    const Routes r = make_routes(s, Routing{}, parse_distribution(c.dist), seed + 1);
    const std::vector<bf16> h = make_hidden(s, seed + 2);
    const std::vector<double> gpu = test::reference_single_fp8_gpu(w, h, r.topk);
    const std::vector<double> cpu = layer_ref(w, h.data(), r.topk).out;
    std::vector<float> gpu_f(gpu.begin(), gpu.end());
    const ErrorStats e = relative_error(gpu_f.data(), cpu.data(), c.tokens, c.inter);
    EXPECT_LE(e.overall, 1e-6);  // both exact in double; the float copy rounds
    EXPECT_LE(e.worst_row, 1e-6);
  }
}

TEST(PipelineGpu, SigmoidGroupedAndSoftcapRouting) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  Case sig{128, 2048, 512, 256, 8, "random"};
  sig.routing.scoring = Scoring::sigmoid;
  sig.routing.n_group = 8;
  sig.routing.topk_group = 4;
  sig.routing.scale = 2.5f;
  check_case(sig, seed, false);
  Case cap{64, 2048, 512, 64, 4, "random"};
  cap.routing.softcap = 30.0f;
  cap.routing.renormalize = false;
  check_case(cap, seed, false);
}

TEST(PipelineGpu, ZeroTokensLaunchesNothing) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  Harness hs({4, 256, 128, 8, 2, "random"}, seed);
  LOOM_CUDA_CHECK(cudaMemset(hs.out.get(), 0x5a, hs.out.bytes()));
  Inputs in = hs.inputs();
  in.tokens = 0;
  run(hs.plan, hs.device_weights(), in, hs.out.get(), hs.ws.get(), nullptr);
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  for (float v : hs.out.to_host<float>()) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    ASSERT_EQ(bits, 0x5a5a5a5au) << "T = 0 must not touch the output";
  }
}

// The layer captured once in a CUDA graph on a non-blocking stream; each replay poisons the
// output first and returns it.
class GraphRun {
 public:
  explicit GraphRun(Harness& hs) : hs_(hs) {
    LOOM_CUDA_CHECK(cudaStreamBeginCapture(stream_.get(), cudaStreamCaptureModeThreadLocal));
    run(hs.plan, hs.device_weights(), hs.inputs(), hs.out.get(), hs.ws.get(), stream_.get());
    cudaGraph_t g = nullptr;
    LOOM_CUDA_CHECK(cudaStreamEndCapture(stream_.get(), &g));
    LOOM_CUDA_CHECK(cudaGraphInstantiate(&exec_, g, 0));
    LOOM_CUDA_CHECK(cudaGraphDestroy(g));
  }
  ~GraphRun() { cudaGraphExecDestroy(exec_); }
  std::vector<float> replay() {
    LOOM_CUDA_CHECK(cudaMemsetAsync(hs_.out.get(), 0xff, hs_.out.bytes(), stream_.get()));
    LOOM_CUDA_CHECK(cudaGraphLaunch(exec_, stream_.get()));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
    return hs_.out.to_host<float>();
  }

 private:
  Harness& hs_;
  test::Stream stream_;
  cudaGraphExec_t exec_ = nullptr;
};

TEST(PipelineGpu, DeterministicModeIsBitwiseStableAndMatchesGraphReplay) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  Options opt;
  opt.deterministic = true;
  Harness hs({128, 2048, 512, 256, 8, "random"}, seed, opt);
  const std::vector<float> first = hs.run_once();
  const std::vector<float> second = hs.run_once();
  ASSERT_EQ(std::memcmp(first.data(), second.data(), first.size() * 4), 0) << "eager runs differ";
  GraphRun graph(hs);
  for (int rep = 0; rep < 3; ++rep) {
    const std::vector<float> replay = graph.replay();
    ASSERT_EQ(std::memcmp(first.data(), replay.data(), first.size() * 4), 0) << "graph replay " << rep << " differs";
  }
  expect_close(first, layer_ref(hs.weights, hs.hidden.data(), hs.routes.topk).out, 128, 512);
}

TEST(PipelineGpu, FastModeGraphReplayAgreesWithEager) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  Harness hs({32, 2048, 512, 256, 8, "random"}, seed);
  const std::vector<float> eager = hs.run_once();
  GraphRun graph(hs);
  const std::vector<float> replay = graph.replay();
  std::vector<double> eager_d(eager.begin(), eager.end());
  const ErrorStats e = relative_error(replay.data(), eager_d.data(), 32, 512);
  EXPECT_LE(e.overall, 1e-6) << "atomic order may differ, nothing else";
}

TEST(PipelineGpu, BadDeviceDataIsCountedNotFatal) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  // Precomputed routes with ids outside [0, E): dropped and counted; the rest is computed.
  Harness hs({16, 256, 128, 8, 2, "balanced"}, seed);
  TopK bad = hs.routes.topk;
  bad.ids[3] = -1;
  bad.ids[10] = 8;
  bad.ids[11] = 1 << 30;
  hs.ids = DeviceBuffer::from(bad.ids);
  const std::vector<float> got = hs.run_once();
  const LayerStatus st = read_status(hs.plan, hs.ws.get(), nullptr);
  EXPECT_EQ(st.dropped_routes, 3u);
  EXPECT_EQ(st.nan_tokens, 0u);
  expect_close(got, layer_ref(hs.weights, hs.hidden.data(), bad).out, 16, 128);
  // The debug option checks synchronously and throws.
  Options dbg;
  dbg.debug_checks = true;
  const Plan pd = plan(hs.shape, hs.routing, dbg);
  EXPECT_THROW(run(pd, hs.device_weights(), hs.inputs(), hs.out.get(), hs.ws.get(), nullptr), Error);

  // NaN router logits rank last and are counted; the output stays finite.
  Harness hn({16, 256, 128, 8, 2, "random"}, seed + 7);
  std::vector<float> logits = hn.routes.logits;
  for (int e = 0; e < 8; ++e) logits[size_t(5 * 8 + e)] = NAN;  // token 5: all NaN
  logits[size_t(9 * 8 + 2)] = NAN;                              // token 9: one NaN
  hn.logits = DeviceBuffer::from(logits);
  const std::vector<float> out = hn.run_once();
  EXPECT_EQ(read_status(hn.plan, hn.ws.get(), nullptr).nan_tokens, 2u);
  for (float v : out) ASSERT_TRUE(std::isfinite(v));
  const TopK ref = route_ref(logits.data(), 16, 8, 2, hn.routing);
  expect_close(out, layer_ref(hn.weights, hn.hidden.data(), ref).out, 16, 128);
}

// Batches on the register-loaded GEMM routed from logits take the expert bins (no dispatch kernel):
// the bins' counters are cleared by each run (three runs in a row, the workspace 0xff at first),
// NaN tokens are counted into the status, and the output matches the reference, as it does with
// the option off (the dispatch kernels).
TEST(PipelineGpu, ExpertBinsRunAfterRunWithNanTokens) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  // 256 rows per expert (register-loaded GEMM) and 4 (gathering GEMM, chunk walk).
  for (const auto& [tokens, experts] : {std::pair<int64_t, int64_t>{1024, 8}, std::pair<int64_t, int64_t>{128, 64}})
  for (const bool bins : {true, false}) {
    SCOPED_TRACE(testing::Message() << (bins ? "expert bins" : "dispatch kernels") << ", T=" << tokens);
    Options o;
    o.expert_bins = bins;
    Harness hs({tokens, 512, 128, experts, 2, "random"}, seed, o);
    ASSERT_EQ(chain_for(hs.plan, hs.shape.tokens, true).expert_bins, bins);
    EXPECT_EQ(hs.plan.layout.bin_stride, bins ? hs.shape.tokens : 0);
    std::vector<float> logits = hs.routes.logits;
    const int64_t E = experts, partly_nan = tokens - 27;
    for (int64_t e = 0; e < E; ++e) logits[size_t(70 * E + e)] = NAN;  // token 70: all NaN
    logits[size_t(partly_nan * E + 5)] = NAN;                         // one NaN
    hs.logits = DeviceBuffer::from(logits);
    const TopK ref_routes = route_ref(logits.data(), hs.shape.tokens, E, 2, hs.routing);
    const std::vector<double> ref = layer_ref(hs.weights, hs.hidden.data(), ref_routes).out;
    for (int r = 0; r < 3; ++r) {
      SCOPED_TRACE(testing::Message() << "run " << r);
      const std::vector<float> out = hs.run_once();
      const LayerStatus st = read_status(hs.plan, hs.ws.get(), nullptr);
      EXPECT_EQ(st.nan_tokens, 2u);
      EXPECT_EQ(st.dropped_routes, 0u);
      EXPECT_EQ(hs.device_routes().ids, ref_routes.ids);
      expect_close(out, ref, hs.shape.tokens, hs.shape.inter);
    }
  }
}

// Small batches routed by the fused kernel publish their expert ids early, and the GEMM starts its
// weight loads on them before its PDL wait. Runs queued back to back on one stream (each with its
// own logits and output, the workspace 0xff at first) must each use their own ids, never the
// previous run's; the words left after the last run are its ids.
TEST(PipelineGpu, EarlyExpertIdsRunAfterRun) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  struct Small {
    int64_t tokens, experts, topk;
  };
  for (const Small& sm : {Small{1, 256, 8}, Small{2, 64, 8}, Small{4, 256, 8}, Small{8, 64, 4}, Small{3, 16, 4},
                          Small{2, 32, 16}}) {
    SCOPED_TRACE(testing::Message() << "T=" << sm.tokens << " E=" << sm.experts << " k=" << sm.topk);
    ASSERT_LE(sm.tokens * sm.topk, kEarlyIdWords);
    Harness hs({sm.tokens, 512, 256, sm.experts, sm.topk, "random"}, seed);
    ASSERT_TRUE(chain_for(hs.plan, sm.tokens, true).fused_route_dispatch);
    // This batch's GEMM is the compact gathering walk that starts on the early ids (its config key:
    // wM.early.<stages>.<epilogue>.compact...).
    const std::string gemm = key(launches_for(hs.plan, sm.tokens, true).gemm);
    ASSERT_EQ(gemm.rfind("wM.early.", 0), 0u) << gemm;
    ASSERT_NE(gemm.find(".compact"), std::string::npos) << gemm;
    constexpr int kRuns = 12;
    std::vector<Routes> routes;
    std::vector<DeviceBuffer> logits, outs;
    for (int r = 0; r < kRuns; ++r) {
      routes.push_back(make_routes(hs.shape, hs.routing, parse_distribution("random"), seed + 100 + uint64_t(r)));
      logits.push_back(DeviceBuffer::from(routes.back().logits));
      outs.emplace_back(size_t(sm.tokens * 256) * 4);
      test::fill(outs.back().get(), 0xff, outs.back().bytes());
    }
    cudaStream_t stream;
    LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (int r = 0; r < kRuns; ++r) {
      Inputs in = hs.inputs();
      in.router_logits = logits[size_t(r)].as<float>();
      run(hs.plan, hs.device_weights(), in, outs[size_t(r)].get(), hs.ws.get(), stream);
    }
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
    LOOM_CUDA_CHECK(cudaStreamDestroy(stream));
    for (int r = 0; r < kRuns; ++r) {
      SCOPED_TRACE(testing::Message() << "run " << r);
      const std::vector<double> ref = layer_ref(hs.weights, hs.hidden.data(), routes[size_t(r)].topk).out;
      expect_close(outs[size_t(r)].to_host<float>(), ref, sm.tokens, 256);
    }
    std::vector<uint32_t> words(kEarlyIdWords);
    LOOM_CUDA_CHECK(cudaMemcpy(words.data(), static_cast<uint8_t*>(hs.ws.get()) + hs.plan.layout.early_ids,
                               words.size() * 4, cudaMemcpyDeviceToHost));
    const TopK& last = routes.back().topk;
    for (int64_t i = 0; i < sm.tokens * sm.topk; ++i)
      EXPECT_EQ(words[size_t(i)], kEarlyIdValid | uint32_t(last.ids[size_t(i)] + 1)) << "route " << i;
  }
}

TEST(PipelineGpu, PlanRejectsWhatTheGpuPathCannotRun) {
  LOOM_REQUIRE_GPU();
  auto message = [](const Shape& s) {
    try {
      plan(s, Routing{});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(message({8, 256, 128, 8, 2, Mode::ffn, DType::fp8}), "accepted");
  EXPECT_EQ(message({8, 256, 192, 8, 2, Mode::ffn, DType::fp8}), "accepted");
  EXPECT_NE(message({8, 256, 200, 8, 2, Mode::ffn, DType::fp8}).find("multiple of 16"), std::string::npos);
  EXPECT_NE(message({8, 256, 128, 8, 2, Mode::single, DType::bf16}).find("bf16"), std::string::npos);
  EXPECT_NE(message({8, 256, 128, 1024, 2, Mode::single, DType::fp8}).find("GPU limit 512"), std::string::npos);
  EXPECT_NE(message({8, 256, 128, 64, 17, Mode::single, DType::fp8}).find("GPU limit 16"), std::string::npos);
  EXPECT_NE(message({8, 200, 128, 64, 2, Mode::single, DType::fp8}).find("multiple of 16"), std::string::npos);
  EXPECT_EQ(message({8, 8192, 8192, 512, 16, Mode::single, DType::fp8}), "accepted");
}

}  // namespace
}  // namespace loom
