// The ffn intermediate on its own: SiLU(gate) * up from fp32 GEMM-1 rows, re-quantised per 1x128
// group. The fp32 act values against the double formula (a few fp32 ulps: expf), then the codes
// and scales bit for bit against quantize_1x128_ref of the kernel's own act values, in both scale
// layouts; rows past the valid count keep their poison; the accumulator and words are cleared.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "bench/device_buffer.hpp"
#include "common/rng.hpp"
#include "contract/device_layout.hpp"
#include "gpu_test.hpp"
#include "quant/quant_ref.hpp"
#include "quant/silu_mul_quant_sm90.cuh"
#include "stage_buffers.hpp"
#include "test_seed.hpp"

namespace loom {
namespace {

using bench::DeviceBuffer;

using test::bits;

void run_case(int64_t rows, int64_t padded, int inter, int experts, ScaleLayout layout, uint64_t seed,
              bool fragment_order = false) {
  SCOPED_TRACE(testing::Message() << "rows=" << rows << " of " << padded << " I=" << inter << " E=" << experts
                                  << (layout == ScaleLayout::row_quads ? " row quads" : " group-major")
                                  << (fragment_order ? ", fragment order" : ""));
  Rng rng(seed);
  const int64_t I = inter, G = (I + 127) / 128;
  // GEMM-1 rows: normal values of a few magnitudes; one row's gates far negative (e^-g overflows),
  // one element NaN (its group's amax ignores it, its code is NaN).
  std::vector<float> h(size_t(padded * 2 * I));
  for (size_t i = 0; i < h.size(); ++i) h[i] = float(rng.normal() * (i % 7 == 0 ? 8.0 : 1.5));
  if (rows > 2) {
    for (int64_t c = 0; c < I; ++c) h[size_t(1 * 2 * I + c)] = -100.0f - float(c);
    h[size_t(2 * 2 * I + I + 3)] = NAN;
  }
  std::vector<int32_t> offsets(size_t(experts + 1), 0);
  for (int e = 1; e <= experts; ++e) offsets[size_t(e)] = int32_t(rows * e / experts);

  DeviceBuffer dh = DeviceBuffer::from(h), doff = DeviceBuffer::from(offsets);
  DeviceBuffer codes(size_t(padded * I)), scales(size_t(scale_floats(G, padded)) * 4), act(size_t(padded * I) * 4),
      zero(size_t(1000) * 4), words(3 * 4);
  test::poison({&codes, &scales, &act, &zero, &words}, 0x7f);
  SiluMulQuantParams p;
  p.h = dh.as<float>();
  p.offsets = doff.as<int32_t>();
  p.experts = experts;
  p.inter = inter;
  p.padded_rows = padded;
  p.codes = codes.as<uint8_t>();
  p.scales = scales.as<float>();
  p.scale_layout = layout;
  p.fragment_order = fragment_order;
  p.act = act.as<float>();
  p.zero_out = zero.as<float>();
  p.zero_count = 999;  // not a multiple of 4: the tail too
  p.zero_words = words.as<int32_t>();
  p.zero_word_count = 3;
  test::Stream stream;
  launch_silu_mul_quant(p, 4, stream.get(), true);  // few CTAs: the body strides
  stream.sync();

  const std::vector<float> got_act = act.to_host<float>();
  const std::vector<uint8_t> got_codes = codes.to_host<uint8_t>();
  const std::vector<float> got_scales = scales.to_host<float>();
  // act: the double formula rounded once, within a few ulps (the kernel's expf); NaN where NaN.
  int64_t act_bad = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < I; ++c) {
      const double g = h[size_t(r * 2 * I + c)], u = h[size_t(r * 2 * I + I + c)];
      const float want = float(g / (1.0 + std::exp(-g)) * u), x = got_act[size_t(r * I + c)];
      const bool ok = std::isnan(want) ? std::isnan(x) : std::fabs(double(x) - want) <= 1e-6 * std::fabs(want) + 1e-37;
      if (!ok && act_bad++ < 5) ADD_FAILURE() << "act row " << r << " col " << c << ": " << x << " want " << want;
    }
  EXPECT_EQ(act_bad, 0);
  // Codes and scales: the reference quantiser on the kernel's own fp32 values.
  std::vector<uint8_t> want_codes(size_t(rows * I));
  std::vector<float> want_scales(size_t(rows * G));
  quantize_1x128_ref(got_act.data(), rows, I, want_codes.data(), want_scales.data());
  if (fragment_order) {
    std::vector<uint8_t> plain = want_codes;
    to_fragment_order(plain.data(), rows, I, want_codes.data());
  }
  int64_t code_bad = 0, scale_bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < I; ++c)
      if (got_codes[size_t(r * I + c)] != want_codes[size_t(r * I + c)] && code_bad++ < 5)
        ADD_FAILURE() << "code row " << r << " col " << c;
    for (int64_t g = 0; g < G; ++g)
      if (bits(got_scales[size_t(scale_index(layout, g, r, padded))]) != bits(want_scales[size_t(r * G + g)]) &&
          scale_bad++ < 5)
        ADD_FAILURE() << "scale row " << r << " group " << g;
  }
  EXPECT_EQ(code_bad, 0);
  EXPECT_EQ(scale_bad, 0);
  // Rows past the valid count: untouched.
  for (int64_t i = rows * I; i < padded * I; ++i) ASSERT_EQ(got_codes[size_t(i)], 0x7f) << "code byte " << i;
  for (int64_t r = rows; r < padded; ++r)
    for (int64_t g = 0; g < G; ++g)
      ASSERT_EQ(bits(got_scales[size_t(scale_index(layout, g, r, padded))]), 0x7f7f7f7fu) << "scale row " << r;
  const std::vector<float> z = zero.to_host<float>();
  for (int i = 0; i < 999; ++i) ASSERT_EQ(bits(z[size_t(i)]), 0u) << "accumulator word " << i;
  EXPECT_EQ(bits(z[999]), 0x7f7f7f7fu) << "past zero_count";
  for (int32_t w : words.to_host<int32_t>()) EXPECT_EQ(w, 0);
}

TEST(SiluMulQuantGpu, ActWithinUlpsCodesAndScalesBitForBit) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  for (const ScaleLayout layout : {ScaleLayout::group_major, ScaleLayout::row_quads}) {
    run_case(1021, 1024, 512, 8, layout, seed);   // qwen35-layer's I
    run_case(37, 40, 80, 3, layout, seed + 1);    // one partial group of 80
    run_case(300, 512, 208, 16, layout, seed + 2);  // 128 + 80; most padded rows unused
    run_case(64, 64, 1536, 4, layout, seed + 3);  // 12 groups: three row quads
  }
  // In A-fragment order (the tokens-on-M GEMM reading sorted rows), as the pipeline runs it.
  run_case(1021, 1024, 512, 8, ScaleLayout::row_quads, seed + 4, true);
  run_case(300, 512, 384, 16, ScaleLayout::row_quads, seed + 5, true);
}

TEST(SiluMulQuantGpu, NoValidRowsWritesNoRowButClears) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  run_case(0, 16, 512, 4, ScaleLayout::group_major, seed);
}

}  // namespace
}  // namespace loom
