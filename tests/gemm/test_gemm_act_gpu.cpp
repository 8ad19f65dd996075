// ffn GEMM 1 with the SiLU*up epilogue (tM.wide.s4.act): w13's gate and up blocks per tile, the
// intermediate written as GEMM 2 reads it. Its fp32 act values against the double reference
// (grouped_gemm_ref, silu*up), then its codes and scales bit for bit against quantize_1x128_ref of
// those fp32 values, in both scale layouts, plain and in A-fragment order; rows past the routes
// keep their poison.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "bench/device_buffer.hpp"
#include "common/device_info.hpp"
#include "contract/device_layout.hpp"
#include "dispatch/dispatch_ref.hpp"
#include "gemm/gemm_fp8.hpp"
#include "gemm/gemm_ref.hpp"
#include "gpu_test.hpp"
#include "pipeline/layer_ref.hpp"
#include "quant/quant_ref.hpp"
#include "stage_buffers.hpp"
#include "test_seed.hpp"
#include "workload/workload.hpp"

namespace loom {
namespace {

using bench::DeviceBuffer;

using test::bits;

void run_case(int64_t tokens, int64_t hidden, int64_t inter, int64_t experts, int64_t topk, const char* dist,
              ScaleLayout layout, bool fragments, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "T=" << tokens << " H=" << hidden << " I=" << inter << " E=" << experts
                                  << " k=" << topk << " " << dist
                                  << (layout == ScaleLayout::row_quads ? ", row quads" : ", group-major")
                                  << (fragments ? ", fragment order" : ""));
  const Shape s{tokens, hidden, inter, experts, topk, Mode::ffn, DType::fp8};
  const LayerWeights w = make_weights(s, seed);
  const Routes routes = make_routes(s, Routing{}, parse_distribution(dist), seed + 1);
  const std::vector<bf16> h = make_hidden(s, seed + 2);
  const Dispatch d = dispatch_ref(routes.topk.ids.data(), tokens, topk, experts);
  const int64_t K = hidden, I = inter, KB = quant_blocks(K), IB = quant_blocks(I), Tp = padded_rows(tokens),
                R = d.offsets.back(), Rp = padded_rows(tokens * topk);

  // Token-order codes in fragment order, scales in row quads (what the pipeline's quantiser writes
  // for the tokens-on-M kernels); the sorted rows the reference multiplies.
  std::vector<uint8_t> tq(size_t(tokens * K)), x(size_t(Tp * K), 0x7f), x_frag(size_t(Tp * K), 0x7f);
  std::vector<float> ts(size_t(tokens * KB)), x_quads(size_t(scale_floats(KB, Tp)), NAN);
  quantize_1x128_ref(h.data(), tokens, K, tq.data(), ts.data());
  std::copy(tq.begin(), tq.end(), x.begin());
  to_fragment_order(x.data(), Tp, K, x_frag.data());
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t g = 0; g < KB; ++g)
      x_quads[size_t(scale_index(ScaleLayout::row_quads, g, t, Tp))] = ts[size_t(t * KB + g)];
  std::vector<uint8_t> a_rows(size_t(R * K));
  std::vector<float> a_scales(size_t(R * KB));
  std::vector<int32_t> row_token(size_t(std::max<int64_t>(R, 1)), -1);
  for (int64_t route = 0; route < tokens * topk; ++route) {
    const int32_t row = d.route_row[size_t(route)];
    if (row < 0) continue;
    const int64_t t = route / topk;
    std::copy_n(&tq[size_t(t * K)], K, &a_rows[size_t(row * K)]);
    std::copy_n(&ts[size_t(t * KB)], KB, &a_scales[size_t(row * KB)]);
    row_token[size_t(row)] = int32_t(t);
  }
  ActivationRows ar;
  ar.dtype = DType::fp8;
  ar.rows = R;
  ar.cols = K;
  ar.q = a_rows.data();
  ar.scales = a_scales.data();
  std::vector<double> hh(size_t(R * 2 * I));
  grouped_gemm_ref(ar, d.offsets.data(), w.w1_view(), hh.data());
  std::vector<double> act_ref(size_t(R * I));
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < I; ++i) {
      const double g = hh[size_t(r * 2 * I + i)], u = hh[size_t(r * 2 * I + I + i)];
      act_ref[size_t(r * I + i)] = g / (1.0 + std::exp(-g)) * u;
    }

  DeviceBuffer dw = DeviceBuffer::from(w.w1_q), dws = DeviceBuffer::from(w.w1_scales), dx = DeviceBuffer::from(x_frag),
               dxs = DeviceBuffer::from(x_quads), doff = DeviceBuffer::from(d.offsets),
               dtok = DeviceBuffer::from(row_token);
  DeviceBuffer codes(size_t(Rp * I)), scales(size_t(scale_floats(IB, Rp)) * 4), values(size_t(Rp * I) * 4),
      queue(2 * 4);
  test::poison({&codes, &scales, &values}, 0x7f);
  test::fill(queue.get(), 0, queue.bytes());
  GemmFp8Params p;
  p.weights = dw.as<uint8_t>();
  p.weight_scales = dws.as<float>();
  p.x = dx.as<uint8_t>();
  p.x_scales = dxs.as<float>();
  p.x_scale_layout = ScaleLayout::row_quads;
  p.x_rows = Tp;
  p.offsets = doff.as<int32_t>();
  p.row_token = dtok.as<int32_t>();
  p.experts = int(experts);
  p.n = int(2 * I);
  p.k = int(K);
  p.work_queue = queue.as<int32_t>();
  p.act.codes = codes.as<uint8_t>();
  p.act.scales = scales.as<float>();
  p.act.values = values.as<float>();
  p.act.rows = Rp;
  p.act.scale_layout = layout;
  p.act.fragment_order = fragments;
  p.act.inter = int(I);
  TokensOnMConfig cfg;
  cfg.wide = true;
  cfg.act = true;
  SCOPED_TRACE(key(cfg));
  launch_gemm_fp8(p, cfg, *query_device(), nullptr, true);
  LOOM_CUDA_CHECK(cudaGetLastError());
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  for (int32_t q : queue.to_host<int32_t>()) EXPECT_EQ(q, 0) << "the queue resets itself";

  // act: the fp32 accumulation's error, per row too.
  const std::vector<float> got = values.to_host<float>();
  const ErrorStats e = relative_error(got.data(), act_ref.data(), R, I);
  EXPECT_LE(e.overall, 2e-3);
  EXPECT_LE(e.worst_row, 1e-2) << "worst sorted row " << e.worst_row_index;
  // Codes and scales: the reference quantiser on the kernel's own act values.
  std::vector<uint8_t> want(size_t(R * I));
  std::vector<float> want_scales(size_t(R * IB));
  quantize_1x128_ref(got.data(), R, I, want.data(), want_scales.data());
  if (fragments) {
    const std::vector<uint8_t> plain = want;
    to_fragment_order(plain.data(), R, I, want.data());
  }
  const std::vector<uint8_t> got_codes = codes.to_host<uint8_t>();
  const std::vector<float> got_scales = scales.to_host<float>();
  int64_t bad = 0;
  for (int64_t i = 0; i < R * I; ++i)
    if (got_codes[size_t(i)] != want[size_t(i)] && bad++ < 5) ADD_FAILURE() << "code " << i / I << ", " << i % I;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t g = 0; g < IB; ++g)
      if (bits(got_scales[size_t(scale_index(layout, g, r, Rp))]) != bits(want_scales[size_t(r * IB + g)]) && bad++ < 10)
        ADD_FAILURE() << "scale row " << r << " group " << g;
  EXPECT_EQ(bad, 0);
  for (int64_t i = R * I; i < Rp * I; ++i) ASSERT_EQ(got_codes[size_t(i)], 0x7f) << "padding code " << i;
}

TEST(GemmActGpu, IntermediateFromGateAndUpBlocksBitForBit) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  const bool small = !test::sanitizer().empty();
  // qwen35-layer's widths; a partial last I block (208 = 128 + 80, plain layout only); skew.
  run_case(small ? 300 : 2048, small ? 512 : 2048, 512, small ? 16 : 256, 8, "random", ScaleLayout::row_quads, true,
           seed);
  run_case(600, 512, 512, 16, 4, "zipf:1.2", ScaleLayout::group_major, false, seed + 1);
  run_case(600, 768, 208, 8, 2, "concentrated", ScaleLayout::row_quads, false, seed + 2);
  if (!small) run_case(300, 7168, 1536, 16, 4, "random", ScaleLayout::row_quads, true, seed + 3);  // wide layers
}

}  // namespace
}  // namespace loom
