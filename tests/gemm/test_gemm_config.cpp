// The GEMM configuration chooser on the host (no GPU): which activation layout, kernel and tile
// shape each batch gets, and that the choice holds the register-loaded and resident-rows kernels'
// limits.
#include <gtest/gtest.h>

#include <cstdint>

#include "common/device_info.hpp"
#include "gemm/gemm_fp8.hpp"

namespace loom {
namespace {

DeviceInfo h200_like() {
  DeviceInfo d;
  d.name = "test device";
  d.major = 9;
  d.sm_count = 132;
  d.l2_bytes = int64_t(60) << 20;
  d.global_bytes = int64_t(140) << 30;
  d.smem_per_block_optin = 227 * 1024;
  return d;
}

// Preset shape (E = 256, k = 8, K = 2048): rows per expert = T / 32.
TEST(GemmFp8Config, TokenFragmentRangesAndWideTiles) {
  struct Case {
    int64_t tokens;
    bool fragments, wide;
  };
  for (const Case& c : {Case{32, false, false},     // gathered by token
                        Case{959, false, false},    // 29.97 rows: sorted
                        Case{960, true, true},      // 30 rows: wide tiles from here
                        Case{1279, true, true},     // 39.97 rows
                        Case{1280, true, false},    // 40 rows: 128 x 128 tiles from here
                        Case{1663, true, false},
                        Case{1664, true, false},    // 52 rows: also where K rules out wide tiles
                        Case{2048, true, false},
                        Case{8192, true, false}}) {
    SCOPED_TRACE(testing::Message() << "T=" << c.tokens);
    EXPECT_EQ(use_token_fragments(c.tokens, 8, 256, 2048), c.fragments);
    const GemmFp8Config cfg = choose_gemm_fp8_config(c.tokens, 8, 256, 512, 2048, false, h200_like());
    EXPECT_EQ(cfg.x_source == XSource::token_fragments, c.fragments) << cfg.str();
    EXPECT_EQ(cfg.wide_tiles, c.wide) << cfg.str();
  }
}

// Routes in expert bins (from logits, fast combine): batches above kGatherMaxTokens gather by token
// while experts have at most kGatherBinsMaxRowsPerExpert rows (24 on the preset: T = 768), with no
// split-K (the chunk walk takes none), and in the resident-rows kernel where nearly every expert has
// rows (ResidentRowsFromExpertBins); otherwise the choice is the one without bins.
TEST(GemmFp8Config, GatheringFromExpertBins) {
  // 165 and 222 of 256 experts hit: the gathering kernel's chunk walk.
  for (const int64_t t : {int64_t(33), int64_t(64)}) {
    const GemmFp8Config c = choose_gemm_fp8_config(t, 8, 256, 512, 2048, false, h200_like(), true, true);
    EXPECT_EQ(c.x_source, XSource::gather_by_token) << t;
    EXPECT_FALSE(c.resident_rows) << t;
    EXPECT_EQ(c.split_k, 1) << t;
    EXPECT_FALSE(c.dynamic) << t;
    EXPECT_FALSE(c.handoff_epilogue) << t;
  }
  for (const int64_t t : {int64_t(33), int64_t(128), int64_t(512), int64_t(767)}) {
    EXPECT_EQ(choose_gemm_fp8_config(t, 8, 256, 512, 2048, false, h200_like()).x_source, XSource::sorted_rows) << t;
    // The deterministic combine takes no bins; the experiment options keep to their kernels.
    EXPECT_EQ(choose_gemm_fp8_config(t, 8, 256, 512, 2048, true, h200_like(), true, true).x_source,
              XSource::sorted_rows) << t;
    EXPECT_EQ(choose_gemm_fp8_config(t, 8, 256, 512, 2048, false, h200_like(), false, true).x_source,
              XSource::sorted_rows) << t;
  }
  EXPECT_EQ(choose_gemm_fp8_config(2048, 8, 256, 512, 2048, false, h200_like(), true, true).x_source,
            XSource::token_fragments);
  // With bins the register-loaded kernel's wide tiles start at kWideTilesFromBinsRowsPerExpert (24
  // rows: T = 768) where the resident rows leave off (above 32 rows: T = 1025), without them at
  // kWideTilesRowsPerExpert[0] (30: T = 960).
  const GemmFp8Config wide_from_bins = choose_gemm_fp8_config(1025, 8, 256, 512, 2048, false, h200_like(), true, true);
  EXPECT_EQ(wide_from_bins.x_source, XSource::token_fragments);
  EXPECT_TRUE(wide_from_bins.wide_tiles);
  EXPECT_EQ(choose_gemm_fp8_config(768, 8, 256, 512, 2048, false, h200_like()).x_source, XSource::sorted_rows);
  EXPECT_TRUE(use_token_fragments(768, 8, 256, 2048, true));
  EXPECT_FALSE(use_token_fragments(768, 8, 256, 2048));
  EXPECT_TRUE(use_token_fragments(960, 8, 256, 2048));
  // Where K rules out wide tiles (not a multiple of 256), above the resident rows' range: sorted rows.
  EXPECT_EQ(choose_gemm_fp8_config(1056, 8, 256, 512, 1152, false, h200_like(), true, true).x_source,
            XSource::sorted_rows);
  // Few units (8 experts x 4 weight blocks): no split-K from bins, split-K without them.
  EXPECT_EQ(choose_gemm_fp8_config(40, 2, 8, 512, 2048, false, h200_like(), true, true).split_k, 1);
  EXPECT_GT(choose_gemm_fp8_config(40, 2, 8, 512, 2048, false, h200_like()).split_k, 1);
}

// The resident-rows kernel: from expert bins, with nearly every expert hit, up to 32 rows per
// expert, where its shared memory holds 1.5x the mean rows over all of K.
TEST(GemmFp8Config, ResidentRowsFromExpertBins) {
  EXPECT_EQ(resident_rows_capacity(512, 2048), 48);
  EXPECT_EQ(resident_rows_capacity(512, 7168), 0);   // 16 rows of 7168 codes do not fit beside the ring
  EXPECT_EQ(resident_rows_capacity(8192, 2048), 0);  // 64 x 16 weight scales a unit: more than its record holds
  EXPECT_EQ(resident_rows_capacity(512, 2000), 0);   // partial K blocks
  for (const int64_t t : {int64_t(128), int64_t(512), int64_t(767), int64_t(1024)}) {
    const GemmFp8Config c = choose_gemm_fp8_config(t, 8, 256, 512, 2048, false, h200_like(), true, true);
    EXPECT_TRUE(c.resident_rows) << t;
    EXPECT_EQ(c.x_source, XSource::gather_by_token) << t;
    EXPECT_TRUE(c.dynamic) << t;
    EXPECT_EQ(c.split_k, 1) << t;
    EXPECT_FALSE(c.balanced || c.handoff_epilogue || c.wide_tiles) << t;
    EXPECT_FALSE(choose_gemm_fp8_config(t, 8, 256, 512, 2048, false, h200_like()).resident_rows) << t;  // no bins
    EXPECT_FALSE(choose_gemm_fp8_config(t, 8, 256, 512, 2048, true, h200_like(), true, true).resident_rows) << t;
    EXPECT_FALSE(choose_gemm_fp8_config(t, 8, 256, 512, 2048, false, h200_like(), false, true).resident_rows) << t;
    EXPECT_FALSE(choose_gemm_fp8_config(t, 8, 256, 512, 7168, false, h200_like(), true, true).resident_rows) << t;
  }
  for (const int64_t t : {int64_t(64), int64_t(1025), int64_t(2048)})
    EXPECT_FALSE(choose_gemm_fp8_config(t, 8, 256, 512, 2048, false, h200_like(), true, true).resident_rows) << t;
}

// The register-loaded GEMM's L2 priorities once the weight stream outgrows half of L2: activation
// rows evict-last; weights evict-first while an expert's rows fit about one and a half 128-row tiles.
TEST(GemmFp8Config, TokenFragmentEvictionPriorities) {
  for (const int64_t t : {int64_t(1024), int64_t(2048), int64_t(4096), int64_t(6144)}) {
    const GemmFp8Config c = choose_gemm_fp8_config(t, 8, 256, 512, 2048, false, h200_like());
    EXPECT_TRUE(c.weights_evict_first) << t;
    EXPECT_TRUE(c.x_evict_last) << t;
  }
  for (const int64_t t : {int64_t(6145), int64_t(8192)}) {
    const GemmFp8Config c = choose_gemm_fp8_config(t, 8, 256, 512, 2048, false, h200_like());
    EXPECT_FALSE(c.weights_evict_first) << t;
    EXPECT_TRUE(c.x_evict_last) << t;
  }
  // 16 experts of 512 x 2048, 64 rows each: 16 MiB of weights, under half of L2.
  const GemmFp8Config small = choose_gemm_fp8_config(1024, 1, 16, 512, 2048, false, h200_like());
  EXPECT_EQ(small.x_source, XSource::token_fragments);
  EXPECT_FALSE(small.weights_evict_first);
  EXPECT_FALSE(small.x_evict_last);
  // Sorted rows never take the register-loaded kernel's activation hint.
  EXPECT_FALSE(choose_gemm_fp8_config(512, 8, 256, 512, 2048, false, h200_like()).x_evict_last);
}

TEST(GemmFp8Config, TokenFragmentsHoldTheKernelsKLimits) {
  // K below the register ring (3 blocks), not a multiple of 128, or above the weight-scale table:
  // never the register-loaded kernel.
  for (const int64_t k : {int64_t(256), int64_t(2000), int64_t(kRegsMaxK + 128)})
    for (const int64_t t : {int64_t(1536), int64_t(8192)}) EXPECT_FALSE(use_token_fragments(t, 8, 256, k)) << k;
  // An odd number of K blocks: 128 x 128 tiles (their ring rotates), never wide ones, so sorted rows
  // below their range.
  EXPECT_TRUE(use_token_fragments(8192, 8, 256, 1152));
  EXPECT_TRUE(use_token_fragments(1664, 8, 256, 1152));
  EXPECT_FALSE(use_token_fragments(1536, 8, 256, 1152));
  EXPECT_FALSE(choose_gemm_fp8_config(1536, 8, 256, 512, 1152, false, h200_like()).wide_tiles);
  // Options of the other kernels keep to them.
  EXPECT_NE(choose_gemm_fp8_config(8192, 8, 256, 512, 2048, false, h200_like(), /*allow_token_fragments=*/false).x_source,
            XSource::token_fragments);
}

TEST(GemmFp8Config, StageCountIsTheInstantiations) {
  // Every chosen config names the pipeline depth of the kernel that runs it (the launcher refuses
  // any other): 8 in the gathering kernels, 6 or 4 (hand-off) with sorted rows.
  for (const int64_t t : {int64_t(1), int64_t(8), int64_t(32), int64_t(128), int64_t(512), int64_t(2048)})
    for (const bool deterministic : {false, true})
      for (const bool bins : {false, true}) {
        const GemmFp8Config c = choose_gemm_fp8_config(t, 8, 256, 512, 2048, deterministic, h200_like(),
                                                       /*allow_token_fragments=*/false, bins);
        EXPECT_EQ(c.stages, pipeline_stages(c)) << t << " " << c.str();
        if (c.x_source == XSource::gather_by_token) {
          EXPECT_EQ(c.stages, 8) << t;
        }
        if (c.handoff_epilogue) {
          EXPECT_EQ(c.stages, 4) << t;
        }
      }
  // The default config (gathered rows) is consistent as it stands.
  GemmFp8Config d;
  EXPECT_EQ(d.stages, pipeline_stages(d));
}

}  // namespace
}  // namespace loom
