// The BF16 ffn layer (issue 47: route -> dispatch -> gather -> GEMM 1 with SiLU*up -> GEMM 2 ->
// combine -> bf16) through plan()/run() against the CPU reference (layer_ref with bf16 route rows,
// as GEMM 2 stores them), the output poisoned first: decode to prefill batches, skew, empty
// experts, routes from logits and from ids, a plan for more tokens than the run; runs bitwise
// stable and equal to a graph replay; T = 0 launches nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bench/device_buffer.hpp"
#include "common/bf16.hpp"
#include "gpu_test.hpp"
#include "loom/loom.hpp"
#include "pipeline/gpu_reference.cuh"
#include "pipeline/layer_ref.hpp"
#include "test_seed.hpp"
#include "workload/workload.hpp"

namespace loom {
namespace {

using bench::DeviceBuffer;

struct Bf16LayerCase {
  int64_t tokens, hidden, inter, experts, topk;
  const char* dist;
  bool from_logits = true;  // random distribution only
  int64_t plan_tokens = 0;  // > tokens: a plan for more tokens than the run carries
  bool gpu_reference = false;  // large shapes: the independent GPU reference instead of layer_ref
};

// Both combine options (the same kernels for bf16 today) against one reference.
void run_case(const Bf16LayerCase& c, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "T=" << c.tokens << " H=" << c.hidden << " I=" << c.inter << " E=" << c.experts
                                  << " k=" << c.topk << " " << c.dist << (c.from_logits ? " logits" : " ids")
                                  << " plan T=" << std::max(c.tokens, c.plan_tokens));
  const Shape s{c.tokens, c.hidden, c.inter, c.experts, c.topk, Mode::ffn, DType::bf16};
  const LayerWeights w = make_weights(s, seed, WeightValues::normal);
  const Routes routes = make_routes(s, Routing{}, parse_distribution(c.dist), seed + 1);
  const std::vector<bf16> hidden = make_hidden(s, seed + 2);
  const bool from_logits = c.from_logits && !routes.logits.empty();
  DeviceBuffer dw1 = DeviceBuffer::from(w.w1), dw2 = DeviceBuffer::from(w.w2), dh = DeviceBuffer::from(hidden);
  DeviceBuffer dlogits, dids, dwts;
  if (from_logits) {
    dlogits = DeviceBuffer::from(routes.logits);
  } else {
    dids = DeviceBuffer::from(routes.topk.ids);
    dwts = DeviceBuffer::from(routes.topk.weights);
  }
  const std::vector<double> ref = c.gpu_reference
                                      ? test::reference_ffn_bf16_gpu(w, hidden, routes.topk)
                                      : layer_ref(w, hidden.data(), routes.topk, nullptr, /*bf16_route_rows=*/true).out;
  std::vector<uint16_t> first, first_wm;  // each kernel's outputs: the same bits (no atomics, one order)
  for (const auto& [deterministic, config] :
       {std::pair{false, ""}, std::pair{true, ""}, std::pair{false, "bf16.tM.128x256"},
        std::pair{false, "bf16.wM.64x64"}, std::pair{true, "bf16.wM.64x64"}}) {
    SCOPED_TRACE(testing::Message() << (deterministic ? "deterministic " : "fast ") << config);
    Options o;
    o.deterministic = deterministic;
    o.gemm_config = config;
    Shape planned = s;
    planned.tokens = std::max(c.tokens, c.plan_tokens);
    const Plan p = plan(planned, Routing{}, o);
    DeviceBuffer ws(workspace_bytes(p)), out(size_t(std::max<int64_t>(1, s.tokens * s.hidden)) * 2);
    test::fill(ws.get(), 0xff, ws.bytes());  // a run depends on no workspace contents
    Weights dev_w;
    dev_w.w1 = dw1.get();
    dev_w.w2 = dw2.get();
    Inputs in;
    in.tokens = s.tokens;
    in.hidden = dh.get();
    in.router_logits = dlogits.as<float>();
    in.topk_ids = dids.as<int32_t>();
    in.topk_weights = dwts.as<float>();
    auto run_once = [&](cudaStream_t stream) {
      test::fill(out.get(), 0xff, out.bytes());
      run(p, dev_w, in, out.get(), ws.get(), stream);
      LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
      std::vector<uint16_t> b = out.to_host<uint16_t>();
      b.resize(size_t(s.tokens * s.hidden));
      return b;
    };
    test::Stream stream;
    const std::vector<uint16_t> got = run_once(stream.get());
    const LayerStatus st = read_status(p, ws.get(), stream.get());
    EXPECT_EQ(st.dropped_routes, 0);
    EXPECT_EQ(st.nan_tokens, 0);

    std::vector<float> g(got.size());
    for (size_t i = 0; i < got.size(); ++i) g[i] = bf16_to_float(bf16{got[i]});
    const ErrorStats e = relative_error(g.data(), ref.data(), s.tokens, s.hidden);
    EXPECT_LE(e.overall, 2e-3);
    EXPECT_LE(e.worst_row, 1e-2) << "worst token row " << e.worst_row_index;

    // No float atomics anywhere: the same bits again, and from a graph replay.
    EXPECT_EQ(run_once(stream.get()), got);
    // The tokens-on-M keys sum each output in one order; weights on M (its own MMA shape) is held
    // to the reference above and to its own runs.
    const bool weights_on_m = std::string(config) == "bf16.wM.64x64";
    if (weights_on_m) {
      if (first_wm.empty()) first_wm = got;
      EXPECT_TRUE(got == first_wm) << "differs from the other weights-on-M run";
    } else if (first.empty()) {
      first = got;
    } else {
      EXPECT_TRUE(got == first) << "differs from the first variant's output";
    }
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    test::fill(out.get(), 0xff, out.bytes());
    LOOM_CUDA_CHECK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
    run(p, dev_w, in, out.get(), ws.get(), stream.get());
    LOOM_CUDA_CHECK(cudaStreamEndCapture(stream.get(), &graph));
    LOOM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    LOOM_CUDA_CHECK(cudaGraphLaunch(exec, stream.get()));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
    std::vector<uint16_t> replay = out.to_host<uint16_t>();
    replay.resize(got.size());
    EXPECT_EQ(replay, got);
    LOOM_CUDA_CHECK(cudaGraphExecDestroy(exec));
    LOOM_CUDA_CHECK(cudaGraphDestroy(graph));
  }
}

const Bf16LayerCase kCases[] = {
    {1, 1024, 1536, 8, 1, "random"},
    {5, 3072, 1536, 16, 8, "random"},
    {17, 1536, 1024, 64, 2, "random", false},
    {32, 2880, 2880, 16, 8, "zipf:1.2", false},         // 2880: neither 128 nor 256 divides it
    {150, 1024, 1024, 128, 8, "concentrated", false},  // most experts without rows
    {200, 4096, 1024, 16, 2, "hot:0.9", false},
    {100, 1024, 1536, 16, 8, "random", true, 2048},  // the plan's buckets for more tokens
};

std::vector<Bf16LayerCase> cases() {
  if (test::sanitizer().empty()) return {std::begin(kCases), std::end(kCases)};
  return {kCases[0], kCases[2], kCases[6]};
}

TEST(Bf16LayerGpu, MatchesTheReferenceStableAndAsAGraph) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  for (const Bf16LayerCase& c : cases()) run_case(c, seed);
}

// Prefill shapes (the preset's, and one with widths no tile divides) against the independent GPU
// reference, which itself agrees with layer_ref on small shapes.
TEST(Bf16LayerGpu, PrefillAgainstTheGpuReference) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  for (const auto& [T, H, I, E, k, dist] :
       {std::tuple{64, 1024, 1536, 16, 8, "random"}, std::tuple{40, 2880, 1024, 64, 2, "zipf:1.2"}}) {
    SCOPED_TRACE(testing::Message() << "reference agreement T=" << T << " H=" << H << " I=" << I);
    const Shape s{T, H, I, E, k, Mode::ffn, DType::bf16};
    const LayerWeights w = make_weights(s, seed, WeightValues::normal);
    const Routes routes = make_routes(s, Routing{}, parse_distribution(dist), seed + 1);
    const std::vector<bf16> hidden = make_hidden(s, seed + 2);
    const std::vector<double> gpu = test::reference_ffn_bf16_gpu(w, hidden, routes.topk);
    const LayerResult cpu = layer_ref(w, hidden.data(), routes.topk, nullptr, true);
    std::vector<float> g(gpu.begin(), gpu.end());
    const ErrorStats e = relative_error(g.data(), cpu.out.data(), T, H);
    EXPECT_LE(e.overall, 1e-6);  // the same rounding points; only the double sums' order differs
  }
  if (!test::sanitizer().empty()) return;  // the large shapes: plain runs only
  for (const Bf16LayerCase& c : {Bf16LayerCase{2048, 3072, 1536, 16, 8, "random", true, 0, true},
                                 Bf16LayerCase{8192, 3072, 1536, 16, 8, "random", true, 0, true},
                                 Bf16LayerCase{2048, 2880, 2880, 64, 8, "zipf:1.2", false, 0, true}})
    run_case(c, seed);
}

TEST(Bf16LayerGpu, ZeroTokensLaunchNothing) {
  LOOM_REQUIRE_GPU();
  const Shape s{64, 1024, 1024, 16, 2, Mode::ffn, DType::bf16};
  const Plan p = plan(s, Routing{});
  DeviceBuffer ws(workspace_bytes(p)), out(16), h(16);
  Weights w;
  w.w1 = h.get();
  w.w2 = h.get();
  Inputs in;
  in.tokens = 0;
  in.hidden = h.get();
  in.router_logits = reinterpret_cast<const float*>(h.get());
  run(p, w, in, out.get(), ws.get(), nullptr);
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace loom
