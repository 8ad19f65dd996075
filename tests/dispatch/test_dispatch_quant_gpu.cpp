// The fused dispatch + quantise-into-sorted-rows launch writes exactly what the dispatch kernel
// followed by the gathering quantise kernel write (each checked against its CPU reference by its own
// tests), for any grid size: offsets, route_row, row_token, row_weight, status, FP8 codes, scales and
// the cleared output and words, bit for bit, with dropped ids and NaN flags in the input, whether the first
// pass is quantised before or after the kernel's PDL wait, and whether it counts the ids or is given
// their token masks.
#include <gtest/gtest.h>

#include <cstring>
#include <tuple>
#include <utility>

#include "bench/device_buffer.hpp"
#include "common/device_info.hpp"
#include "common/rng.hpp"
#include "dispatch/dispatch_quant_sm90.cuh"
#include "dispatch/dispatch_ref.hpp"
#include "gpu_test.hpp"
#include "contract/device_layout.hpp"
#include "stage_buffers.hpp"
#include "test_seed.hpp"
#include "workload/workload.hpp"

namespace loom {
namespace {

using bench::DeviceBuffer;

struct Outputs {
  std::vector<int32_t> offsets, route_row, row_token;
  std::vector<uint32_t> row_weight, scales, zeroed;  // bits
  std::vector<int32_t> words;  // zero_words (the GEMM's work queue), poisoned before the run
  std::vector<uint8_t> codes;
  LayerStatus status;
};

// grid 0: the two-kernel reference path. early: the fused kernel quantises its first pass and clears
// the output before its PDL wait (as after the routing kernel; here nothing precedes it).
// masks: the token masks of the ids (as the routing kernel writes them), or nullptr (count the ids).
// layout: the scales' (row quads: what the hand-off GEMM reads).
Outputs run_once(int grid, bool early, const DeviceBuffer& ids, const DeviceBuffer& wts, const DeviceBuffer& flags,
                 const DeviceBuffer& hidden, int T, int E, int k, int H, const uint32_t* masks = nullptr,
                 ScaleLayout layout = ScaleLayout::group_major) {
  test::DispatchOutputs d(T, k, E, 0x7f);
  test::QuantOutputs q(padded_rows(int64_t(T) * k), H, T, 48, 0x7f);
  DispatchParams dp = d.params(ids.as<int32_t>(), wts.as<float>(), flags.as<uint8_t>());
  dp.token_masks = masks;
  QuantGatherParams qp = q.params(hidden.as<uint16_t>(), dp.route_row, T, H, k);
  qp.scale_layout = layout;
  DeviceBuffer words(2 * sizeof(int32_t));
  test::fill(words.get(), 0x7f, words.bytes());
  qp.zero_words = words.as<int32_t>();
  qp.zero_word_count = 2;
  test::Stream stream;
  if (grid > 0) {
    launch_dispatch_quant(dp, qp, grid, stream.get(), true, early);
  } else {
    launch_dispatch(dp, stream.get(), true);
    launch_quant_gather(qp, stream.get(), true);
  }
  LOOM_CUDA_CHECK(cudaGetLastError());
  stream.sync();
  Outputs o;
  o.offsets = d.offsets.to_host<int32_t>();
  o.route_row = d.route_row.to_host<int32_t>();
  o.row_token = d.row_token.to_host<int32_t>();
  o.row_weight = d.row_weight.to_host<uint32_t>();
  o.scales = q.scales.to_host<uint32_t>();
  o.zeroed = q.zero.to_host<uint32_t>();
  o.words = words.to_host<int32_t>();
  o.codes = q.codes.to_host<uint8_t>();
  const std::vector<uint8_t> sb = d.status.to_host<uint8_t>();
  std::memcpy(&o.status, sb.data(), sizeof o.status);
  return o;
}

TEST(DispatchQuantGpu, MatchesDispatchThenQuantiseBitForBit) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  const int sms = query_device()->sm_count;
  for (const auto& [T, E, k, H, dist] :
       {std::tuple{33, 256, 8, 2048, "random"}, std::tuple{128, 256, 8, 2048, "zipf:1.2"},
        std::tuple{517, 64, 2, 320, "hot:0.9"}, std::tuple{2048, 256, 8, 2048, "random"},
        std::tuple{1000, 512, 16, 192, "balanced"}, std::tuple{40, 8, 1, 7168, "concentrated"}}) {
    SCOPED_TRACE(testing::Message() << "T=" << T << " E=" << E << " k=" << k << " H=" << H << " " << dist);
    ASSERT_TRUE(dispatch_quant_fits(T, k, E));
    const Shape shape{T, H, 16, E, k, Mode::single, DType::fp8};
    Routes routes = make_routes(shape, Routing{}, parse_distribution(dist), seed);
    std::vector<int32_t> ids = routes.topk.ids;  // distinct per token, as routing writes them
    Rng rng(seed, 5);
    for (auto& id : ids)
      if (rng.below(16) == 0) id = rng.below(2) ? -1 : E + int32_t(rng.below(4));  // dropped routes
    std::vector<uint8_t> flags(static_cast<size_t>(T));
    for (auto& f : flags) f = rng.below(8) == 0 ? 1 : 0;
    const std::vector<bf16> hidden = make_hidden(shape, seed + 1);
    const DeviceBuffer did = DeviceBuffer::from(ids), dwt = DeviceBuffer::from(routes.topk.weights),
                       dfl = DeviceBuffer::from(flags), dh = DeviceBuffer::from(hidden);
    // The reference path in both scale layouts (QuantGatherGpu checks both against the CPU).
    const Outputs want = run_once(0, false, did, dwt, dfl, dh, T, E, k, H);
    const Outputs want_quads = run_once(0, false, did, dwt, dfl, dh, T, E, k, H, nullptr, ScaleLayout::row_quads);
    // The token masks of these ids (the dropped ones have no bit), as the routing kernel writes them.
    const DeviceBuffer dmasks = DeviceBuffer::from(token_masks_ref(ids.data(), T, k, E));
    struct Run {
      int grid;
      bool early, with_masks, quads;
    };
    for (const auto& [grid, early, with_masks, quads] :
         {Run{1, false, false, false}, Run{3, true, false, false}, Run{sms, false, false, false},
          Run{sms, true, false, false}, Run{3, true, true, false}, Run{sms, true, true, false},
          Run{3, false, false, true}, Run{sms, true, true, true}}) {
      SCOPED_TRACE(testing::Message() << "grid " << grid << (early ? ", quantised before the wait" : "")
                                      << (with_masks ? ", token masks given" : "")
                                      << (quads ? ", scales in row quads" : ""));
      const Outputs got = run_once(grid, early, did, dwt, dfl, dh, T, E, k, H,
                                   with_masks ? dmasks.as<uint32_t>() : nullptr,
                                   quads ? ScaleLayout::row_quads : ScaleLayout::group_major);
      const int rows = want.offsets.back();
      EXPECT_EQ(got.offsets, want.offsets);
      EXPECT_EQ(got.route_row, want.route_row);
      EXPECT_TRUE(std::equal(want.row_token.begin(), want.row_token.begin() + rows, got.row_token.begin()));
      EXPECT_TRUE(std::equal(want.row_weight.begin(), want.row_weight.begin() + rows, got.row_weight.begin()));
      EXPECT_EQ(got.status.nan_tokens, want.status.nan_tokens);
      EXPECT_EQ(got.status.dropped_routes, want.status.dropped_routes);
      EXPECT_EQ(got.codes, want.codes);
      EXPECT_EQ(got.scales, quads ? want_quads.scales : want.scales);
      for (uint32_t z : got.zeroed) ASSERT_EQ(z, 0u);
      EXPECT_EQ(got.words, std::vector<int32_t>(2, 0));
    }
  }
}

TEST(DispatchQuant, TakesBatchesWhoseMasksFit) {
  EXPECT_TRUE(dispatch_quant_fits(128, 8, 256));
  EXPECT_TRUE(dispatch_quant_fits(2048, 8, 256));
  EXPECT_FALSE(dispatch_quant_fits(8192, 8, 256));  // 256 x 256 words of masks and prefixes
  EXPECT_FALSE(dispatch_quant_fits(128, 8, 1024));
  EXPECT_FALSE(dispatch_quant_fits(0, 8, 256));
}

}  // namespace
}  // namespace loom
