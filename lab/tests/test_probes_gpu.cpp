// The design probes (`loom skeleton`, `loom gather-probe`, `loom stream-probe`, `loom warp-probe`)
// run every variant and report figures inside what the hardware allows: a variant whose kernel did
// no work, or failed, shows up as a missing row or an impossible rate.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "probes/gather_probe_sm90.cuh"
#include "probes/mma_skeleton_sm90.cuh"
#include "probes/stream_probe_sm90.cuh"
#include "probes/warp_probe_sm90.cuh"
#include "gpu_test.hpp"

namespace loom::bench {
namespace {

// The last numeric columns of each table row below the two header lines.
std::vector<std::vector<double>> table_numbers(const std::string& table, int columns) {
  std::vector<std::vector<double>> rows;
  std::istringstream in(table);
  std::string line;
  for (int skip = 0; skip < 2 && std::getline(in, line); ++skip) {
  }
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::vector<std::string> w;
    for (std::string x; words >> x;)
      if (x != "%") w.push_back(x);  // "0 %" (a carve-out) is one column
    if (int(w.size()) < columns) continue;
    std::vector<double> values;
    for (int i = int(w.size()) - columns; i < int(w.size()); ++i) {
      std::string v = w[size_t(i)];
      if (!v.empty() && v.back() == '%') v.pop_back();
      values.push_back(std::stod(v));
    }
    rows.push_back(values);
  }
  return rows;
}

TEST(ProbesGpu, SkeletonReportsEveryLoopWithinThePipesRate) {
  LOOM_REQUIRE_GPU();
  std::ostringstream log;
  SkeletonOptions opt;
  opt.kblocks = 256;
  opt.repeats = 1;
  const std::string table = run_skeleton(opt, log);
  const auto rows = table_numbers(table, 3);  // cycles per K block, pipe busy %, us
  ASSERT_EQ(rows.size(), 20u) << table;
  if (!test::sanitizer().empty()) return;  // rates mean nothing instrumented
  for (const auto& r : rows) {
    // At most the pipe's rate (the N/2-cycle MMA estimate leaves a little above 100 %), and every
    // loop does its MMAs: no variant is free (the narrowest, n48 on both warpgroups, takes 192
    // cycles of MMAs per K block).
    EXPECT_GT(r[0], 150.0) << table;
    EXPECT_GT(r[1], 20.0) << table;
    EXPECT_LT(r[1], 110.0) << table;
  }
}

TEST(ProbesGpu, GatherProbeMovesItsBytesAtAPlausibleRate) {
  LOOM_REQUIRE_GPU();
  std::ostringstream log;
  GatherProbeOptions opt;
  opt.tiles_per_cta = 4;
  opt.repeats = 1;
  const std::string table = run_gather_probe(opt, log);
  const auto rows = table_numbers(table, 2);  // us, TB/s
  ASSERT_EQ(rows.size(), 10u) << table;
  if (!test::sanitizer().empty()) return;  // rates mean nothing instrumented
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    EXPECT_GT(r[0], 0.0) << table;
    // From L2 and HBM: well below 20 TB/s, and not a kernel that stalled. The last two rows (one
    // TMA box per 128-byte row) ran at 0.60 TB/s on the H200: the TMA unit's rate for tiny boxes.
    EXPECT_GT(r[1], i >= 8 ? 0.1 : 0.5) << table;
    EXPECT_LT(r[1], 20.0) << table;
  }
}

TEST(ProbesGpu, StreamProbeReadsFromHbmAtAPlausibleRate) {
  LOOM_REQUIRE_GPU();
  // The FP8 GEMMs' geometry (16 KiB stages: the 16- and 24-stage rings do not fit) and the BF16
  // w13's (rows of 6 KiB, 64-row units: every ring fits).
  struct Case {
    int64_t pitch;
    int unit_rows;
    size_t rows;
  };
  for (const Case c : {Case{2048, 128, 24}, Case{6144, 64, 26}}) {
    SCOPED_TRACE("pitch " + std::to_string(c.pitch) + ", units of " + std::to_string(c.unit_rows) + " rows");
    std::ostringstream log;
    StreamProbeOptions opt;
    opt.repeats = 1;
    opt.pitch = c.pitch;
    opt.unit_rows = c.unit_rows;
    const std::string table = run_stream_probe(opt, log);
    const auto rows = table_numbers(table, 3);  // KiB, us, TB/s
    ASSERT_EQ(rows.size(), c.rows) << table;
    if (!test::sanitizer().empty()) continue;  // rates mean nothing instrumented
    for (const auto& r : rows) {
      // Every launch reads its ~256 MiB from HBM (the other copy was read in between): below the
      // H200's 4.8 TB/s, and not a kernel that stalled or skipped its bytes.
      EXPECT_GT(r[1], 30.0) << table;
      EXPECT_GT(r[2], 1.0) << table;
      EXPECT_LT(r[2], 4.9) << table;
    }
  }
  StreamProbeOptions bad;
  bad.pitch = 100;
  std::ostringstream log;
  EXPECT_THROW(run_stream_probe(bad, log), Error);
}

TEST(ProbesGpu, WarpProbeTimesEveryStepAsADependentChain) {
  LOOM_REQUIRE_GPU();
  std::ostringstream log;
  WarpProbeOptions opt;
  opt.repeats = 1;
  const std::string table = run_warp_probe(opt, log);
  const auto rows = table_numbers(table, 2);  // cycles: pass 1, passes 2-8
  ASSERT_EQ(rows.size(), 8u) << table;
  if (!test::sanitizer().empty()) return;  // cycle counts mean nothing instrumented
  for (const auto& r : rows) {
    // A dependent step takes at least an ALU latency (~4 cycles) and none takes microseconds.
    EXPECT_GT(r[1], 3.0) << table;
    EXPECT_LT(r[1], 2000.0) << table;
    EXPECT_GE(r[0], 3.0) << table;
  }
  // The arg-max round holds a reduction and a ballot, so it takes longer than a reduction alone.
  EXPECT_GT(rows[5][1], rows[1][1]) << table;
}

}  // namespace
}  // namespace loom::bench
