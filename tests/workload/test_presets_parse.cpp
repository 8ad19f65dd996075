// Presets by name and the distribution spec parser.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "workload/workload.hpp"
#include "workload_test_util.hpp"

namespace loom {
namespace {

using test::error_of;

void expect_shape(const Preset& p, int64_t T, int64_t H, int64_t I, int64_t E, int64_t k, Mode mode, DType dtype) {
  SCOPED_TRACE(p.name);
  EXPECT_EQ(p.shape.tokens, T);
  EXPECT_EQ(p.shape.hidden, H);
  EXPECT_EQ(p.shape.inter, I);
  EXPECT_EQ(p.shape.experts, E);
  EXPECT_EQ(p.shape.topk, k);
  EXPECT_EQ(p.shape.mode, mode);
  EXPECT_EQ(p.shape.dtype, dtype);
  EXPECT_EQ(p.routing.scoring, Scoring::softmax);
  EXPECT_TRUE(p.routing.renormalize);
  EXPECT_EQ(p.routing.scale, 1.0f);
  EXPECT_EQ(p.routing.softcap, 0.0f);
  EXPECT_FALSE(p.note.empty());
  EXPECT_NO_THROW(validate(p.shape));
  EXPECT_NO_THROW(validate(p.routing, p.shape));
}

// The three presets of DESIGN.md, by name, with exactly the documented shapes and routing.
TEST(Preset, KnownPresetsHaveTheDocumentedShapes) {
  ASSERT_EQ(presets().size(), 3u);
  EXPECT_EQ(presets()[0].name, "qwen35-single");
  EXPECT_EQ(presets()[1].name, "qwen35-layer");
  EXPECT_EQ(presets()[2].name, "h200-bf16");
  expect_shape(find_preset("qwen35-single"), 128, 2048, 512, 256, 8, Mode::single, DType::fp8);
  expect_shape(find_preset("qwen35-layer"), 128, 2048, 512, 256, 8, Mode::ffn, DType::fp8);
  expect_shape(find_preset("h200-bf16"), 2048, 3072, 1536, 16, 8, Mode::ffn, DType::bf16);
  EXPECT_EQ(describe(find_preset("qwen35-single").shape), "T=128 H=2048 I=512 E=256 k=8 fp8 single");
  EXPECT_EQ(&find_preset("h200-bf16"), &presets()[2]);  // a reference into the table, not a copy
}

// Unknown names give the one-line message that lists the known ones; names are case-sensitive.
TEST(Preset, UnknownPresetNamesTheKnownOnes) {
  EXPECT_EQ(error_of([] { find_preset("x"); }),
            "unknown preset 'x' (known: qwen35-single, qwen35-layer, h200-bf16)");
  EXPECT_NE(error_of([] { find_preset("Qwen35-Single"); }).find("unknown preset 'Qwen35-Single'"),
            std::string::npos);
  EXPECT_NE(error_of([] { find_preset(""); }).find("unknown preset ''"), std::string::npos);
}

// Every documented spelling parses to the right kind and parameter and prints back the same.
TEST(DistributionParse, AcceptsEveryDocumentedSpec) {
  struct Case {
    std::string spec;
    DistKind kind;
    double param;
    std::string file;
  };
  const std::vector<Case> cases = {
      {"random", DistKind::random, 0, ""},
      {"balanced", DistKind::balanced, 0, ""},
      {"concentrated", DistKind::concentrated, 0, ""},
      {"zipf:1.2", DistKind::zipf, 1.2, ""},
      {"zipf:0", DistKind::zipf, 0, ""},
      {"zipf:3", DistKind::zipf, 3, ""},
      {"hot:0.9", DistKind::hot, 0.9, ""},
      {"hot:1", DistKind::hot, 1, ""},
      {"hot:0", DistKind::hot, 0, ""},
      {"replay:counts.json", DistKind::replay, 0, "counts.json"},
      {"replay:/tmp/a:b.json", DistKind::replay, 0, "/tmp/a:b.json"},  // only the first ':' splits
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    const Distribution d = parse_distribution(c.spec);
    EXPECT_EQ(d.kind, c.kind);
    EXPECT_EQ(d.param, c.param);
    EXPECT_EQ(d.file, c.file);
    EXPECT_EQ(to_string(d), c.spec);
  }
  // Other spellings of a number are accepted and printed in the shortest form.
  EXPECT_EQ(to_string(parse_distribution("zipf:1.20")), "zipf:1.2");
  EXPECT_EQ(to_string(parse_distribution("hot:5e-1")), "hot:0.5");
}

// Bad specs throw loom::Error with a one-line message that quotes the spec.
TEST(DistributionParse, RejectsBadSpecsWithOneLineErrors) {
  const std::vector<std::string> bad = {
      "zipf", "zipf:", "zipf:-1", "zipf:x", "zipf:1.2x", "zipf: 1", "zipf:inf", "zipf:nan", "hot",
      "hot:", "hot:1.5", "hot:x", "hot:-0.1", "hot:nan", "unknown", "", "Random", "balanced:2",
      "random:", "concentrated:3", "replay", "replay:",
  };
  for (const std::string& spec : bad) {
    SCOPED_TRACE("spec '" + spec + "'");
    const std::string msg = error_of([&] { parse_distribution(spec); });
    EXPECT_FALSE(msg.empty());
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_NE(msg.find("'" + spec + "'"), std::string::npos) << msg;
  }
  EXPECT_NE(error_of([] { parse_distribution("unknown"); })
                .find("known: random, balanced, zipf:S, hot:P, concentrated, replay:FILE"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_distribution("hot:1.5"); }).find("[0, 1]"), std::string::npos);
  EXPECT_NE(error_of([] { parse_distribution("zipf:-1"); }).find(">= 0"), std::string::npos);
}

}  // namespace
}  // namespace loom
