// The route+quantise launch writes exactly what the routing kernel and the token-order quantise
// kernel write on their own (which their own tests check against route_ref and quantize_1x128_ref),
// whatever the mix of routing and quantising CTAs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <tuple>

#include "bench/device_buffer.hpp"
#include "common/rng.hpp"
#include "gpu_test.hpp"
#include "contract/device_layout.hpp"
#include "dispatch/dispatch_ref.hpp"
#include "dispatch/expert_bins_clear_sm90.cuh"
#include "route/route_quant_sm90.cuh"
#include "stage_buffers.hpp"
#include "test_seed.hpp"

namespace loom {
namespace {

using bench::DeviceBuffer;
using test::Stream;

struct Result {
  std::vector<uint8_t> ids, weights, flags, codes, scales, zeroed;  // raw bytes: bitwise comparison
};

template <class T>
std::vector<uint8_t> bytes_of(const DeviceBuffer& b) {
  const std::vector<T> v = b.to_host<T>();
  std::vector<uint8_t> out(v.size() * sizeof(T));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

Result run_once(bool fused, const DeviceBuffer& logits, const DeviceBuffer& hidden, int T, int E, int k, int H,
                const Routing& routing, int zero_cols, ScaleLayout scale_layout) {
  const int64_t Tp = padded_rows(T);
  test::RouteOutputs r(T, k, 0x7f);
  test::QuantOutputs q(Tp, H, T, zero_cols, 0x7f);
  const RouteTopkParams rp = r.params(logits.as<float>(), T, E, k, routing);
  QuantGatherParams qp = q.params(hidden.as<uint16_t>(), nullptr, T, H, k);
  qp.scale_layout = scale_layout;
  Stream stream;
  if (fused) {
    launch_route_quant(rp, qp, stream.get(), true);
  } else {
    launch_route_topk(rp, stream.get(), true);
    launch_quant_gather(qp, stream.get(), true);
  }
  LOOM_CUDA_CHECK(cudaGetLastError());
  stream.sync();
  return Result{bytes_of<int32_t>(r.ids),   bytes_of<float>(r.weights), bytes_of<uint8_t>(r.flags),
                bytes_of<uint8_t>(q.codes), bytes_of<float>(q.scales), bytes_of<float>(q.zero)};
}

// Random logits with exact ties: every third token draws from {-0, +0, 1, 2}, so the fused
// launch's ranking (WarpRanker: lanes win repeatedly and rescan) must break them as the routing
// kernel's does, by the lower id. Token T / 2 has one NaN logit. Hidden: random bf16.
struct DeviceInputs {
  DeviceBuffer logits, hidden;
};
DeviceInputs make_inputs(Rng& rng, int T, int E, int H) {
  std::vector<float> logits(static_cast<size_t>(T) * E);
  for (auto& x : logits) x = float(rng.normal());
  for (int t = 0; t < T; t += 3)
    for (int e = 0; e < E; ++e) {
      const uint64_t v = rng.below(4);
      logits[size_t(t) * E + size_t(e)] = v == 0 ? -0.0f : float(v - 1);
    }
  logits[size_t(T / 2) * E + 3] = NAN;
  std::vector<uint16_t> hidden(static_cast<size_t>(T) * H);
  for (auto& h : hidden) h = uint16_t(0x3c00 + rng.below(0x0800)) ^ uint16_t(rng.below(2) << 15);
  return DeviceInputs{DeviceBuffer::from(logits), DeviceBuffer::from(hidden)};
}

Routing grouped_sigmoid() {
  Routing sigmoid;
  sigmoid.scoring = Scoring::sigmoid;
  sigmoid.n_group = 8;
  sigmoid.topk_group = 4;
  sigmoid.renormalize = true;
  return sigmoid;
}

TEST(RouteQuantGpu, MatchesRouteThenTokenOrderQuantiseBitForBit) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  Rng rng(seed);
  const Routing softmax, sigmoid = grouped_sigmoid();
  for (const auto& [T, E, k, H, sig] :
       {std::tuple{1, 256, 8, 2048, false}, std::tuple{33, 256, 8, 2048, false}, std::tuple{128, 256, 8, 7168, true},
        std::tuple{1000, 64, 2, 192, false}, std::tuple{517, 512, 16, 320, true}, std::tuple{8192, 256, 8, 2048, false}}) {
    SCOPED_TRACE(testing::Message() << "T=" << T << " E=" << E << " k=" << k << " H=" << H << (sig ? " sigmoid" : " softmax"));
    const DeviceInputs in = make_inputs(rng, T, E, H);
    const DeviceBuffer &dl = in.logits, &dh = in.hidden;
    const Routing& routing = sig ? sigmoid : softmax;
    // The large-T launch's scales in row quads too (what the register-loaded GEMM reads).
    const ScaleLayout layout = T >= 1000 ? ScaleLayout::row_quads : ScaleLayout::group_major;
    const Result a = run_once(false, dl, dh, T, E, k, H, routing, 80, layout);
    const Result b = run_once(true, dl, dh, T, E, k, H, routing, 80, layout);
    EXPECT_EQ(a.ids, b.ids);
    EXPECT_EQ(a.weights, b.weights);
    EXPECT_EQ(a.flags, b.flags);
    EXPECT_EQ(a.codes, b.codes);
    EXPECT_EQ(a.scales, b.scales);
    for (size_t i = 0; i < b.zeroed.size(); ++i) ASSERT_EQ(b.zeroed[i], 0) << "output byte " << i << " not cleared";
  }
}

// Expert bins: after the clear kernel (counters and status poisoned before it), the routing appends
// every route to its expert's bin exactly once: per expert the count of dispatch_ref, and the bin's
// (token, weight bits), sorted by token, are the reference's sorted rows of that expert. Slots past
// a bin's count keep their poison; the status counts the NaN tokens. Ids, weights, flags and codes
// stay those of the launch without bins.
TEST(RouteQuantGpu, ExpertBinsHoldEveryRouteOnce) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  Rng rng(seed);
  const Routing softmax, sigmoid = grouped_sigmoid();
  constexpr int32_t kPoison = 0x7f7f7f7f;
  for (const auto& [T, E, k, H, sig] :
       {std::tuple{33, 8, 2, 384, false}, std::tuple{1000, 64, 2, 192, false}, std::tuple{517, 512, 16, 320, true},
        std::tuple{8192, 256, 8, 2048, false}}) {
    SCOPED_TRACE(testing::Message() << "T=" << T << " E=" << E << " k=" << k << (sig ? " sigmoid" : " softmax"));
    const DeviceInputs in = make_inputs(rng, T, E, H);
    const DeviceBuffer &dl = in.logits, &dh = in.hidden;
    const Routing& routing = sig ? sigmoid : softmax;
    const Result plain = run_once(true, dl, dh, T, E, k, H, routing, 80, ScaleLayout::group_major);

    const int stride = T + 5;
    test::RouteOutputs r(T, k, 0x7f);
    test::QuantOutputs q(padded_rows(T), H, T, 80, 0x7f);
    DeviceBuffer counts(size_t(E) * kBinCountStride * 4), bin_token(size_t(E) * stride * 4), bin_weight(size_t(E) * stride * 4),
        status(sizeof(LayerStatus));
    test::poison({&counts, &bin_token, &bin_weight, &status}, 0x7f);
    RouteTopkParams rp = r.params(dl.as<float>(), T, E, k, routing);
    rp.bin_counts = counts.as<int32_t>();
    rp.bin_token = bin_token.as<int32_t>();
    rp.bin_weight = bin_weight.as<float>();
    rp.bin_stride = stride;
    rp.status = status.as<LayerStatus>();
    ExpertBinsClearParams cp;
    cp.bin_counts = rp.bin_counts;
    cp.status = rp.status;
    cp.experts = E;
    Stream stream;
    launch_expert_bins_clear(cp, stream.get(), true);
    launch_route_quant(rp, q.params(dh.as<uint16_t>(), nullptr, T, H, k), stream.get(), true);
    LOOM_CUDA_CHECK(cudaGetLastError());
    stream.sync();
    EXPECT_EQ(bytes_of<int32_t>(r.ids), plain.ids);
    EXPECT_EQ(bytes_of<float>(r.weights), plain.weights);
    EXPECT_EQ(bytes_of<uint8_t>(r.flags), plain.flags);
    EXPECT_EQ(bytes_of<uint8_t>(q.codes), plain.codes);

    const std::vector<int32_t> ids = r.ids.to_host<int32_t>();
    const std::vector<uint32_t> weight_bits = r.weights.to_host<uint32_t>();
    const Dispatch d = dispatch_ref(ids.data(), T, k, E);
    const std::vector<int32_t> padded_counts = counts.to_host<int32_t>(), tok = bin_token.to_host<int32_t>();
    std::vector<int32_t> got_counts(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) {
      got_counts[size_t(e)] = padded_counts[size_t(e) * kBinCountStride];
      for (int i = 1; i < kBinCountStride; ++i)
        ASSERT_EQ(padded_counts[size_t(e) * kBinCountStride + i], kPoison) << "counter padding of expert " << e;
    }
    const std::vector<uint32_t> wt = bin_weight.to_host<uint32_t>();
    ASSERT_EQ(got_counts, d.counts);
    for (int e = 0; e < E; ++e) {
      std::vector<std::pair<int32_t, uint32_t>> want, got;
      for (int32_t row = d.offsets[size_t(e)]; row < d.offsets[size_t(e) + 1]; ++row) {
        const int32_t route = d.row_route[size_t(row)];
        want.emplace_back(route / k, weight_bits[size_t(route)]);
      }
      for (int i = 0; i < stride; ++i) {
        const size_t at = size_t(e) * stride + size_t(i);
        if (i < got_counts[size_t(e)])
          got.emplace_back(tok[at], wt[at]);
        else
          ASSERT_TRUE(tok[at] == kPoison && wt[at] == uint32_t(kPoison)) << "expert " << e << " slot " << i << " written";
      }
      std::sort(got.begin(), got.end());
      ASSERT_EQ(got, want) << "expert " << e;  // the reference's rows are in ascending token order
    }
    const std::vector<uint8_t> flags = r.flags.to_host<uint8_t>();
    const LayerStatus st = status.to_host<LayerStatus>()[0];
    EXPECT_EQ(st.nan_tokens, uint32_t(std::count(flags.begin(), flags.end(), uint8_t(1))));
    EXPECT_GE(st.nan_tokens, 1u);
    EXPECT_EQ(st.dropped_routes, 0u);
    EXPECT_EQ(st.reserved[0] | st.reserved[1], 0u);
  }
}

TEST(RouteQuant, LauncherRejectsAGatheredQuantisation) {
  RouteTopkParams rp;
  QuantGatherParams qp;
  rp.experts = 8;
  rp.topk = 2;
  EXPECT_NO_THROW(launch_route_quant(rp, qp, nullptr, true));  // T = 0: nothing launched
  auto fake = [](uintptr_t a) { return reinterpret_cast<void*>(a); };
  rp.tokens = qp.tokens = 4;
  rp.logits = static_cast<const float*>(fake(0x10000));
  rp.topk_ids = static_cast<int32_t*>(fake(0x20000));
  rp.topk_weights = static_cast<float*>(fake(0x30000));
  rp.nan_flags = static_cast<uint8_t*>(fake(0x40000));
  qp.hidden_dim = 128;
  qp.topk = 2;
  qp.padded_rows = 8;
  qp.hidden = static_cast<const uint16_t*>(fake(0x50000));
  qp.a_sorted = static_cast<uint8_t*>(fake(0x60000));
  qp.a_scales = static_cast<float*>(fake(0x70000));
  qp.route_row = static_cast<const int32_t*>(fake(0x80000));
  EXPECT_THROW(launch_route_quant(rp, qp, nullptr, false), Error);  // gathered, not token order
  qp.route_row = nullptr;
  qp.tokens = 3;
  EXPECT_THROW(launch_route_quant(rp, qp, nullptr, false), Error);  // different token counts
  qp.tokens = 4;
  rp.topk = 0;
  EXPECT_THROW(launch_route_quant(rp, qp, nullptr, false), Error);  // what the routing launcher rejects
}

}  // namespace
}  // namespace loom
