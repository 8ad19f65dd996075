// The route+quantise launch writes exactly what the routing kernel and the token-order quantise
// kernel write on their own (which their own tests check against route_ref and quantize_1x128_ref),
// whatever the mix of routing and quantising CTAs.
#include <gtest/gtest.h>

#include <cstring>
#include <tuple>

#include "bench/device_buffer.hpp"
#include "common/rng.hpp"
#include "gpu_test.hpp"
#include "pipeline/device_layout.hpp"
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
                const Routing& routing, int zero_cols) {
  const int64_t Tp = padded_rows(T);
  test::RouteOutputs r(T, k, 0x7f);
  test::QuantOutputs q(Tp, H, T, zero_cols, 0x7f);
  const RouteTopkParams rp = r.params(logits.as<float>(), T, E, k, routing);
  const QuantGatherParams qp = q.params(hidden.as<uint16_t>(), nullptr, T, H, k);
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

TEST(RouteQuantGpu, MatchesRouteThenTokenOrderQuantiseBitForBit) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  Rng rng(seed);
  Routing softmax, sigmoid;
  sigmoid.scoring = Scoring::sigmoid;
  sigmoid.n_group = 8;
  sigmoid.topk_group = 4;
  sigmoid.renormalize = true;
  for (const auto& [T, E, k, H, sig] :
       {std::tuple{1, 256, 8, 2048, false}, std::tuple{33, 256, 8, 2048, false}, std::tuple{128, 256, 8, 7168, true},
        std::tuple{1000, 64, 2, 192, false}, std::tuple{517, 512, 16, 320, true}, std::tuple{8192, 256, 8, 2048, false}}) {
    SCOPED_TRACE(testing::Message() << "T=" << T << " E=" << E << " k=" << k << " H=" << H << (sig ? " sigmoid" : " softmax"));
    std::vector<float> logits(size_t(T) * E);
    for (auto& x : logits) x = float(rng.normal());
    // Every third token draws from {-0, +0, 1, 2}: exact ties (and signed zeros) everywhere, so the
    // fused launch's ranking (WarpRanker: lanes win repeatedly and rescan) must break them as the
    // routing kernel's does, by the lower id.
    for (int t = 0; t < T; t += 3)
      for (int e = 0; e < E; ++e) {
        const uint64_t v = rng.below(4);
        logits[size_t(t) * E + size_t(e)] = v == 0 ? -0.0f : float(v - 1);
      }
    logits[size_t(T / 2) * E + 3] = NAN;  // one token with a NaN logit: its flag must match too
    std::vector<uint16_t> hidden(size_t(T) * H);
    for (auto& h : hidden) h = uint16_t(0x3c00 + rng.below(0x0800)) ^ uint16_t(rng.below(2) << 15);
    const DeviceBuffer dl = DeviceBuffer::from(logits), dh = DeviceBuffer::from(hidden);
    const Routing& routing = sig ? sigmoid : softmax;
    const Result a = run_once(false, dl, dh, T, E, k, H, routing, 80);
    const Result b = run_once(true, dl, dh, T, E, k, H, routing, 80);
    EXPECT_EQ(a.ids, b.ids);
    EXPECT_EQ(a.weights, b.weights);
    EXPECT_EQ(a.flags, b.flags);
    EXPECT_EQ(a.codes, b.codes);
    EXPECT_EQ(a.scales, b.scales);
    for (size_t i = 0; i < b.zeroed.size(); ++i) ASSERT_EQ(b.zeroed[i], 0) << "output byte " << i << " not cleared";
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
