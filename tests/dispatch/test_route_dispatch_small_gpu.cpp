// The fused small-batch route+dispatch kernel writes exactly what the routing kernel followed by
// the dispatch kernel write (and so what route_ref + dispatch_ref compute).
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <tuple>

#include "bench/device_buffer.hpp"
#include "common/rng.hpp"
#include "dispatch/dispatch_ref.hpp"
#include "dispatch/route_dispatch_small_sm90.cuh"
#include "gpu_test.hpp"
#include "route/route_ref.hpp"
#include "stage_buffers.hpp"
#include "test_seed.hpp"

namespace loom {
namespace {

using bench::DeviceBuffer;

struct Outputs {
  std::vector<int32_t> ids, offsets, route_row, row_token;
  std::vector<int32_t> hit_list;  // fused path: [1 + E][4]
  std::vector<float> weights, row_weight;
  std::vector<uint8_t> flags;
  LayerStatus status;
};

enum class Path { fused, route_then_small_dispatch, route_then_dispatch };

// The routing and dispatch outputs of one batch, poisoned, and the parameters that point at them.
struct Buffers {
  test::RouteOutputs routed;
  test::DispatchOutputs out;
  RouteTopkParams rp;
  DispatchParams dp;
  Buffers(const float* logits, int T, int E, int k, const Routing& routing)
      : routed(T, k, 0xab), out(T, k, E, 0xab) {
    rp = routed.params(logits, T, E, k, routing);
    dp = out.params(rp.topk_ids, rp.topk_weights, rp.nan_flags);
  }
};

Outputs run(Path path, const std::vector<float>& logits, int T, int E, int k, const Routing& routing) {
  DeviceBuffer dl = DeviceBuffer::from(logits);
  Buffers b(dl.as<float>(), T, E, k, routing);
  const RouteTopkParams& rp = b.rp;
  const DispatchParams& dp = b.dp;
  DeviceBuffer hits(size_t(E + 1) * 16);
  test::fill(hits.get(), 0xab, hits.bytes());
  if (path == Path::fused) {
    DispatchParams with_hits = dp;
    with_hits.hit_list = hits.as<int4>();
    launch_route_dispatch_small(rp, with_hits, nullptr, nullptr, true);
  } else {
    launch_route_topk(rp, nullptr, true);
    if (path == Path::route_then_small_dispatch)
      launch_dispatch_small(dp, nullptr, true);
    else
      launch_dispatch(dp, nullptr, true);
  }
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  Outputs o;
  o.ids = b.routed.ids.to_host<int32_t>();
  o.weights = b.routed.weights.to_host<float>();
  o.flags = b.routed.flags.to_host<uint8_t>();
  o.offsets = b.out.offsets.to_host<int32_t>();
  if (path == Path::fused) o.hit_list = hits.to_host<int32_t>();
  o.route_row = b.out.route_row.to_host<int32_t>();
  o.row_token = b.out.row_token.to_host<int32_t>();
  o.row_weight = b.out.row_weight.to_host<float>();
  LOOM_CUDA_CHECK(cudaMemcpy(&o.status, b.out.status.get(), sizeof o.status, cudaMemcpyDeviceToHost));
  return o;
}

TEST(RouteDispatchSmallGpu, MatchesRouteThenDispatchBitForBit) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  Rng rng(seed);
  struct Shape3 {
    int T, E, k;
  };
  for (const Shape3 c : {Shape3{1, 8, 1}, Shape3{3, 64, 2}, Shape3{17, 512, 16}, Shape3{32, 256, 8},
                         Shape3{128, 256, 8}, Shape3{128, 64, 16}, Shape3{1000, 8, 2}, Shape3{2048, 16, 1},
                         Shape3{33, 500, 7}, Shape3{5, 128, 8}, Shape3{8, 32, 8}, Shape3{2, 256, 16}}) {
    for (int variant = 0; variant < 3; ++variant) {
      SCOPED_TRACE(testing::Message() << "T=" << c.T << " E=" << c.E << " k=" << c.k << " variant " << variant);
      Routing routing;
      routing.softcap = variant == 1 ? 30.0f : 0.0f;
      routing.renormalize = variant != 2;
      routing.scale = variant == 2 ? 2.5f : 1.0f;
      std::vector<float> logits(size_t(c.T) * c.E);
      for (auto& x : logits) x = float(rng.normal());
      // Some NaN logits, a token of all NaN, exact ties.
      if (c.T > 2) {
        logits[size_t(c.E + 1)] = NAN;
        for (int e = 0; e < c.E; ++e) logits[size_t(2 * c.E + e)] = NAN;
      }
      if (c.E > 4) logits[3] = logits[4];
      // A token of three values only: the top k are mostly decided by the tie rule (lower id first).
      if (c.T > 3)
        for (int e = 0; e < c.E; ++e) logits[size_t(3 * c.E + e)] = float(e % 3 == 1) - float(e % 7 == 0);
      ASSERT_TRUE(dispatch_small_fits(c.T, c.k, c.E));
      // The fused kernel where it applies, else the single-CTA dispatch after the routing kernel.
      const bool can_fuse = route_dispatch_small_fits(c.T, c.k, c.E, routing);
      const Outputs fused = run(can_fuse ? Path::fused : Path::route_then_small_dispatch, logits, c.T, c.E, c.k, routing);
      const Outputs split = run(Path::route_then_dispatch, logits, c.T, c.E, c.k, routing);
      EXPECT_EQ(fused.ids, split.ids);
      EXPECT_EQ(std::memcmp(fused.weights.data(), split.weights.data(), fused.weights.size() * 4), 0);
      EXPECT_EQ(fused.flags, split.flags);
      EXPECT_EQ(fused.offsets, split.offsets);
      EXPECT_EQ(fused.route_row, split.route_row);
      const int rows = split.offsets.back();
      EXPECT_TRUE(std::equal(fused.row_token.begin(), fused.row_token.begin() + rows, split.row_token.begin()));
      EXPECT_EQ(std::memcmp(fused.row_weight.data(), split.row_weight.data(), size_t(rows) * 4), 0);
      EXPECT_EQ(fused.status.nan_tokens, split.status.nan_tokens);
      EXPECT_EQ(fused.status.dropped_routes, split.status.dropped_routes);
      // And both equal the references.
      const TopK ref = route_ref(logits.data(), c.T, c.E, c.k, routing);
      EXPECT_EQ(fused.ids, ref.ids);
      const Dispatch d = dispatch_ref(ref.ids.data(), c.T, c.k, c.E);
      EXPECT_EQ(fused.offsets, d.offsets);
      EXPECT_EQ(fused.route_row, d.route_row);
      if (can_fuse) {
        // The hit list: the experts with rows, ascending, with their first row and row count.
        const std::vector<int32_t> want = hit_list_ref(d.offsets);
        ASSERT_GE(fused.hit_list.size(), want.size());
        EXPECT_TRUE(std::equal(want.begin(), want.end(), fused.hit_list.begin()));
      }
      EXPECT_EQ(fused.status.nan_tokens, uint32_t(count_nan_tokens(logits.data(), c.T, c.E)));
    }
  }
}

// The quantising CTAs of the fused launch write what the token-order quantise kernel writes, and
// clear the output, while CTA 0 routes and dispatches.
TEST(RouteDispatchSmallGpu, FusedQuantiseMatchesTheQuantiseKernelBitForBit) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  Rng rng(seed);
  for (const auto& [T, E, k, H] :
       {std::tuple{1, 256, 8, 2048}, std::tuple{32, 64, 16, 7168}, std::tuple{17, 8, 2, 192}, std::tuple{8, 256, 8, 8192}}) {
    SCOPED_TRACE(testing::Message() << "T=" << T << " E=" << E << " k=" << k << " H=" << H);
    const int64_t Tp = (T + 3) / 4 * 4;
    std::vector<float> logits(static_cast<size_t>(T) * E);
    for (auto& x : logits) x = float(rng.normal());
    std::vector<uint16_t> hidden(static_cast<size_t>(T) * H);
    for (auto& h : hidden) h = uint16_t(0x3c00 + rng.below(0x0800)) ^ uint16_t(rng.below(2) << 15);  // varied bf16
    DeviceBuffer dl = DeviceBuffer::from(logits), dh = DeviceBuffer::from(hidden);
    std::vector<std::vector<uint8_t>> codes;
    std::vector<std::vector<float>> scales;
    std::vector<std::vector<float>> zeroed;
    std::vector<std::vector<int32_t>> rows;
    for (int fused = 0; fused < 2; ++fused) {
      Buffers buf(dl.as<float>(), T, E, k, Routing{});
      RouteTopkParams& rp = buf.rp;
      DispatchParams& dp = buf.dp;
      test::QuantOutputs q(Tp, H, T, 64, 0x7f);
      const QuantGatherParams qp = q.params(dh.as<uint16_t>(), nullptr, T, H, k);
      if (fused) {
        launch_route_dispatch_small(rp, dp, &qp, nullptr, true);
      } else {
        launch_route_topk(rp, nullptr, true);
        launch_dispatch(dp, nullptr, true);
        launch_quant_gather(qp, nullptr, true);
      }
      LOOM_CUDA_CHECK(cudaDeviceSynchronize());
      codes.push_back(q.codes.to_host<uint8_t>());
      scales.push_back(q.scales.to_host<float>());
      zeroed.push_back(q.zero.to_host<float>());
      rows.push_back(buf.out.route_row.to_host<int32_t>());
    }
    EXPECT_EQ(rows[0], rows[1]);
    EXPECT_EQ(codes[0], codes[1]);
    EXPECT_EQ(std::memcmp(scales[0].data(), scales[1].data(), scales[0].size() * 4), 0);
    for (float v : zeroed[1]) ASSERT_EQ(v, 0.0f);
  }
}

TEST(RouteDispatchSmall, TakesOnlySmallBatches) {
  Routing softmax, sigmoid;
  sigmoid.scoring = Scoring::sigmoid;
  EXPECT_TRUE(route_dispatch_small_fits(32, 8, 256, softmax));
  EXPECT_FALSE(route_dispatch_small_fits(33, 8, 256, softmax));
  EXPECT_FALSE(route_dispatch_small_fits(16, 8, 256, sigmoid));
  EXPECT_FALSE(route_dispatch_small_fits(16, 8, 1024, softmax));
  EXPECT_TRUE(route_dispatch_small_fits(32, 16, 512, softmax));
  EXPECT_FALSE(route_dispatch_small_fits(32, 17, 256, softmax));  // CTA 0 gathers at most 32 x 16 routes
  // One routing CTA up to 8 tokens, a cluster of 4 beyond (each routes at most 8).
  EXPECT_EQ(route_dispatch_small_ctas(1), 1);
  EXPECT_EQ(route_dispatch_small_ctas(8), 1);
  EXPECT_EQ(route_dispatch_small_ctas(9), 4);
  EXPECT_EQ(route_dispatch_small_ctas(32), 4);
  EXPECT_TRUE(dispatch_small_fits(256, 8, 512));
  EXPECT_FALSE(dispatch_small_fits(257, 8, 512));
  EXPECT_FALSE(dispatch_small_fits(16, 8, 1024));
}

TEST(RouteDispatchSmallGpu, DispatchAloneMatchesReferenceWithBadIdsAndFlags) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  Rng rng(seed);
  for (const auto& [T, E, k] : {std::tuple{1, 8, 1}, std::tuple{128, 256, 8}, std::tuple{256, 512, 8}, std::tuple{128, 64, 16}}) {
    const int R = T * k;
    std::vector<int32_t> ids(static_cast<size_t>(R));
    std::vector<float> w(static_cast<size_t>(R));
    std::vector<uint8_t> flags(static_cast<size_t>(T));
    for (int i = 0; i < R; ++i) {
      ids[size_t(i)] = int32_t(rng.below(uint64_t(E)));
      w[size_t(i)] = float(rng.uniform());
    }
    ids[0] = -3;
    if (R > 5) ids[5] = E;
    for (auto& f : flags) f = rng.below(4) == 0;
    DeviceBuffer di = DeviceBuffer::from(ids), dw = DeviceBuffer::from(w), df = DeviceBuffer::from(flags);
    test::DispatchOutputs out(T, k, E, 0xab);
    const DispatchParams dp = out.params(di.as<int32_t>(), dw.as<float>(), df.as<uint8_t>());
    launch_dispatch_small(dp, nullptr, true);
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());
    const Dispatch d = dispatch_ref(ids.data(), T, k, E);
    EXPECT_EQ(out.offsets.to_host<int32_t>(), d.offsets);
    EXPECT_EQ(out.route_row.to_host<int32_t>(), d.route_row);
    const std::vector<int32_t> tok = out.row_token.to_host<int32_t>();
    const std::vector<float> wt = out.row_weight.to_host<float>();
    for (int row = 0; row < d.offsets.back(); ++row) {
      ASSERT_EQ(tok[size_t(row)], d.row_route[size_t(row)] / k);
      ASSERT_EQ(wt[size_t(row)], w[size_t(d.row_route[size_t(row)])]);
    }
    LayerStatus s;
    LOOM_CUDA_CHECK(cudaMemcpy(&s, out.status.get(), sizeof s, cudaMemcpyDeviceToHost));
    EXPECT_EQ(s.dropped_routes, uint32_t(d.dropped));
    EXPECT_EQ(s.nan_tokens, uint32_t(std::count(flags.begin(), flags.end(), 1)));
  }
}

}  // namespace
}  // namespace loom
