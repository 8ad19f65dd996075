// The GEMM configs and their chooser on the host (no GPU): which kernel family, activation layout
// and tile shape each batch gets, that the choice holds the kernels' limits, and that every config
// round-trips through its printable key.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <variant>

#include "common/device_info.hpp"
#include "gemm/gemm_fp8.hpp"
#include "gemm/select/choose.hpp"
#include "gemm/select/config.hpp"

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

GemmConfig choose(int64_t tokens, int64_t topk, int64_t experts, int64_t n, int64_t k, bool deterministic,
                  bool routes_in_bins = false, bool allow_tokens_on_m = true) {
  GemmProblem p;
  p.tokens = tokens;
  p.topk = topk;
  p.experts = experts;
  p.n = n;
  p.k = k;
  p.deterministic = deterministic;
  p.routes_in_bins = routes_in_bins;
  p.allow_tokens_on_m = allow_tokens_on_m;
  return choose_gemm_config(p, h200_like());
}
// The preset's shape (E = 256, k = 8, N = 512, K = 2048): rows per expert = T / 32.
GemmConfig preset(int64_t tokens, bool bins = false, bool deterministic = false) {
  return choose(tokens, 8, 256, 512, 2048, deterministic, bins);
}
const TokensOnMConfig* tm(const GemmConfig& c) { return std::get_if<TokensOnMConfig>(&c); }
const WeightsOnMConfig* wm(const GemmConfig& c) { return std::get_if<WeightsOnMConfig>(&c); }
bool resident(const GemmConfig& c) { return std::holds_alternative<ResidentConfig>(c); }

TEST(GemmConfig, TokenFragmentRangesAndWideTiles) {
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
    const GemmConfig cfg = preset(c.tokens);
    ASSERT_EQ(tm(cfg) != nullptr, c.fragments) << key(cfg);
    if (c.fragments) {
      EXPECT_EQ(tm(cfg)->wide, c.wide) << key(cfg);
    }
    EXPECT_EQ(x_source(cfg) == XSource::token_fragments, c.fragments);
  }
}

// Routes in expert bins (from logits, fast combine): batches above kGatherMaxTokens gather by token
// from the bins while experts have at most kGatherBinsMaxRowsPerExpert rows (24 on the preset: T =
// 768), with no split-K (the chunk walk takes none), and in the resident-rows kernel where nearly
// every expert has rows; otherwise the choice is the one without bins.
TEST(GemmConfig, GatheringFromExpertBins) {
  // 165 and 222 of 256 experts hit: the gathering kernel's chunk walk (balanced shares: few hits).
  for (const int64_t t : {int64_t(33), int64_t(64)}) {
    const GemmConfig c = preset(t, true);
    ASSERT_TRUE(wm(c)) << t << " " << key(c);
    EXPECT_EQ(wm(c)->rows, WmRows::bins) << t;
    EXPECT_EQ(x_source(c), XSource::gather_by_token) << t;
    EXPECT_EQ(wm(c)->split_k, 1) << t;
    EXPECT_FALSE(wm(c)->dynamic || wm(c)->handoff || wm(c)->dense) << t;
    EXPECT_TRUE(wm(c)->balanced) << t;
  }
  for (const int64_t t : {int64_t(33), int64_t(128), int64_t(512), int64_t(767)}) {
    EXPECT_EQ(x_source(preset(t)), XSource::sorted_rows) << t;
    // The deterministic combine takes no bins; keeping to weights on M, sorted rows too.
    EXPECT_EQ(x_source(preset(t, true, true)), XSource::sorted_rows) << t;
    EXPECT_EQ(x_source(choose(t, 8, 256, 512, 2048, false, true, false)), XSource::sorted_rows) << t;
  }
  EXPECT_TRUE(tm(preset(2048, true)));
  // With bins the tokens-on-M kernel's wide tiles start at kWideTilesFromBinsRowsPerExpert (24
  // rows: T = 768) where the resident rows leave off (above 32 rows: T = 1025), without them at
  // kWideTilesRowsPerExpert[0] (30: T = 960).
  const GemmConfig wide_from_bins = preset(1025, true);
  ASSERT_TRUE(tm(wide_from_bins));
  EXPECT_TRUE(tm(wide_from_bins)->wide);
  EXPECT_EQ(x_source(preset(768)), XSource::sorted_rows);
  EXPECT_TRUE(use_token_fragments(768, 8, 256, 2048, true));
  EXPECT_FALSE(use_token_fragments(768, 8, 256, 2048));
  EXPECT_TRUE(use_token_fragments(960, 8, 256, 2048));
  // Where K rules out wide tiles (not a multiple of 256), above the resident rows' range: sorted rows.
  EXPECT_EQ(x_source(choose(1056, 8, 256, 512, 1152, false, true)), XSource::sorted_rows);
  // Few units (8 experts x 4 weight blocks): no split-K from bins (the resident rows here), split-K
  // without them.
  EXPECT_TRUE(resident(choose(40, 2, 8, 512, 2048, false, true)));
  ASSERT_TRUE(wm(choose(40, 2, 8, 512, 2048, false)));
  EXPECT_GT(wm(choose(40, 2, 8, 512, 2048, false))->split_k, 1);
}

// The resident-rows kernel: from expert bins, with nearly every expert hit, up to 32 rows per
// expert, where its shared memory holds 1.5x the mean rows over all of K.
TEST(GemmConfig, ResidentRowsFromExpertBins) {
  EXPECT_EQ(resident_rows_capacity(512, 2048), 48);
  EXPECT_EQ(resident_rows_capacity(512, 7168), 0);   // 16 rows of 7168 codes do not fit beside the ring
  EXPECT_EQ(resident_rows_capacity(8192, 2048), 0);  // 64 x 16 weight scales a unit: more than its record holds
  EXPECT_EQ(resident_rows_capacity(512, 2000), 0);   // partial K blocks
  for (const int64_t t : {int64_t(128), int64_t(512), int64_t(767), int64_t(1024)}) {
    const GemmConfig c = preset(t, true);
    ASSERT_TRUE(resident(c)) << t << " " << key(c);
    EXPECT_EQ(x_source(c), XSource::gather_by_token) << t;
    EXPECT_TRUE(std::get<ResidentConfig>(c).dynamic) << t;
    EXPECT_FALSE(resident(preset(t))) << t;              // no bins
    EXPECT_FALSE(resident(preset(t, true, true))) << t;  // deterministic
    EXPECT_FALSE(resident(choose(t, 8, 256, 512, 2048, false, true, false))) << t;
    EXPECT_FALSE(resident(choose(t, 8, 256, 512, 7168, false, true))) << t;
  }
  for (const int64_t t : {int64_t(64), int64_t(1025), int64_t(2048)}) EXPECT_FALSE(resident(preset(t, true))) << t;
}

// The tokens-on-M kernel's L2 priorities once the weight stream outgrows half of L2: activation
// rows evict-last; weights evict-first while an expert's rows fit about one and a half 128-row tiles.
TEST(GemmConfig, TokenFragmentEvictionPriorities) {
  for (const int64_t t : {int64_t(1024), int64_t(2048), int64_t(4096), int64_t(6144)}) {
    const GemmConfig c = preset(t);
    ASSERT_TRUE(tm(c)) << t;
    EXPECT_TRUE(tm(c)->weights_evict_first) << t;
    EXPECT_TRUE(tm(c)->x_evict_last) << t;
  }
  for (const int64_t t : {int64_t(6145), int64_t(8192)}) {
    const GemmConfig c = preset(t);
    ASSERT_TRUE(tm(c)) << t;
    EXPECT_FALSE(tm(c)->weights_evict_first) << t;
    EXPECT_TRUE(tm(c)->x_evict_last) << t;
  }
  // 16 experts of 512 x 2048, 64 rows each: 16 MiB of weights, under half of L2.
  const GemmConfig small = choose(1024, 1, 16, 512, 2048, false);
  ASSERT_TRUE(tm(small));
  EXPECT_FALSE(tm(small)->weights_evict_first);
  EXPECT_FALSE(tm(small)->x_evict_last);
}

TEST(GemmConfig, TokenFragmentsHoldTheKernelsKLimits) {
  // K below the activation ring (3 blocks), not a multiple of 128, or above the weight-scale table:
  // never the tokens-on-M kernels.
  for (const int64_t k : {int64_t(256), int64_t(2000), int64_t(kRegsMaxK + 128)})
    for (const int64_t t : {int64_t(1536), int64_t(8192)}) EXPECT_FALSE(use_token_fragments(t, 8, 256, k)) << k;
  // An odd number of K blocks: 128 x 128 tiles (their ring rotates), never wide ones, so sorted rows
  // below their range.
  EXPECT_TRUE(use_token_fragments(8192, 8, 256, 1152));
  EXPECT_TRUE(use_token_fragments(1664, 8, 256, 1152));
  EXPECT_FALSE(use_token_fragments(1536, 8, 256, 1152));
  EXPECT_FALSE(tm(choose(1536, 8, 256, 512, 1152, false)));
  // Keeping to weights on M.
  EXPECT_FALSE(tm(choose(8192, 8, 256, 512, 2048, false, false, false)));
}

TEST(GemmConfig, StagesAndCombineFollowTheChoice) {
  // Every weights-on-M config names the ring of the instance that runs it: 8 gathering, 6 or 4
  // (hand-off) with sorted rows; the deterministic combine stores rows, the fast one reduces.
  for (const int64_t t : {int64_t(1), int64_t(8), int64_t(32), int64_t(128), int64_t(512), int64_t(2048)})
    for (const bool deterministic : {false, true})
      for (const bool bins : {false, true}) {
        const GemmConfig c = choose(t, 8, 256, 512, 2048, deterministic, bins, false);
        ASSERT_TRUE(wm(c)) << t;
        EXPECT_EQ(combine_stores_rows(c), deterministic) << key(c);
        if (wm(c)->rows != WmRows::sorted) {
          EXPECT_EQ(wm(c)->stages(), kStagesGathered) << key(c);
        }
        if (wm(c)->handoff) {
          EXPECT_EQ(wm(c)->stages(), kStagesHandoff) << key(c);
          EXPECT_EQ(scale_layout(c), ScaleLayout::row_quads) << key(c);
        }
      }
  EXPECT_EQ(WeightsOnMConfig{}.stages(), kStagesGathered);
}

// Every config the chooser makes over a sweep of shapes and batches reads back from its key as
// itself, and the key names what it is.
TEST(GemmConfig, KeysRoundTrip) {
  int checked = 0;
  for (const int64_t experts : {int64_t(8), int64_t(64), int64_t(256), int64_t(512)})
    for (const int64_t k : {int64_t(1152), int64_t(2048), int64_t(7168)})
      for (const int64_t t : {int64_t(1), int64_t(5), int64_t(32), int64_t(33), int64_t(200), int64_t(1000),
                              int64_t(2048), int64_t(8192), int64_t(65536)})
        for (const bool det : {false, true})
          for (const bool bins : {false, true}) {
            const GemmConfig c = choose(t, 8, experts, 512, k, det, bins);
            const std::string text = key(c);
            SCOPED_TRACE(text);
            const GemmConfig back = parse_gemm_key(text);
            EXPECT_EQ(key(back), text);
            EXPECT_EQ(back.index(), c.index());
            EXPECT_EQ(describe(back), describe(c));
            EXPECT_NO_THROW(validate(c));
            ++checked;
          }
  EXPECT_GT(checked, 400);
  EXPECT_EQ(key(preset(1)), "wM.gather.s8.red.compact.k4.warm");  // 8 experts x 4 blocks: 4 x 32 <= 132 SMs
  EXPECT_EQ(key(preset(8192)), "tM.tall.s4.bulk.dyn.exl");
  EXPECT_EQ(key(preset(512, true)), "wM.res.s5.bulk.dyn.efw");
  EXPECT_EQ(key(preset(512)), "wM.sorted.s6.red.dense.dyn.efw");
  // The ffn intermediate's tokens-on-M instances (A by sorted row).
  for (const char* text : {"tM.tall.sorted.s4.bulk.dyn.exl", "tM.wide.sorted.s4.store.rr"}) {
    const GemmConfig c = parse_gemm_key(text);
    EXPECT_EQ(key(c), text);
    EXPECT_EQ(x_source(c), XSource::sorted_fragments);
    EXPECT_EQ(scale_layout(c), ScaleLayout::row_quads);
    EXPECT_NE(describe(c).find("expert-sorted rows"), std::string::npos) << describe(c);
  }
}

TEST(GemmConfig, BadKeysAreRejectedWithTheReason) {
  struct Case {
    const char* key;
    const char* says;
  };
  for (const Case& c : {Case{"", "unknown family"}, Case{"xM.gather", "unknown family"},
                        Case{"wM.gather.s6.red.dense", "8 stages"}, Case{"wM.gather.s8.red", "ends early"},
                        Case{"wM.gather.s8.red.dense.bogus", "unknown option 'bogus'"},
                        Case{"wM.gather.s8.ho.red.dense", "hand-off"}, Case{"wM.gather.s8.red.dense.dyn", "dynamic"},
                        Case{"wM.sorted.s6.store.dense.bal", "red combine"}, Case{"wM.bins.s8.red.dense", "compact"},
                        Case{"wM.res.s4.bulk.dyn", "5 stages"}, Case{"tM.huge.s4.bulk.dyn", "tall or wide"},
                        Case{"tM.tall.s4.red.dyn", "bulk, store or act"}, Case{"tM.tall.s4.act.dyn", "wide tiles"}, Case{"wM.gather.s8.red.compact.k3.bal", "two walks"}}) {
    SCOPED_TRACE(c.key);
    try {
      (void)parse_gemm_key(c.key);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << e.what();
    }
  }
}

TEST(GemmConfig, ShapeChecksNameTheKernelsLimits) {
  EXPECT_NO_THROW(check_shape(parse_gemm_key("tM.tall.s4.bulk.dyn"), 512, 2048, 256, 8192));
  EXPECT_THROW(check_shape(parse_gemm_key("tM.tall.s4.bulk.dyn"), 512, 2000, 256, 8192), Error);   // K % 128
  EXPECT_THROW(check_shape(parse_gemm_key("tM.wide.s4.bulk.dyn"), 512, 1152, 256, 8192), Error);   // K % 256
  EXPECT_THROW(check_shape(parse_gemm_key("tM.tall.s4.bulk.dyn"), 512, 256, 256, 8192), Error);    // K < the ring
  EXPECT_THROW(check_shape(parse_gemm_key("wM.res.s5.bulk.dyn"), 512, 7168, 256, 8192), Error);    // no room
  EXPECT_THROW(check_shape(parse_gemm_key("wM.gather.s8.red.dense"), 520, 2040, 256, 32), Error);  // K % 16
  EXPECT_NO_THROW(check_shape(parse_gemm_key("wM.gather.s8.red.dense"), 528, 2064, 256, 32));
}

}  // namespace
}  // namespace loom
