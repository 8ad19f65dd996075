// Expert parallelism on the GPU (issue 49), against the one-GPU layer:
//   - a communicator of one rank runs the whole path (its own segments in place, and through NCCL
//     as a send to itself) and equals the one-GPU layer bit for bit in BF16 (deterministic), from
//     logits and from ids, from a graph replay too; FP8 within the layer's tolerance (the local
//     plan's batch may choose other GEMM configs);
//   - in parts (the chunked overlap), eagerly and from a graph, and with no tokens, the same bits;
//   - not deterministic (the owners sum their routes), within tolerance of the one-GPU layer;
//   - the benchmark's stages, run in turn, give the run's output;
//   - caps below the tokens or the routes count the routes they could not send;
//   - with two GPUs or more, P ranks (a thread each) equal the one-GPU layer on all their tokens,
//     bit for bit, one rank with no tokens, balanced and skewed, unsplit and in parts.
// NCCL_NVLS_ENABLE=0 (NVLink multicast off) before any communicator.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench/device_buffer.hpp"
#include "common/bf16.hpp"
#include "dist/nccl/ep_stage.hpp"
#include "gpu_test.hpp"
#include "loom/dist.hpp"
#include "loom/loom.hpp"
#include "pipeline/layer_ref.hpp"
#include "test_seed.hpp"
#include "workload/workload.hpp"

namespace loom {
namespace {

using bench::DeviceBuffer;

void nccl_ok(ncclResult_t r) { ASSERT_EQ(r, ncclSuccess) << ncclGetErrorString(r); }

struct Layer {
  Shape shape;
  LayerWeights w;
  std::vector<bf16> hidden;
  Routes routes;
};

Layer make_layer(int64_t T, DType dtype, const char* dist, uint64_t seed) {
  Layer l;
  l.shape = Shape{T, 1024, 512, 16, 4, Mode::ffn, dtype};
  l.w = make_weights(l.shape, seed, WeightValues::normal);
  l.routes = make_routes(l.shape, Routing{}, parse_distribution(dist), seed + 1);
  l.hidden = make_hidden(l.shape, seed + 2);
  return l;
}

struct DeviceWeights {
  DeviceBuffer w1, s1, w2, s2;
  Weights view() const {
    Weights v;
    v.w1 = w1.get();
    v.w1_scales = s1.as<float>();
    v.w2 = w2.get();
    v.w2_scales = s2.as<float>();
    return v;
  }
};

DeviceWeights upload(const LayerWeights& w) {
  DeviceWeights d;
  if (w.shape.dtype == DType::fp8) {
    d.w1 = DeviceBuffer::from(w.w1_q);
    d.s1 = DeviceBuffer::from(w.w1_scales);
    d.w2 = DeviceBuffer::from(w.w2_q);
    d.s2 = DeviceBuffer::from(w.w2_scales);
  } else {
    d.w1 = DeviceBuffer::from(w.w1);
    d.w2 = DeviceBuffer::from(w.w2);
  }
  return d;
}

std::vector<uint16_t> to_bits(const DeviceBuffer& out, int64_t n) {
  std::vector<uint16_t> b = out.to_host<uint16_t>();
  b.resize(size_t(n));
  return b;
}

// A layer's tokens and routes on the device (logits, or ids with weights), and the Inputs over them.
struct DeviceInputs {
  DeviceBuffer hidden, logits, ids, weights;
  Inputs in;
};

DeviceInputs upload_inputs(const Layer& l, bool from_logits) {
  DeviceInputs d;
  d.hidden = DeviceBuffer::from(l.hidden);
  d.in.tokens = l.shape.tokens;
  d.in.hidden = d.hidden.get();
  if (from_logits) {
    d.logits = DeviceBuffer::from(l.routes.logits);
    d.in.router_logits = d.logits.as<float>();
  } else {
    d.ids = DeviceBuffer::from(l.routes.topk.ids);
    d.weights = DeviceBuffer::from(l.routes.topk.weights);
    d.in.topk_ids = d.ids.as<int32_t>();
    d.in.topk_weights = d.weights.as<float>();
  }
  return d;
}

// The one-GPU layer, deterministic unless said.
std::vector<uint16_t> one_gpu(const Layer& l, const DeviceWeights& dw, bool from_logits, bool deterministic = true) {
  Options o;
  o.deterministic = deterministic;
  const Plan p = plan(l.shape, Routing{}, o);
  DeviceBuffer ws(workspace_bytes(p)), out(size_t(l.shape.tokens * l.shape.hidden) * 2);
  const DeviceInputs d = upload_inputs(l, from_logits);
  test::Stream stream;
  run(p, dw.view(), d.in, out.get(), ws.get(), stream.get());
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  return to_bits(out, l.shape.tokens * l.shape.hidden);
}

// Captures one run_ep on `stream` into a graph, replays it `replays` times and waits.
void replay_captured(const EpPlan& p, const Weights& w, const Inputs& in, void* out, void* ws, ncclComm_t comm,
                     cudaStream_t stream, int replays) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  LOOM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  run_ep(p, w, in, out, ws, comm, stream);
  LOOM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  LOOM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < replays; ++i) LOOM_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
  LOOM_CUDA_CHECK(cudaGraphExecDestroy(exec));
  LOOM_CUDA_CHECK(cudaGraphDestroy(graph));
}

// bf16 outputs within the layer's tolerance of another's, overall and per token row.
void expect_close(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want, int64_t rows, int64_t cols) {
  ASSERT_EQ(got.size(), want.size());
  std::vector<float> g(got.size());
  std::vector<double> r(want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    g[i] = bf16_to_float(bf16{got[i]});
    r[i] = double(bf16_to_float(bf16{want[i]}));
  }
  const ErrorStats e = relative_error(g.data(), r.data(), rows, cols);
  EXPECT_LE(e.overall, 2e-3);
  EXPECT_LE(e.worst_row, 1e-2) << "worst token row " << e.worst_row_index;
}

Options deterministic() {
  Options o;
  o.deterministic = true;
  return o;
}

ncclComm_t one_rank_comm() {
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  ncclUniqueId id;
  ncclComm_t comm = nullptr;
  if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess) return nullptr;
  return comm;
}

TEST(EpLayerGpu, OneRankEqualsTheLayer) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  ncclComm_t comm = one_rank_comm();
  ASSERT_NE(comm, nullptr) << "a one-rank NCCL communicator";
  for (const DType dt : {DType::bf16, DType::fp8}) {
    for (const bool from_logits : {true, false}) {
      SCOPED_TRACE(std::string(to_string(dt)) + (from_logits ? " logits" : " ids"));
      Layer l = make_layer(40, dt, "random", seed);
      if (!from_logits) {  // two ids out of range: dropped alike, the slots -1 in the token rows
        l.routes.topk.ids[1] = int32_t(l.shape.experts);
        l.routes.topk.ids[6] = -1;
      }
      const DeviceWeights dw = upload(l.w);
      const std::vector<uint16_t> want = one_gpu(l, dw, from_logits);
      ExpertParallel ep;  // one rank: every expert local, the weights as they are
      EpPlan p = plan_ep(l.shape, Routing{}, deterministic(), ep);
      EXPECT_EQ(p.local_experts.size(), 16u);
      DeviceBuffer ws(workspace_bytes(p)), out(size_t(l.shape.tokens * l.shape.hidden) * 2);
      test::fill(ws.get(), 0xff, ws.bytes());  // a run depends on no workspace contents
      test::fill(out.get(), 0xff, out.bytes());
      const DeviceInputs d = upload_inputs(l, from_logits);
      const Inputs& in = d.in;
      test::Stream stream;
      run_ep(p, dw.view(), in, out.get(), ws.get(), comm, stream.get());
      LOOM_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
      const std::vector<uint16_t> got = to_bits(out, l.shape.tokens * l.shape.hidden);
      // The rank's own segments through NCCL (a send to itself) instead of in place: the same bits.
      p.self_through_nccl = true;
      test::fill(ws.get(), 0xff, ws.bytes());
      test::fill(out.get(), 0xff, out.bytes());
      run_ep(p, dw.view(), in, out.get(), ws.get(), comm, stream.get());
      LOOM_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
      EXPECT_TRUE(to_bits(out, l.shape.tokens * l.shape.hidden) == got) << "through NCCL differs";
      const EpStatus st = read_status(p, ws.get(), stream.get());
      EXPECT_EQ(st.overflow_routes, 0u);
      EXPECT_EQ(st.dropped_routes, from_logits ? 0u : 2u);
      if (dt == DType::bf16)
        EXPECT_TRUE(got == want) << "differs from the one-GPU layer";
      else
        expect_close(got, want, l.shape.tokens, l.shape.hidden);
      // A graph replay of the run gives the same bits, either way.
      for (const bool through_nccl : {true, false}) {
        p.self_through_nccl = through_nccl;
        test::fill(out.get(), 0xff, out.bytes());
        replay_captured(p, dw.view(), in, out.get(), ws.get(), comm, stream.get(), 1);
        EXPECT_TRUE(to_bits(out, l.shape.tokens * l.shape.hidden) == got) << "the graph replay differs";
      }
    }
  }
  ncclCommDestroy(comm);
}

// In parts (the exchange on the plan's second stream, the GEMMs on fewer SMs), eagerly and from a
// graph replay, T from the plan's most down to none: the same bits as the one-GPU layer.
TEST(EpLayerGpu, PartsEqualTheLayer) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  ncclComm_t comm = one_rank_comm();
  ASSERT_NE(comm, nullptr);
  const Layer l = make_layer(40, DType::bf16, "random", seed);
  const DeviceWeights dw = upload(l.w);
  const std::vector<uint16_t> want = one_gpu(l, dw, true);
  for (const auto& [chunks, through_nccl] : {std::pair{2, false}, std::pair{3, true}}) {
    SCOPED_TRACE("chunks " + std::to_string(chunks) + (through_nccl ? ", own segments through NCCL" : ""));
    ExpertParallel ep;
    ep.chunks = chunks;
    EpPlan p = plan_ep(l.shape, Routing{}, deterministic(), ep);
    p.self_through_nccl = through_nccl;
    ASSERT_EQ(p.rows_per_peer % chunks, 0);
    ASSERT_EQ(p.tokens_per_peer % chunks, 0);
    DeviceBuffer ws(workspace_bytes(p)), out(size_t(l.shape.tokens * l.shape.hidden) * 2);
    test::fill(ws.get(), 0xff, ws.bytes());
    test::fill(out.get(), 0xff, out.bytes());
    const DeviceInputs d = upload_inputs(l, true);
    test::Stream stream;
    run_ep(p, dw.view(), d.in, out.get(), ws.get(), comm, stream.get());
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
    EXPECT_TRUE(to_bits(out, l.shape.tokens * l.shape.hidden) == want) << "differs from the one-GPU layer";
    EXPECT_EQ(read_status(p, ws.get(), stream.get()).overflow_routes, 0u);
    test::fill(out.get(), 0xff, out.bytes());
    replay_captured(p, dw.view(), d.in, out.get(), ws.get(), comm, stream.get(), 3);
    EXPECT_TRUE(to_bits(out, l.shape.tokens * l.shape.hidden) == want) << "the graph replay differs";
    Inputs none = d.in;  // no tokens: the (empty) segments still travel, nothing is written
    none.tokens = 0;
    run_ep(p, dw.view(), none, out.get(), ws.get(), comm, stream.get());
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
    EXPECT_TRUE(to_bits(out, l.shape.tokens * l.shape.hidden) == want) << "a run of no tokens wrote the output";
  }
  ncclCommDestroy(comm);
}

// Not deterministic: the owner returns its layer's output per token row (its routes summed), the
// sender adds its owners' rows. One rank: within tolerance of the one-GPU layer in the same mode
// (the deterministic one rounds each route's row first: FP8 differs from it by ~3e-3), BF16 and
// FP8, in one part and in three, in place and through NCCL, eagerly and from a graph; at T k = 160
// routes (the one-launch send side) and 1200 (the three launches).
TEST(EpLayerGpu, OwnerSumsEqualTheLayerWithinTolerance) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  ncclComm_t comm = one_rank_comm();
  ASSERT_NE(comm, nullptr);
  for (const int64_t T : {40, 300})
    for (const DType dt : {DType::bf16, DType::fp8}) {
      const Layer l = make_layer(T, dt, "random", seed);
      const DeviceWeights dw = upload(l.w);
      const std::vector<uint16_t> want = one_gpu(l, dw, true, false);
      for (const auto& [chunks, through_nccl] : {std::pair{1, false}, std::pair{3, true}}) {
        SCOPED_TRACE("T " + std::to_string(T) + " " + to_string(dt) + " chunks " + std::to_string(chunks) +
                     (through_nccl ? ", own segments through NCCL" : ""));
        ExpertParallel ep;
        ep.chunks = chunks;
        EpPlan p = plan_ep(l.shape, Routing{}, Options{}, ep);
        EXPECT_FALSE(p.route_returns);
        EXPECT_EQ(p.rows_per_peer, p.tokens_per_peer);
        p.self_through_nccl = through_nccl;
        DeviceBuffer ws(workspace_bytes(p)), out(size_t(l.shape.tokens * l.shape.hidden) * 2);
        test::fill(ws.get(), 0xff, ws.bytes());
        test::fill(out.get(), 0xff, out.bytes());
        const DeviceInputs d = upload_inputs(l, true);
        test::Stream stream;
        run_ep(p, dw.view(), d.in, out.get(), ws.get(), comm, stream.get());
        LOOM_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
        expect_close(to_bits(out, l.shape.tokens * l.shape.hidden), want, l.shape.tokens, l.shape.hidden);
        EXPECT_EQ(read_status(p, ws.get(), stream.get()).overflow_routes, 0u);
        test::fill(out.get(), 0xff, out.bytes());
        replay_captured(p, dw.view(), d.in, out.get(), ws.get(), comm, stream.get(), 2);
        expect_close(to_bits(out, l.shape.tokens * l.shape.hidden), want, l.shape.tokens, l.shape.hidden);
      }
    }
  ncclCommDestroy(comm);
}

// The benchmark's stages (dist/nccl/ep_stage.hpp): dispatch, compute and combine run one after
// another give the run's bits, in both modes; a plan in parts refuses a stage alone.
TEST(EpLayerGpu, StagesInTurnEqualTheRun) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  ncclComm_t comm = one_rank_comm();
  ASSERT_NE(comm, nullptr);
  const Layer l = make_layer(40, DType::fp8, "random", seed);
  const DeviceWeights dw = upload(l.w);
  const DeviceInputs d = upload_inputs(l, true);
  test::Stream stream;
  for (const bool det : {true, false}) {
    SCOPED_TRACE(det ? "deterministic" : "owner sums");
    Options o;
    o.deterministic = det;
    const EpPlan p = plan_ep(l.shape, Routing{}, o, ExpertParallel{});
    DeviceBuffer ws(workspace_bytes(p)), out(size_t(l.shape.tokens * l.shape.hidden) * 2);
    run_ep(p, dw.view(), d.in, out.get(), ws.get(), comm, stream.get());
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
    const std::vector<uint16_t> want = to_bits(out, l.shape.tokens * l.shape.hidden);
    test::fill(ws.get(), 0xff, ws.bytes());
    test::fill(out.get(), 0xff, out.bytes());
    for (const EpStage st : {EpStage::dispatch, EpStage::compute, EpStage::combine})
      run_ep_stage(p, dw.view(), d.in, out.get(), ws.get(), comm, stream.get(), st);
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
    if (det) {
      EXPECT_TRUE(to_bits(out, l.shape.tokens * l.shape.hidden) == want) << "the stages in turn differ";
    } else {  // the owner's layer combines with float atomics: not bitwise run to run
      expect_close(to_bits(out, l.shape.tokens * l.shape.hidden), want, l.shape.tokens, l.shape.hidden);
    }
  }
  ExpertParallel parted;
  parted.chunks = 2;
  const EpPlan pp = plan_ep(l.shape, Routing{}, Options{}, parted);
  DeviceBuffer ws(workspace_bytes(pp)), out(size_t(l.shape.tokens * l.shape.hidden) * 2);
  EXPECT_THROW(run_ep_stage(pp, dw.view(), d.in, out.get(), ws.get(), comm, stream.get(), EpStage::dispatch), Error);
  ncclCommDestroy(comm);
}

TEST(EpLayerGpu, ACapBelowTheRoutesCountsWhatItCouldNotSend) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  ncclComm_t comm = one_rank_comm();
  ASSERT_NE(comm, nullptr);
  const Layer l = make_layer(40, DType::bf16, "random", seed);
  const DeviceWeights dw = upload(l.w);
  const DeviceInputs d = upload_inputs(l, true);
  const Inputs& in = d.in;
  test::Stream stream;
  ExpertParallel ep;
  ep.rows_per_peer = 64;  // of 160 routes
  {
    const EpPlan p = plan_ep(l.shape, Routing{}, deterministic(), ep);
    DeviceBuffer ws(workspace_bytes(p)), out(size_t(l.shape.tokens * l.shape.hidden) * 2);
    run_ep(p, dw.view(), in, out.get(), ws.get(), comm, stream.get());
    EXPECT_EQ(read_status(p, ws.get(), stream.get()).overflow_routes, 160u - 64u);
  }
  // A token cap, in both modes (with the owners sum the send side's own kernels count it): the
  // first 10 tokens as the layer computes them; the rest get nothing (zero), never garbage.
  for (const bool det : {true, false}) {
    SCOPED_TRACE(det ? "deterministic" : "owners sum");
    ExpertParallel few = ep;
    few.rows_per_peer = 0;
    few.tokens_per_peer = 10;  // of 40 tokens, each with its 4 routes to this rank
    const EpPlan p = plan_ep(l.shape, Routing{}, det ? deterministic() : Options{}, few);
    DeviceBuffer ws(workspace_bytes(p)), out(size_t(l.shape.tokens * l.shape.hidden) * 2);
    test::fill(out.get(), 0xff, out.bytes());
    run_ep(p, dw.view(), in, out.get(), ws.get(), comm, stream.get());
    EXPECT_EQ(read_status(p, ws.get(), stream.get()).overflow_routes, 160u - 40u);
    const std::vector<uint16_t> want = one_gpu(l, dw, true, det), got = to_bits(out, l.shape.tokens * l.shape.hidden);
    const size_t sent = size_t(10 * l.shape.hidden);
    if (det)
      EXPECT_TRUE(std::equal(got.begin(), got.begin() + sent, want.begin())) << "a sent token differs";
    else
      expect_close(std::vector<uint16_t>(got.begin(), got.begin() + sent),
                   std::vector<uint16_t>(want.begin(), want.begin() + sent), 10, l.shape.hidden);
    EXPECT_TRUE(std::all_of(got.begin() + sent, got.end(), [](uint16_t b) { return b == 0; }))
        << "a token past the cap is not zero";
  }
  DeviceBuffer ws(workspace_bytes(plan_ep(l.shape, Routing{}, deterministic(), ep))),
      out(size_t(l.shape.tokens * l.shape.hidden) * 2);
  Options checked = deterministic();
  checked.debug_checks = true;
  const EpPlan pc = plan_ep(l.shape, Routing{}, checked, ep);
  EXPECT_THROW(run_ep(pc, dw.view(), in, out.get(), ws.get(), comm, stream.get()), Error);
  ncclCommDestroy(comm);
}

TEST(EpLayerGpu, RejectsBadPlansAndCommunicators) {
  LOOM_REQUIRE_GPU();
  const Shape s{16, 1024, 512, 16, 4, Mode::ffn, DType::bf16};
  ExpertParallel ep;
  ep.size = 2;
  ep.rank = 2;
  EXPECT_THROW(plan_ep(s, Routing{}, Options{}, ep), Error);
  Shape single = s;
  single.mode = Mode::single;
  EXPECT_THROW(plan_ep(single, Routing{}, Options{}, ExpertParallel{}), Error);
  ep.rank = 1;
  const EpPlan p = plan_ep(s, Routing{}, Options{}, ep);  // rank 1 of 2 ...
  ncclComm_t comm = one_rank_comm();                       // ... against a communicator of one
  ASSERT_NE(comm, nullptr);
  DeviceBuffer ws(workspace_bytes(p));
  Inputs in;
  EXPECT_THROW(run_ep(p, Weights{}, in, nullptr, ws.get(), comm, nullptr), Error);
  ncclCommDestroy(comm);
}

// P ranks on P GPUs, a thread each; rank 1 has no tokens when P > 2; unsplit and in three parts;
// eagerly and from graph replays.
TEST(EpLayerGpu, RanksEqualTheLayerOnAllTheirTokens) {
  LOOM_REQUIRE_GPU();
  int gpus = 0;
  LOOM_CUDA_CHECK(cudaGetDeviceCount(&gpus));
  if (gpus < 2) GTEST_SKIP() << "needs two GPUs or more (this machine has " << gpus << ")";
  LOOM_FRESH_SEED();
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  const int P = std::min(gpus, 8);
  struct Case {
    const char* dist;
    int chunks;
    bool deterministic;  // else the owners sum their routes: within tolerance of the one-GPU layer
  };
  for (const auto& [dist, chunks, det] : {Case{"random", 1, true}, Case{"hot:1", 1, true}, Case{"random", 3, true},
                                          Case{"random", 1, false}, Case{"hot:1", 3, false}}) {
    SCOPED_TRACE(std::string("P=") + std::to_string(P) + " " + dist + " parts " + std::to_string(chunks) +
                 (det ? " deterministic" : " owner sums"));
    const Options opts = det ? deterministic() : Options{};
    std::vector<int64_t> tokens(static_cast<size_t>(P));
    for (int r = 0; r < P; ++r) tokens[size_t(r)] = r == 1 && P > 2 ? 0 : 24 + 8 * r;
    std::vector<Layer> layers;
    Layer all = make_layer(1, DType::bf16, dist, seed);  // the weights; its tokens replaced below
    all.hidden.clear();
    all.routes.topk = TopK{};
    all.routes.topk.topk = all.shape.topk;
    for (int r = 0; r < P; ++r) {
      Layer l = make_layer(std::max<int64_t>(tokens[size_t(r)], 1), DType::bf16, dist, seed + 100 * uint64_t(r + 1));
      l.shape.tokens = tokens[size_t(r)];
      l.hidden.resize(size_t(l.shape.tokens * l.shape.hidden));
      l.routes.topk.tokens = l.shape.tokens;
      l.routes.topk.ids.resize(size_t(l.shape.tokens * l.shape.topk));
      l.routes.topk.weights.resize(l.routes.topk.ids.size());
      all.hidden.insert(all.hidden.end(), l.hidden.begin(), l.hidden.end());
      all.routes.topk.ids.insert(all.routes.topk.ids.end(), l.routes.topk.ids.begin(), l.routes.topk.ids.end());
      all.routes.topk.weights.insert(all.routes.topk.weights.end(), l.routes.topk.weights.begin(),
                                     l.routes.topk.weights.end());
      all.routes.topk.tokens += l.shape.tokens;
      layers.push_back(std::move(l));
    }
    all.shape.tokens = all.routes.topk.tokens;
    LOOM_CUDA_CHECK(cudaSetDevice(0));
    const std::vector<uint16_t> want = one_gpu(all, upload(all.w), false);

    ncclUniqueId id;
    nccl_ok(ncclGetUniqueId(&id));
    std::vector<std::vector<uint16_t>> got(static_cast<size_t>(P));
    std::vector<std::string> errors(static_cast<size_t>(P));
    std::vector<std::thread> threads;
    for (int r = 0; r < P; ++r)
      threads.emplace_back([&, r] {
        try {
          LOOM_CUDA_CHECK(cudaSetDevice(r));
          ncclComm_t comm = nullptr;
          if (ncclCommInitRank(&comm, P, id, r) != ncclSuccess) throw Error("ncclCommInitRank");
          ExpertParallel ep;
          ep.size = P;
          ep.rank = r;
          ep.chunks = chunks;
          Shape s = all.shape;
          s.tokens = 128;  // at least the most any rank carries (24 + 8 r tokens)
          ep.rows_per_peer = s.tokens * s.topk;  // skewed: every route may go to one rank
          const EpPlan p = plan_ep(s, Routing{}, opts, ep);
          // This rank's experts' weights, in local order.
          const int64_t per1 = int64_t(all.w.w1.size()) / all.w.shape.experts,
                        per2 = int64_t(all.w.w2.size()) / all.w.shape.experts;
          std::vector<bf16> w1, w2;
          for (const int32_t e : p.local_experts) {
            w1.insert(w1.end(), all.w.w1.begin() + e * per1, all.w.w1.begin() + (e + 1) * per1);
            w2.insert(w2.end(), all.w.w2.begin() + e * per2, all.w.w2.begin() + (e + 1) * per2);
          }
          DeviceBuffer dw1 = DeviceBuffer::from(w1), dw2 = DeviceBuffer::from(w2);
          Weights wv;
          wv.w1 = dw1.get();
          wv.w2 = dw2.get();
          const Layer& l = layers[size_t(r)];
          DeviceBuffer ws(workspace_bytes(p)), out(size_t(std::max<int64_t>(1, l.shape.tokens * l.shape.hidden)) * 2);
          DeviceBuffer dh = DeviceBuffer::from(l.hidden), di = DeviceBuffer::from(l.routes.topk.ids),
                       dwt = DeviceBuffer::from(l.routes.topk.weights);
          Inputs in;
          in.tokens = l.shape.tokens;
          in.hidden = dh.get();
          in.topk_ids = di.as<int32_t>();
          in.topk_weights = dwt.as<float>();
          cudaStream_t stream = nullptr;
          LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
          run_ep(p, wv, in, out.get(), ws.get(), comm, stream);
          LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
          const EpStatus st = read_status(p, ws.get(), stream);
          if (st.overflow_routes) throw Error("overflow " + std::to_string(st.overflow_routes));
          got[size_t(r)] = to_bits(out, l.shape.tokens * l.shape.hidden);
          // Every rank captures its run and replays it twice (the ranks' NCCL calls pair up).
          LOOM_CUDA_CHECK(cudaMemsetAsync(out.get(), 0xff, out.bytes(), stream));
          replay_captured(p, wv, in, out.get(), ws.get(), comm, stream, 2);
          if (to_bits(out, l.shape.tokens * l.shape.hidden) != got[size_t(r)]) throw Error("the graph replay differs");
          LOOM_CUDA_CHECK(cudaStreamDestroy(stream));
          ncclCommDestroy(comm);
        } catch (const std::exception& e) {
          errors[size_t(r)] = e.what();
        }
      });
    for (auto& t : threads) t.join();
    LOOM_CUDA_CHECK(cudaSetDevice(0));
    int64_t row0 = 0;
    for (int r = 0; r < P; ++r) {
      ASSERT_TRUE(errors[size_t(r)].empty()) << "rank " << r << ": " << errors[size_t(r)];
      const int64_t n = tokens[size_t(r)] * all.shape.hidden;
      const std::vector<uint16_t> slice(want.begin() + row0, want.begin() + row0 + n);
      if (det)
        EXPECT_TRUE(got[size_t(r)] == slice) << "rank " << r << " differs from the one-GPU layer";
      else if (n > 0)
        expect_close(got[size_t(r)], slice, tokens[size_t(r)], all.shape.hidden);
      row0 += n;
    }
  }
}

}  // namespace
}  // namespace loom
