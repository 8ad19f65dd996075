// The measurement harness's host logic: cold-L2 planning, statistics, work accounting, reports.
#include <gtest/gtest.h>

#include "bench/metrics.hpp"
#include "bench/report.hpp"
#include "bench/sol_gemm.hpp"
#include "bench/stats.hpp"
#include "bench/timer.hpp"
#include "common/json.hpp"

namespace loom::bench {
namespace {

TEST(ColdL2Plan, RotatesWhenCopiesReachFourTimesL2) {
  const int64_t l2 = 60 << 20;
  // 256 MiB per run already exceeds 4 x 60 MiB: one copy is a full rotation.
  EXPECT_EQ(plan_cold_l2(256 << 20, l2, 8).mode, L2Mode::rotate);
  EXPECT_EQ(plan_cold_l2(256 << 20, l2, 8).copies, 1);
  // 100 MiB per run needs ceil(240 / 100) = 3 copies.
  EXPECT_EQ(plan_cold_l2(100 << 20, l2, 8).copies, 3);
  // 8 MiB would need 30 copies: flush instead.
  EXPECT_EQ(plan_cold_l2(8 << 20, l2, 8).mode, L2Mode::flush);
  EXPECT_EQ(plan_cold_l2(0, l2, 8).mode, L2Mode::flush);
}

TEST(Stats, MedianAndPercentiles) {
  std::vector<double> v;
  for (int i = 10; i >= 0; --i) v.push_back(double(i));  // 0..10, unsorted
  const Stats s = summarize(v);
  EXPECT_EQ(s.reps, 11);
  EXPECT_DOUBLE_EQ(s.median_us, 5.0);
  EXPECT_DOUBLE_EQ(s.p10_us, 1.0);
  EXPECT_DOUBLE_EQ(s.p90_us, 9.0);
  EXPECT_DOUBLE_EQ(s.min_us, 0.0);
  EXPECT_DOUBLE_EQ(s.mean_us, 5.0);
  EXPECT_FALSE(summarize({}).valid());
}

TEST(Metrics, CompactRowFlopsAndRoutedWeightBytes) {
  Shape s{128, 2048, 512, 256, 8, Mode::single, DType::fp8};
  std::vector<int32_t> counts(256, 0);
  counts[3] = 1000;  // only the number of hit experts matters for bytes
  counts[7] = 24;
  const Work w = layer_work(s, counts, /*from_logits=*/true);
  EXPECT_DOUBLE_EQ(w.flops, 2.0 * 128 * 8 * 512 * 2048);
  EXPECT_EQ(w.experts_hit, 2);
  // codes N*K plus fp32 scales (512/128) x (2048/128)
  EXPECT_EQ(w.weight_bytes, 2 * (512 * 2048 + 4 * 4 * 16));
  EXPECT_EQ(w.activation_bytes, 2 * 128 * 2048 + 4 * 128 * 256 + 4 * 128 * 512);

  Shape f{16, 3072, 1536, 16, 8, Mode::ffn, DType::bf16};
  std::vector<int32_t> all(16, 8);
  const Work wf = layer_work(f, all, /*from_logits=*/false);
  EXPECT_DOUBLE_EQ(wf.flops, 6.0 * 16 * 8 * 3072 * 1536);
  EXPECT_EQ(wf.weight_bytes, 16 * 2 * (2 * 1536 * 3072 + 3072 * 1536));
  EXPECT_EQ(wf.activation_bytes, 2 * 16 * 3072 + 8 * 16 * 8 + 2 * 16 * 3072);
}

// The glue's bytes at the contended shape (H 4096, E 8, k 2, T 4096): logits in, ids and
// weights out, the layout, hidden in, FP8 rows and scales out (per token, or per route when the
// GEMM reads sorted rows).
TEST(Metrics, GlueBytesCountWhatTheGlueMustMove) {
  const Shape s{4096, 4096, 512, 8, 2, Mode::single, DType::fp8};
  const int64_t R = 4096 * 2;
  const int64_t common = 4 * 4096 * 8 + 8 * R + 4 * 9 + 12 * R + 2 * 4096 * 4096;
  EXPECT_EQ(glue_bytes(s, true, false), common + 4096 * 4096 + 4 * 4096 * 32);
  EXPECT_EQ(glue_bytes(s, true, true), common + R * 4096 + 4 * R * 32);
  // From ids: the ids and weights read instead of the logits, none written.
  EXPECT_EQ(glue_bytes(s, false, false), common - 4 * 4096 * 8 + 4096 * 4096 + 4 * 4096 * 32);
  // bf16: the sorted copy is the rows themselves (2 bytes each, no scales); read by token in GEMM
  // 1 instead, the glue moves no activations.
  const Shape b{4096, 4096, 512, 8, 2, Mode::ffn, DType::bf16};
  const int64_t layout_and_routes = common - 2 * 4096 * 4096;
  EXPECT_EQ(glue_bytes(b, true, true), layout_and_routes + 2 * 4096 * 4096 + 2 * R * 4096);
  EXPECT_EQ(glue_bytes(b, true, false), layout_and_routes);
}

TEST(Metrics, SolGemmShapesCarryTheLayerFlops) {
  Shape f{64, 2048, 512, 256, 8, Mode::ffn, DType::fp8};
  const auto g = sol_gemm_shapes(f);
  ASSERT_EQ(g.size(), 2u);
  double flops = 0;
  for (const auto& x : g) flops += 2.0 * double(x.m) * double(x.n) * double(x.k);
  EXPECT_DOUBLE_EQ(flops, 6.0 * 64 * 8 * 2048 * 512);
}

Record sample_record(bool gpu) {
  Record r;
  r.preset = "qwen35-single";
  r.shape = Shape{128, 2048, 512, 256, 8, Mode::single, DType::fp8};
  r.distribution = "random";
  r.commit = "abc";
  r.path = gpu ? "gpu" : "cpu-reference";
  r.work.flops = 2.0 * 128 * 8 * 512 * 2048;
  r.work.experts_hit = 250;
  r.work.weight_bytes = 250 << 20;
  r.work.activation_bytes = 1 << 20;
  if (gpu) {
    Timed t;
    t.name = "e2e";
    t.cold = summarize({80, 81, 82});
    t.warm = summarize({70});
    r.gpu.push_back(t);
    r.sol.measured = true;
    r.sol.read = summarize({70});
    r.sol.gemm = summarize({10});
  } else {
    r.cpu_reference_ms = 1234;
    r.sol.why_not = "no CUDA device";
  }
  return r;
}

TEST(Report, JsonParsesBackWithTheMeasurements) {
  const std::string text = to_json({sample_record(true), sample_record(false)});
  const json::Value doc = json::parse(text);
  ASSERT_EQ(doc.as_array().size(), 2u);
  const json::Value& g = doc.as_array()[0];
  EXPECT_EQ(g.at("shape").at("tokens").as_number(), 128);
  EXPECT_DOUBLE_EQ(g.at("timings").at("e2e").at("cold").at("median_us").as_number(), 81);
  EXPECT_DOUBLE_EQ(g.at("sol").at("floor_us").as_number(), 70);
  EXPECT_EQ(g.at("sol").at("bound").as_string(), "memory");
  EXPECT_NEAR(g.at("derived").at("time_over_floor").as_number(), 81.0 / 70.0, 1e-6);
  const json::Value& c = doc.as_array()[1];
  EXPECT_EQ(c.at("path").as_string(), "cpu-reference");
  EXPECT_TRUE(c.at("timings").as_object().empty());  // a CPU time is never a GPU timing
  EXPECT_FALSE(c.at("sol").at("measured").as_bool());
  EXPECT_FALSE(c.at("derived").has("tflops"));
}

TEST(Report, CsvHasOneRowPerRecordAndMatchingColumns) {
  const std::string csv = to_csv({sample_record(true), sample_record(false)});
  std::vector<size_t> commas;
  size_t start = 0;
  while (start < csv.size()) {
    const size_t nl = csv.find('\n', start);
    const std::string line = csv.substr(start, nl - start);
    commas.push_back(size_t(std::count(line.begin(), line.end(), ',')));
    start = nl + 1;
  }
  ASSERT_EQ(commas.size(), 3u);
  EXPECT_EQ(commas[1], commas[0]);
  EXPECT_EQ(commas[2], commas[0]);
}

TEST(Report, TableLabelsCpuTimeAsNotGpu) {
  const std::string t = to_table({sample_record(false)});
  EXPECT_NE(t.find("CPU ref 1234 ms (not GPU)"), std::string::npos) << t;
}

}  // namespace
}  // namespace loom::bench
