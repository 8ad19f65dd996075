// Expert parallelism's local run through the pipeline (moe_pipeline.hpp): a plan for precomputed
// routes whose k exceeds its E (plan_routed), against the same routes on a plan with more experts
// (bitwise in BF16, within tolerance in FP8), and the route rows stage (Stages::route_rows): it
// leaves the output alone, and summing its weighted rows per token in slot order gives the full
// run's output bit for bit. Ids include -1 and repeats; outputs are poisoned first.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "bench/device_buffer.hpp"
#include "common/bf16.hpp"
#include "gpu_test.hpp"
#include "loom/loom.hpp"
#include "pipeline/layer_ref.hpp"
#include "pipeline/moe_pipeline.hpp"
#include "test_seed.hpp"
#include "workload/workload.hpp"

namespace loom {
namespace {

using bench::DeviceBuffer;

TEST(RouteRowsGpu, RoutedPlanWithMoreSlotsThanExperts) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  for (const DType dt : {DType::bf16, DType::fp8}) {
    SCOPED_TRACE(to_string(dt));
    constexpr int64_t T = 24, k = 4;
    const Shape wide{T, 1024, 512, 4, k, Mode::ffn, dt};
    Shape narrow = wide;  // the first 2 of the 4 experts: every id below is 0, 1 or -1
    narrow.experts = 2;
    const LayerWeights w = make_weights(wide, seed, WeightValues::normal);
    std::mt19937_64 rng(seed + 1);
    std::vector<int32_t> ids(size_t(T * k));
    std::vector<float> weights(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      ids[i] = int32_t(rng() % 3) - 1;
      weights[i] = float(rng() % 1000 + 1) / 1000.0f;
    }
    const std::vector<bf16> hidden = make_hidden(wide, seed + 2);
    const bool fp8 = dt == DType::fp8;
    DeviceBuffer w1 = fp8 ? DeviceBuffer::from(w.w1_q) : DeviceBuffer::from(w.w1),
                 w2 = fp8 ? DeviceBuffer::from(w.w2_q) : DeviceBuffer::from(w.w2);
    DeviceBuffer s1 = fp8 ? DeviceBuffer::from(w.w1_scales) : DeviceBuffer(16),
                 s2 = fp8 ? DeviceBuffer::from(w.w2_scales) : DeviceBuffer(16);
    Weights wv;  // the narrow plan reads only its 2 experts at the front of the same arrays
    wv.w1 = w1.get();
    wv.w2 = w2.get();
    wv.w1_scales = fp8 ? s1.as<float>() : nullptr;
    wv.w2_scales = fp8 ? s2.as<float>() : nullptr;
    DeviceBuffer d_ids = DeviceBuffer::from(ids), d_w = DeviceBuffer::from(weights), d_h = DeviceBuffer::from(hidden);
    Inputs in;
    in.tokens = T;
    in.hidden = d_h.get();
    in.topk_ids = d_ids.as<int32_t>();
    in.topk_weights = d_w.as<float>();
    Options o;
    o.deterministic = true;
    const size_t out_bytes = size_t(T * wide.hidden) * 2;
    test::Stream stream;
    auto run_plan = [&](const Plan& p, Stages stages, DeviceBuffer& ws) {
      DeviceBuffer out(out_bytes);
      test::fill(out.get(), 0xff, out.bytes());
      run_stages(p, wv, in, out.get(), ws.get(), stream.get(), stages);
      LOOM_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
      return out.to_host<uint16_t>();
    };
    const Plan pw = plan(wide, Routing{}, o);
    DeviceBuffer ws_w(workspace_bytes(pw));
    const std::vector<uint16_t> want = run_plan(pw, Stages::all, ws_w);
    const Plan pn = plan_routed(narrow, o, current_device());
    DeviceBuffer ws(workspace_bytes(pn));
    const std::vector<uint16_t> got = run_plan(pn, Stages::all, ws);
    if (!fp8) {
      EXPECT_TRUE(got == want) << "the routed plan differs from the wide one";
    } else {
      std::vector<float> g(got.size());
      std::vector<double> r(want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        g[i] = bf16_to_float(bf16{got[i]});
        r[i] = double(bf16_to_float(bf16{want[i]}));
      }
      const ErrorStats e = relative_error(g.data(), r.data(), T, wide.hidden);
      EXPECT_LE(e.overall, 2e-3);
      EXPECT_LE(e.worst_row, 1e-2) << "worst token row " << e.worst_row_index;
    }

    // The route rows alone: the output untouched, and their slot-order sums the full run's bits.
    const std::vector<uint16_t> untouched = run_plan(pn, Stages::route_rows, ws);
    EXPECT_TRUE(std::all_of(untouched.begin(), untouched.end(), [](uint16_t b) { return b == 0xffff; }))
        << "the route rows stage wrote the output";
    std::vector<int32_t> route_row(ids.size());
    LOOM_CUDA_CHECK(cudaMemcpy(route_row.data(), static_cast<uint8_t*>(ws.get()) + pn.layout.route_row,
                               route_row.size() * 4, cudaMemcpyDeviceToHost));
    const auto* y_dev = static_cast<const uint8_t*>(ws.get()) + pn.layout.y;
    std::vector<uint16_t> y(size_t(T * k * wide.hidden));
    LOOM_CUDA_CHECK(cudaMemcpy(y.data(), y_dev, y.size() * 2, cudaMemcpyDeviceToHost));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t n = 0; n < wide.hidden; ++n) {
        float sum = 0.0f;
        for (int64_t j = 0; j < k; ++j) {
          const int32_t row = route_row[size_t(t * k + j)];
          ASSERT_EQ(row < 0, ids[size_t(t * k + j)] < 0) << "token " << t << " slot " << j;
          if (row >= 0) sum += bf16_to_float(bf16{y[size_t(row * wide.hidden + n)]});
        }
        ASSERT_EQ(float_to_bf16(sum).bits, got[size_t(t * wide.hidden + n)]) << "token " << t << " column " << n;
      }

    Inputs logits = in;  // routing from logits needs k <= E: refused
    DeviceBuffer d_l(size_t(T * narrow.experts) * 4);
    logits.topk_ids = nullptr;
    logits.topk_weights = nullptr;
    logits.router_logits = d_l.as<float>();
    DeviceBuffer out(out_bytes);
    EXPECT_THROW(run(pn, wv, logits, out.get(), ws.get(), stream.get()), Error);
  }
}

}  // namespace
}  // namespace loom
