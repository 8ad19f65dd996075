// The ffn layer (w13 -> SiLU(gate)*up, requantised -> w2 -> weighted combine -> bf16) through
// plan()/run() against the CPU reference (layer_ref), the output poisoned first: decode to prefill
// batches (every GEMM-1 family the chooser picks), skew, empty experts, routes from logits and
// from ids, both combines; deterministic runs bitwise stable and equal to a graph replay.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "bench/device_buffer.hpp"
#include "common/bf16.hpp"
#include "gpu_test.hpp"
#include "loom/loom.hpp"
#include "pipeline/gpu_reference.cuh"
#include "pipeline/layer_ref.hpp"
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
};

struct FfnRun {
  Shape shape;
  LayerWeights weights;
  Routes routes;
  std::vector<bf16> hidden;
  DeviceBuffer w1, w1s, w2, w2s, h, logits, ids, wts, out, ws;
  Plan plan;

  FfnRun(const FfnCase& c, uint64_t seed) {
    shape = Shape{c.tokens, c.hidden, c.inter, c.experts, c.topk, Mode::ffn, DType::fp8};
    weights = make_weights(shape, seed);
    routes = make_routes(shape, Routing{}, parse_distribution(c.dist), seed + 1);
    hidden = make_hidden(shape, seed + 2);
    w1 = DeviceBuffer::from(weights.w1_q);
    w1s = DeviceBuffer::from(weights.w1_scales);
    w2 = DeviceBuffer::from(weights.w2_q);
    w2s = DeviceBuffer::from(weights.w2_scales);
    h = DeviceBuffer::from(hidden);
    if (c.from_logits && !routes.logits.empty()) {
      logits = DeviceBuffer::from(routes.logits);
    } else {
      ids = DeviceBuffer::from(routes.topk.ids);
      wts = DeviceBuffer::from(routes.topk.weights);
    }
    out = DeviceBuffer(size_t(std::max<int64_t>(1, shape.tokens * shape.hidden)) * 2);
    Options o;
    o.deterministic = c.deterministic;
    plan = loom::plan(shape, Routing{}, o);
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
};

void check_case(const FfnCase& c, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "T=" << c.tokens << " H=" << c.hidden << " I=" << c.inter << " E=" << c.experts
                                  << " k=" << c.topk << " " << c.dist
                                  << (c.deterministic ? " deterministic" : " fast") << (c.from_logits ? " logits" : " ids"));
  FfnRun r(c, seed);
  const std::vector<uint16_t> bits = r.run_once();
  std::vector<float> got(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) got[i] = bf16_to_float(bf16{bits[i]});
  const std::vector<double> ref = c.gpu_reference ? test::reference_ffn_fp8_gpu(r.weights, r.hidden, r.routes.topk)
                                                  : layer_ref(r.weights, r.hidden.data(), r.routes.topk).out;
  const ErrorStats e = relative_error(got.data(), ref.data(), c.tokens, c.hidden);
  EXPECT_LE(e.overall, 2e-3) << "relative Frobenius error";
  EXPECT_LE(e.worst_row, 1e-2) << "worst token row " << e.worst_row_index;
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
                             {300, 1024, 256, 8, 2, "concentrated", false, false},  // empty experts
                             {1000, 2048, 512, 64, 8, "random"},
                             {2048, 2048, 512, 256, 8, "random", true},
                             {2048, 1024, 384, 16, 4, "random", false, false}};
  if (!test::sanitizer().empty())  // instrumented: the same paths on narrower layers
    cases = {{1, 512, 256, 16, 2, "random"},
             {17, 512, 256, 16, 2, "random"},
             {128, 512, 256, 64, 8, "random", true},
             {300, 512, 256, 8, 2, "concentrated", false, false},
             {1200, 512, 256, 16, 4, "random"}};
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

// Deterministic combine: 5 runs bitwise equal, and equal to a graph replay on a non-blocking stream.
TEST(FfnGpu, DeterministicIsBitwiseStableAndMatchesGraphReplay) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  FfnRun r({256, 2048, 512, 64, 8, "random", true}, seed);
  const std::vector<uint16_t> first = r.run_once();
  for (int i = 0; i < 4; ++i) ASSERT_EQ(r.run_once(), first) << "run " << i + 2;
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
  replay.resize(first.size());
  EXPECT_EQ(replay, first);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
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
  std::vector<float> got;
  for (uint16_t b : r.run_once()) got.push_back(bf16_to_float(bf16{b}));
  EXPECT_EQ(read_status(r.plan, r.ws.get(), nullptr).dropped_routes, 3u);
  const std::vector<double> ref = layer_ref(r.weights, r.hidden.data(), bad).out;
  ErrorStats e = relative_error(got.data(), ref.data(), 16, 256);
  EXPECT_LE(e.overall, 2e-3);
  EXPECT_LE(e.worst_row, 1e-2) << "worst token row " << e.worst_row_index;

  FfnRun n({16, 256, 128, 8, 2, "random"}, seed + 7);
  std::vector<float> logits = n.routes.logits;
  for (int x = 0; x < 8; ++x) logits[size_t(5 * 8 + x)] = NAN;  // token 5: all NaN
  logits[size_t(9 * 8 + 2)] = NAN;                              // token 9: one NaN
  n.logits = DeviceBuffer::from(logits);
  got.clear();
  for (uint16_t b : n.run_once()) got.push_back(bf16_to_float(bf16{b}));
  EXPECT_EQ(read_status(n.plan, n.ws.get(), nullptr).nan_tokens, 2u);
  for (float v : got) ASSERT_TRUE(std::isfinite(v));
  const std::vector<double> ref2 = layer_ref(n.weights, n.hidden.data(), route_ref(logits.data(), 16, 8, 2, Routing{})).out;
  e = relative_error(got.data(), ref2.data(), 16, 256);
  EXPECT_LE(e.overall, 2e-3);
  EXPECT_LE(e.worst_row, 1e-2) << "worst token row " << e.worst_row_index;
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
