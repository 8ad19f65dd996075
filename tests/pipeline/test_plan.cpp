// Plans made for a described device, without a GPU: what every batch size would launch (the
// buckets), that they cover every batch, hold together with the workspace, and that an override
// config is taken where it can run and rejected with the reason where it cannot.
#include <gtest/gtest.h>

#include <string>
#include <variant>

#include "gemm/select/config.hpp"
#include "loom/loom.hpp"
#include "pipeline/moe_pipeline.hpp"
#include "pipeline/plan_buckets.hpp"
#include "workload/workload.hpp"

namespace loom {
namespace {

Shape preset_shape(int64_t tokens) {
  Shape s = find_preset("qwen35-single").shape;
  s.tokens = tokens;
  return s;
}

// Every batch 1..T falls in exactly one bucket, in order, and every bucket's launches hold
// together: a config that parses back from its key, an activation layout the workspace holds.
void check_plan(const Plan& p) {
  ASSERT_TRUE(p.buckets);
  const auto& buckets = p.buckets->buckets;
  ASSERT_FALSE(buckets.empty());
  EXPECT_EQ(buckets.front().first, 1);
  EXPECT_EQ(buckets.back().last, p.shape.tokens);
  for (size_t i = 0; i < buckets.size(); ++i) {
    const auto& b = buckets[i];
    EXPECT_LE(b.first, b.last);
    if (i > 0) {
      EXPECT_EQ(b.first, buckets[i - 1].last + 1);
    }
    for (const bool logits : {true, false}) {
      const Launches& l = logits ? b.from_logits : b.from_ids;
      if (!l.error.empty()) continue;
      SCOPED_TRACE(testing::Message() << "T=" << b.first << ".." << b.last << (logits ? " logits " : " ids ")
                                      << l.summary(logits));
      EXPECT_EQ(key(parse_gemm_key(key(l.gemm))), key(l.gemm));
      EXPECT_EQ(l.ffn, p.shape.mode == Mode::ffn);
      if (l.ffn) {  // GEMM 1 stores each sorted row (or, fast only, reduces split K into them);
                    // GEMM 2 reads the intermediate's sorted rows
        EXPECT_TRUE(combine_stores_rows(l.gemm) || fused_act(l.gemm) || !p.options.deterministic);
        EXPECT_FALSE(l.chain.expert_bins);
        EXPECT_EQ(key(parse_gemm_key(key(l.gemm2))), key(l.gemm2));
        EXPECT_EQ(combine_stores_rows(l.gemm2), p.options.deterministic);
        EXPECT_TRUE(x_source(l.gemm2) == XSource::sorted_rows || x_source(l.gemm2) == XSource::sorted_fragments);
        EXPECT_EQ(l.combine_rows, p.options.deterministic);
      } else {
        EXPECT_EQ(combine_stores_rows(l.gemm), p.options.deterministic);
      }
      EXPECT_EQ(l.chain.sorted_rows, x_source(l.gemm) == XSource::sorted_rows);
      if (l.chain.sorted_rows) {
        EXPECT_GE(p.layout.x_rows, padded_rows(b.last * p.shape.topk));
      }
      EXPECT_GE(p.layout.x_rows, padded_rows(b.last));
      if (l.chain.expert_bins) {
        EXPECT_GE(p.layout.bin_stride, b.last);
      }
      EXPECT_TRUE(logits || !l.chain.expert_bins);  // bins are filled by the routing kernel
      // The lookup finds this bucket at both ends.
      EXPECT_EQ(&launches_for(p, b.first, logits), &l);
      EXPECT_EQ(&launches_for(p, b.last, logits), &l);
    }
  }
}

TEST(Plan, DescribedDevicesPlanEveryBatchWithoutAGpu) {
  for (const char* device : {"h200", "h100"}) {
    const DeviceSpec d = device_spec(device);
    EXPECT_EQ(d.sm_count, 132);
    for (const int64_t tokens : {int64_t(1), int64_t(128), int64_t(8192), int64_t(65536)}) {
      SCOPED_TRACE(testing::Message() << device << " T=" << tokens);
      const Plan p = plan(preset_shape(tokens), find_preset("qwen35-single").routing, Options{}, d);
      check_plan(p);
      // Default options: every batch runs from logits and from ids.
      for (const auto& b : p.buckets->buckets) {
        EXPECT_EQ(b.from_logits.error, "");
        EXPECT_EQ(b.from_ids.error, "");
      }
      EXPECT_NE(describe(p).find("launches by token count"), std::string::npos);
    }
  }
  EXPECT_THROW(device_spec("a100"), Error);
}

// ffn: every batch of the qwen35-layer shape (and others) plans on a described H200, both
// combines, with the workspace for GEMM 1's rows, the intermediate and the accumulator; an I the
// GPU path cannot tile is rejected with the reason.
TEST(Plan, FfnLayerPlansEveryBatch) {
  const DeviceSpec d = device_spec("h200");
  const Preset& layer = find_preset("qwen35-layer");
  for (const int64_t tokens : {int64_t(1), int64_t(128), int64_t(8192), int64_t(65536)})
    for (const bool deterministic : {false, true}) {
      SCOPED_TRACE(testing::Message() << "T=" << tokens << (deterministic ? " deterministic" : " fast"));
      Shape s = layer.shape;
      s.tokens = tokens;
      Options o;
      o.deterministic = deterministic;
      const Plan p = plan(s, layer.routing, o, d);
      check_plan(p);
      for (const auto& b : p.buckets->buckets) {
        EXPECT_EQ(b.from_logits.error, "");
        EXPECT_EQ(b.from_ids.error, "");
      }
      const int64_t Rp = padded_rows(s.routes());
      EXPECT_GE(p.layout.act - p.layout.h, size_t(Rp * 2 * s.inter * 4));
      EXPECT_GE(p.layout.act_scales - p.layout.act, size_t(Rp * s.inter));
      EXPECT_GE(p.layout.total - p.layout.acc, deterministic ? size_t(0) : size_t(tokens * s.hidden * 4));
      EXPECT_NE(describe(p).find("gemm2 wM.sorted"), std::string::npos) << describe(p);
      if (tokens >= 8192) {  // prefill: GEMM 2 on token tiles over the intermediate's sorted rows
        EXPECT_NE(describe(p).find(".sorted.s4."), std::string::npos) << describe(p);
      }
    }
  // GEMM 1 at T=1 has 8 experts x 8 row blocks, fewer units than SMs: the fast plan splits K as the
  // single-mode chooser does (partial sums reduced into h); the deterministic one stores rows.
  for (const bool deterministic : {false, true}) {
    Shape s = layer.shape;
    s.tokens = 1;
    Options o;
    o.deterministic = deterministic;
    const Plan p = plan(s, layer.routing, o, d);
    const auto* wm = std::get_if<WeightsOnMConfig>(&launches_for(p, 1, true).gemm);
    ASSERT_NE(wm, nullptr);
    EXPECT_EQ(wm->store, deterministic);
    EXPECT_EQ(wm->split_k > 1, !deterministic) << key(launches_for(p, 1, true).gemm);
  }
  Shape wide = layer.shape;
  wide.hidden = 7168;
  wide.inter = 1536;
  wide.experts = 512;
  wide.topk = 16;
  for (const int64_t tokens : {int64_t(1), int64_t(65536)}) {
    wide.tokens = tokens;
    const Plan p = plan(wide, layer.routing, Options{}, d);
    check_plan(p);
    for (const auto& b : p.buckets->buckets) {
      EXPECT_EQ(b.from_logits.error, "") << "T=" << b.first;
      EXPECT_EQ(b.from_ids.error, "") << "T=" << b.first;
    }
  }
  // I a multiple of 16 but not of 128: gate and up rows in blocks of their own (GEMM 1's weight
  // segments); GEMM 2 (K = I) on weights-on-M sorted rows at every batch (token tiles take K a
  // multiple of 128).
  for (const int64_t inter : {int64_t(192), int64_t(320), int64_t(16)}) {
    Shape odd = layer.shape;
    odd.inter = inter;
    odd.tokens = 65536;
    const Plan p = plan(odd, layer.routing, Options{}, d);
    check_plan(p);
    for (const auto& b : p.buckets->buckets) {
      EXPECT_EQ(b.from_logits.error, "") << "I=" << inter << " T=" << b.first;
      EXPECT_EQ(b.from_ids.error, "") << "I=" << inter << " T=" << b.first;
      EXPECT_TRUE(std::holds_alternative<WeightsOnMConfig>(b.from_logits.gemm2)) << key(b.from_logits.gemm2);
    }
  }
}

// Options::gemm2_config: ffn GEMM 2 on the key at every batch; a key that does not read the
// intermediate's sorted rows, or whose combine is not the plan's, or any key in single mode, is
// rejected by plan() with the reason.
// dtype bf16: the ffn layer plans every batch (route, dispatch, the gather, the two BF16 GEMMs, the
// combine) with the workspace for the bf16 rows, the bf16 intermediate and the bf16 route rows; the
// one-GEMM mode and FP8 config overrides are refused with the reason.
TEST(Plan, Bf16LayerPlansEveryBatch) {
  const DeviceSpec d = device_spec("h200");
  const Preset& preset = find_preset("h200-bf16");
  for (const int64_t tokens : {int64_t(1), int64_t(2048), int64_t(32768)})
    for (const bool deterministic : {false, true}) {
      SCOPED_TRACE(testing::Message() << "T=" << tokens << (deterministic ? " deterministic" : " fast"));
      Shape s = preset.shape;
      s.tokens = tokens;
      Options o;
      o.deterministic = deterministic;
      const Plan p = plan(s, preset.routing, o, d);
      EXPECT_EQ(p.gemm_config, "bf16.tM.128x256");
      const auto& buckets = p.buckets->buckets;
      EXPECT_EQ(buckets.front().first, 1);
      EXPECT_EQ(buckets.back().last, tokens);
      for (const auto& b : buckets)
        for (const bool logits : {true, false}) {
          const Launches& l = logits ? b.from_logits : b.from_ids;
          EXPECT_EQ(l.error, "");
          EXPECT_TRUE(l.bf16 && l.ffn && l.combine_rows && l.chain.sorted_rows);
          EXPECT_NE(l.summary(logits).find("gather(bf16) -> gemm1 bf16.tM.128x256 act"), std::string::npos)
              << l.summary(logits);
          EXPECT_EQ(&launches_for(p, b.last, logits), &l);
        }
      const int64_t R = s.routes(), Rp = padded_rows(R);
      EXPECT_EQ(p.layout.x_rows, Rp);
      EXPECT_GE(p.layout.x_scales - p.layout.x, size_t(Rp * s.hidden * 2));
      EXPECT_GE(p.layout.act_scales - p.layout.act, size_t(Rp * s.inter * 2));
      EXPECT_GE(p.layout.gemm_queue - p.layout.y, size_t(R * s.hidden * 2));
      EXPECT_NE(describe(p).find("bf16.tM.128x256: bf16 tokens on M"), std::string::npos) << describe(p);
    }
  Shape single = preset.shape;
  single.mode = Mode::single;
  try {
    plan(single, preset.routing, Options{}, d);
    ADD_FAILURE() << "bf16 single mode planned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
  }
  Options o;
  o.gemm_config = "tM.tall.s4.bulk.dyn";
  EXPECT_THROW(plan(preset.shape, preset.routing, o, d), Error);
  o.gemm_config = "bf16.tM.128x256";  // its one kernel, named
  const Plan named = plan(preset.shape, preset.routing, o, d);
  EXPECT_EQ(named.gemm_config, "bf16.tM.128x256");
  EXPECT_TRUE(launches_for(named, 100, true).chain.sorted_rows);
  EXPECT_NE(describe(named).find("gather(bf16) -> gemm1 bf16.tM.128x256 act -> gemm2 bf16.tM.128x256 rows"),
            std::string::npos)
      << describe(named);
  o.gemm_config = "bf16.wM.64x64";  // weights on M (decode)
  const Plan decode = plan(preset.shape, preset.routing, o, d);
  EXPECT_EQ(decode.gemm_config, "bf16.wM.64x64");
  EXPECT_TRUE(launches_for(decode, 1, true).bf16_weights_on_m);
  EXPECT_NE(describe(decode).find("gemm1 bf16.wM.64x64 act -> gemm2 bf16.wM.64x64 rows"), std::string::npos)
      << describe(decode);
  // The lab's variants (lab/bf16_variants/) are no keys of the product.
  for (const char* bad : {"bf16.tM.128x256.pair", "bf16.tM.128x256.tok", "bf16.tM.128x256.x", "bf16"}) {
    o.gemm_config = bad;
    EXPECT_THROW(plan(preset.shape, preset.routing, o, d), Error) << bad;
  }
}

TEST(Plan, Gemm2ConfigOverridesFfnGemm2) {
  const Preset& layer = find_preset("qwen35-layer");
  const DeviceSpec d = device_spec("h200");
  Shape s = layer.shape;
  s.tokens = 4096;
  Options o;
  o.gemm2_config = "wM.sorted.s6.red.dense.dyn";
  const Plan p = plan(s, layer.routing, o, d);
  for (const auto& b : p.buckets->buckets) {
    EXPECT_EQ(key(b.from_logits.gemm2), o.gemm2_config) << "T=" << b.first;
    EXPECT_EQ(b.from_logits.error, "") << "T=" << b.first;
  }
  auto rejected = [&](const Shape& shape, const Options& opt, const std::string& says) {
    try {
      plan(shape, layer.routing, opt, d);
      ADD_FAILURE() << opt.gemm2_config << " planned; expected: " << says;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  Options gather = o;
  gather.gemm2_config = "wM.gather.s8.red.compact";
  rejected(s, gather, "reads the intermediate by sorted row");
  Options det = o;
  det.deterministic = true;
  rejected(s, det, "the deterministic combine needs a config that stores rows");
  Shape single = find_preset("qwen35-single").shape;
  rejected(single, o, "single mode has one GEMM");
}

// A GEMM 1 key that reduces (split K, balanced shares): the fast combine's ffn plan runs it on h's
// sorted rows at every batch it can gather; the deterministic one rejects it (float atomics).
TEST(Plan, FfnGemm1OnAReducingKey) {
  const Preset& layer = find_preset("qwen35-layer");
  const DeviceSpec d = device_spec("h200");
  Shape s = layer.shape;
  s.tokens = 8;
  for (const char* text : {"wM.gather.s8.red.compact.k2.efw", "wM.gather.s8.red.compact.bal.efw"}) {
    Options o;
    o.gemm_config = text;
    const Plan p = plan(s, layer.routing, o, d);
    for (const auto& b : p.buckets->buckets)
      for (const Launches* l : {&b.from_logits, &b.from_ids}) {
        EXPECT_EQ(l->error, "") << text << " T=" << b.first;
        EXPECT_EQ(key(l->gemm), text) << "T=" << b.first;
        EXPECT_FALSE(combine_stores_rows(l->gemm));
      }
    o.deterministic = true;
    try {
      plan(s, layer.routing, o, d);
      ADD_FAILURE() << text << " planned in deterministic mode";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("float atomics"), std::string::npos) << e.what();
    }
  }
}

TEST(Plan, BucketsFollowTheChooserAcrossOptions) {
  const Routing r = find_preset("qwen35-single").routing;
  const DeviceSpec d = device_spec("h200");
  for (const bool deterministic : {false, true})
    for (const bool bins : {false, true})
      for (const bool fuse : {false, true})
        for (const bool pdl : {false, true}) {
          Options o;
          o.deterministic = deterministic;
          o.expert_bins = bins;
          o.fuse_small_batch = fuse;
          o.pdl = pdl;
          SCOPED_TRACE(testing::Message() << "det " << deterministic << " bins " << bins << " fuse " << fuse << " pdl "
                                          << pdl);
          const Plan p = plan(preset_shape(8192), r, o, d);
          check_plan(p);
          bool any_bins = false, any_early = false, any_warm = false;
          for (const auto& b : p.buckets->buckets) {
            any_bins = any_bins || b.from_logits.chain.expert_bins;
            any_early = any_early || b.from_logits.chain.early_ids;
            if (const auto* w = std::get_if<WeightsOnMConfig>(&b.from_logits.gemm)) any_warm = any_warm || w->warm_up;
          }
          EXPECT_EQ(any_bins, bins && !deterministic);
          EXPECT_EQ(p.layout.bin_stride > 0, any_bins);
          EXPECT_EQ(any_early, fuse);  // a few routes on one routing CTA
          EXPECT_TRUE(!any_warm || pdl);                 // the warm-up only under PDL
        }
  // Small batches from logits: the fused routing kernel, and the early-ids GEMM at T=1.
  const Plan p = plan(preset_shape(64), r, Options{}, d);
  const Launches& one = launches_for(p, 1, true);
  EXPECT_TRUE(one.chain.fused_route_dispatch);
  EXPECT_EQ(key(one.gemm).rfind("wM.early.", 0), 0u) << key(one.gemm);
  EXPECT_EQ(key(launches_for(p, 1, false).gemm).rfind("wM.gather.", 0), 0u);
  EXPECT_THROW(launches_for(p, 65, true), Error);
  EXPECT_THROW(launches_for(p, 0, true), Error);
}

TEST(Plan, OverrideConfigRunsEveryBatchItCanAndSaysWhyNot) {
  const Routing r = find_preset("qwen35-single").routing;
  const DeviceSpec d = device_spec("h200");
  Options o;
  o.gemm_config = "tM.tall.s4.bulk.dyn";
  Plan p = plan(preset_shape(4096), r, o, d);
  check_plan(p);
  for (const auto& b : p.buckets->buckets)
    for (const Launches* l : {&b.from_logits, &b.from_ids}) {
      EXPECT_EQ(l->error, "");
      EXPECT_EQ(key(l->gemm), o.gemm_config);
    }
  EXPECT_EQ(p.gemm_config, o.gemm_config);
  // Expert bins come from the routing kernel: runs from top-k ids cannot take the chunk walk.
  o.gemm_config = "wM.bins.s8.red.compact";
  p = plan(preset_shape(512), r, o, d);
  EXPECT_NO_THROW(launches_for(p, 100, true));
  try {
    (void)launches_for(p, 100, false);
    ADD_FAILURE() << "ran the bins walk from top-k ids";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expert bins"), std::string::npos) << e.what();
  }
  // A combine the options do not ask for, a shape the kernel cannot take, a key that is not one.
  o.gemm_config = "tM.tall.s4.bulk.dyn";
  o.deterministic = true;
  EXPECT_THROW(plan(preset_shape(512), r, o, d), Error);
  o.deterministic = false;
  Shape odd = preset_shape(512);
  odd.hidden = 1152;
  o.gemm_config = "tM.wide.s4.bulk.dyn";
  EXPECT_THROW(plan(odd, r, o, d), Error);
  o.gemm_config = "wM.fast";
  EXPECT_THROW(plan(preset_shape(512), r, o, d), Error);
}

}  // namespace
}  // namespace loom
