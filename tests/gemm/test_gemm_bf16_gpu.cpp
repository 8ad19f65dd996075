// The BF16 grouped GEMMs alone (issue 47: tokens on M and weights on M), on expert-sorted rows
// laid out by the CPU dispatch: the weighted route rows (fp32 and bf16) against grouped_gemm_ref,
// and the SiLU*up epilogue on a w13 against silu_mul_ref rounded to bf16; the rows past the routed
// ones (poisoned) stay as they were, and padding rows of A full of NaN reach no written row.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "bench/device_buffer.hpp"
#include "common/bf16.hpp"
#include "common/device_info.hpp"
#include "contract/device_layout.hpp"
#include "dispatch/dispatch_ref.hpp"
#include "gemm/gemm_bf16.hpp"
#include "gemm/gemm_ref.hpp"
#include "gpu_test.hpp"
#include "pipeline/layer_ref.hpp"
#include "test_seed.hpp"
#include "workload/workload.hpp"

namespace loom {
namespace {

using bench::DeviceBuffer;

struct Bf16Case {
  int64_t tokens, hidden, inter, experts, topk;
  const char* dist;
};

constexpr uint16_t kPoison = 0x7fc1;  // a bf16 NaN the kernel never writes

// Sorted rows of the routed tokens' hidden rows, [Rp, K], NaN in the rows no route owns.
std::vector<bf16> sorted_rows(const std::vector<bf16>& hidden, const Dispatch& d, int64_t topk, int64_t K, int64_t Rp) {
  std::vector<bf16> a(size_t(Rp * K), bf16{kPoison});
  for (size_t route = 0; route < d.route_row.size(); ++route) {
    const int32_t row = d.route_row[route];
    if (row >= 0) std::copy_n(&hidden[size_t(int64_t(route) / topk * K)], K, &a[size_t(row * K)]);
  }
  return a;
}

// rows epilogue: out[r, n] = row_weight[r] * (x[r] . W[e(r), n]), W = the case's w2 [E, H, I]
// over sorted rows of width I; act epilogue: the w13 [E, 2I, H] over rows of width H. Both
// kernels against one reference: tokens on M (prefill) and weights on M (decode).
void run_case(const Bf16Case& c, Bf16Epilogue epi, bool store_bf16, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "T=" << c.tokens << " H=" << c.hidden << " I=" << c.inter << " E=" << c.experts
                                  << " k=" << c.topk << " " << c.dist
                                  << (epi == Bf16Epilogue::act ? " act" : store_bf16 ? " rows bf16" : " rows fp32"));
  const Shape s{c.tokens, c.hidden, c.inter, c.experts, c.topk, Mode::ffn, DType::bf16};
  const LayerWeights w = make_weights(s, seed, WeightValues::normal);
  const Routes routes = make_routes(s, Routing{}, parse_distribution(c.dist), seed + 1);
  const Dispatch d = dispatch_ref(routes.topk.ids.data(), s.tokens, s.topk, s.experts);
  const bool act = epi == Bf16Epilogue::act;
  const int64_t R = d.offsets.back(), Rp = padded_rows(s.routes()), K = act ? s.hidden : s.inter,
                N = act ? 2 * s.inter : s.hidden, out_cols = act ? s.inter : s.hidden;
  // The rows: act reads hidden rows; rows reads intermediate-like rows of width I (random bf16).
  std::vector<bf16> x_rows;
  if (act) {
    x_rows = sorted_rows(make_hidden(s, seed + 2), d, s.topk, K, Rp);
  } else {
    const Shape wide{s.tokens, s.inter, s.inter, s.experts, s.topk, Mode::ffn, DType::bf16};
    x_rows = sorted_rows(make_hidden(wide, seed + 2), d, s.topk, K, Rp);
  }
  std::vector<float> row_weight(size_t(Rp), NAN);
  for (int64_t r = 0; r < R; ++r) row_weight[size_t(r)] = routes.topk.weights[size_t(d.row_route[size_t(r)])];

  // Reference in double over the routed rows.
  ActivationRows ar;
  ar.dtype = DType::bf16;
  ar.rows = R;
  ar.cols = K;
  ar.x = x_rows.data();
  std::vector<double> y(size_t(R * N));
  grouped_gemm_ref(ar, d.offsets.data(), act ? w.w1_view() : w.w2_view(), y.data());
  std::vector<double> ref(size_t(R * out_cols));
  if (act) {
    std::vector<float> a(size_t(R * s.inter));
    silu_mul_ref(y.data(), R, s.inter, a.data());
    for (size_t i = 0; i < a.size(); ++i) ref[i] = double(round_to_bf16(a[i]));
  } else {
    for (int64_t r = 0; r < R; ++r)
      for (int64_t n = 0; n < N; ++n) ref[size_t(r * N + n)] = double(row_weight[size_t(r)]) * y[size_t(r * N + n)];
  }

  DeviceBuffer dw = DeviceBuffer::from(act ? w.w1 : w.w2), dx = DeviceBuffer::from(x_rows),
               doff = DeviceBuffer::from(d.offsets), dwt = DeviceBuffer::from(row_weight);
  const bool out_bf16 = act || store_bf16;
  DeviceBuffer dout(size_t(Rp * out_cols) * (out_bf16 ? 2 : 4));
  GemmBf16Params p;
  p.weights = dw.as<bf16>();
  p.x = dx.as<bf16>();
  p.x_rows = Rp;
  p.offsets = doff.as<int32_t>();
  p.epilogue = epi;
  p.row_weight = dwt.as<float>();
  p.out = dout.get();
  p.store_bf16 = store_bf16;
  p.inter = int(s.inter);
  p.experts = int(s.experts);
  p.n = int(N);
  p.k = int(K);
  for (const bool weights_on_m : {false, true}) {
    SCOPED_TRACE(weights_on_m ? "weights on M" : "tokens on M");
    p.weights_on_m = weights_on_m;
    test::fill(dout.get(), 0xff, dout.bytes());  // NaN everywhere (bf16 0xffff, fp32 0xffffffff)
    launch_gemm_bf16(p, *query_device(), nullptr, false);
    LOOM_CUDA_CHECK(cudaGetLastError());
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> got(size_t(R * out_cols));
    if (out_bf16) {
      const std::vector<bf16> o = dout.to_host<bf16>();
      for (size_t i = 0; i < got.size(); ++i) got[i] = bf16_to_float(o[i]);
      for (size_t i = got.size(); i < o.size(); ++i)
        ASSERT_EQ(o[i].bits, 0xffff) << "element " << i << " past the routed rows was written";
    } else {
      const std::vector<float> o = dout.to_host<float>();
      std::copy_n(o.begin(), got.size(), got.begin());
      for (size_t i = got.size(); i < o.size(); ++i) ASSERT_TRUE(std::isnan(o[i])) << "element " << i << " written";
    }
    const ErrorStats e = relative_error(got.data(), ref.data(), R, out_cols);
    // fp32 route rows: fp32 accumulation of exact bf16 products; bf16 outputs: one rounding (act:
    // the fp32 SiLU*up a few ulps from the reference's, an occasional bf16 tie the other way).
    EXPECT_LE(e.overall, out_bf16 ? 2e-3 : 1e-5);
    EXPECT_LE(e.worst_row, out_bf16 ? 1e-2 : 1e-4) << "worst sorted row " << e.worst_row_index;
  }
}

const Bf16Case kCases[] = {
    {1, 1024, 1536, 8, 1, "random"},
    {5, 1536, 1024, 16, 2, "random"},
    {128, 3072, 1536, 16, 8, "random"},
    {100, 2880, 2880, 16, 8, "zipf:1.2"},       // 2880: neither 128 nor 256 divides it
    {700, 1024, 4096, 64, 2, "hot:0.9"},
    {2048, 1024, 1536, 128, 1, "concentrated"},  // most experts without rows
    {256, 4096, 1024, 16, 8, "balanced"},
};

// Under a sanitizer: the small shapes only (every instance and both row stores still run).
std::vector<Bf16Case> cases() {
  if (test::sanitizer().empty()) return {std::begin(kCases), std::end(kCases)};
  return {kCases[0], kCases[1], kCases[3]};
}

TEST(GemmBf16Gpu, RouteRowsMatchTheReference) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  for (const Bf16Case& c : cases()) {
    run_case(c, Bf16Epilogue::rows, false, seed + 11);
    run_case(c, Bf16Epilogue::rows, true, seed + 12);
  }
}

TEST(GemmBf16Gpu, SiluMulEpilogueMatchesTheReference) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  for (const Bf16Case& c : cases()) run_case(c, Bf16Epilogue::act, false, seed + 13);
}

TEST(GemmBf16Launch, RefusesWhatTheKernelCannotTake) {
  // No GPU needed: the checks run before any launch.
  GemmBf16Params p;
  p.weights = reinterpret_cast<const bf16*>(uintptr_t(256));
  p.x = p.weights;
  p.offsets = reinterpret_cast<const int32_t*>(uintptr_t(256));
  p.out = reinterpret_cast<void*>(uintptr_t(256));
  p.x_rows = 64;
  p.experts = 4;
  p.n = 256;
  p.k = 100;  // not a multiple of 16
  DeviceInfo dev;
  dev.sm_count = 1;
  EXPECT_THROW(launch_gemm_bf16(p, dev, nullptr, false), Error);
  p.k = 128;
  p.epilogue = Bf16Epilogue::act;
  p.inter = 100;  // N != 2 inter
  EXPECT_THROW(launch_gemm_bf16(p, dev, nullptr, false), Error);
  p.epilogue = Bf16Epilogue::rows;
  p.experts = kGpuMaxExperts + 1;
  EXPECT_THROW(launch_gemm_bf16(p, dev, nullptr, false), Error);
  p.experts = 4;
  p.x = reinterpret_cast<const bf16*>(uintptr_t(258));  // misaligned
  EXPECT_THROW(launch_gemm_bf16(p, dev, nullptr, false), Error);
  p.x = p.weights;
  p.out = reinterpret_cast<void*>(uintptr_t(264));  // the TMA store needs 16-byte alignment
  EXPECT_THROW(launch_gemm_bf16(p, dev, nullptr, false), Error);
}

}  // namespace
}  // namespace loom
