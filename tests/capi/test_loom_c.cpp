// The C ABI (include/loom/loom_c.h) on the host: versions, defaults that mirror the C++ ones, plans
// for a described device, every error path as a status code with a message, and run()'s argument
// checks, which come before any launch.
#include "loom/loom_c.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/device_info.hpp"
#include "loom/loom.hpp"

namespace {

loom_shape_t layer_shape(int64_t tokens) {
  loom_shape_t s{};
  s.tokens = tokens;
  s.hidden = 2048;
  s.inter = 512;
  s.experts = 256;
  s.topk = 8;
  s.mode = LOOM_MODE_FFN;
  s.dtype = LOOM_DTYPE_FP8;
  return s;
}

struct Defaults {
  loom_routing_t r{};
  loom_options_t o{};
  Defaults() {
    loom_routing_default(&r);
    loom_options_default(&o);
  }
};

// A plan for the described H200 (no GPU needed); destroyed with the holder.
struct Held {
  loom_plan_t p = nullptr;
  ~Held() { loom_plan_destroy(p); }
};

}  // namespace

TEST(CApi, VersionsAndDefaultsMirrorTheCppApi) {
  EXPECT_EQ(loom_abi_version(), uint32_t(LOOM_ABI_VERSION));
  EXPECT_GT(std::string(loom_build_commit()).size(), 0u);
  Defaults d;
  const loom::Routing r;
  EXPECT_EQ(d.r.scoring, LOOM_SCORING_SOFTMAX);
  EXPECT_EQ(d.r.softcap, r.softcap);
  EXPECT_EQ(d.r.renormalize != 0, r.renormalize);
  EXPECT_EQ(d.r.n_group, r.n_group);
  EXPECT_EQ(d.r.topk_group, r.topk_group);
  EXPECT_EQ(d.r.scale, r.scale);
  const loom::Options o;
  EXPECT_EQ(d.o.deterministic != 0, o.deterministic);
  EXPECT_EQ(d.o.pdl != 0, o.pdl);
  EXPECT_EQ(d.o.debug_checks != 0, o.debug_checks);
  EXPECT_EQ(d.o.fuse_small_batch != 0, o.fuse_small_batch);
  EXPECT_EQ(d.o.expert_bins != 0, o.expert_bins);
  EXPECT_EQ(d.o.gemm_config, nullptr);
  EXPECT_EQ(d.o.gemm2_config, nullptr);
  // NULL is ignored, not a crash.
  loom_routing_default(nullptr);
  loom_options_default(nullptr);
}

TEST(CApi, PlansForADescribedDeviceAsTheCppApiDoes) {
  Defaults d;
  for (const int det : {0, 1}) {
    d.o.deterministic = det;
    const loom_shape_t s = layer_shape(1000);
    Held h;
    ASSERT_EQ(loom_plan_create(&s, &d.r, &d.o, "h200", &h.p), LOOM_OK) << loom_last_error();
    ASSERT_NE(h.p, nullptr);
    EXPECT_STREQ(loom_last_error(), "");
    loom::Shape cs{1000, 2048, 512, 256, 8, loom::Mode::ffn, loom::DType::fp8};
    loom::Options co;
    co.deterministic = det != 0;
    const loom::Plan cpp = loom::plan(cs, loom::Routing{}, co, loom::device_spec("h200"));
    EXPECT_EQ(loom_plan_workspace_bytes(h.p), loom::workspace_bytes(cpp));
    loom_shape_t back{};
    ASSERT_EQ(loom_plan_shape(h.p, &back), LOOM_OK);
    EXPECT_EQ(back.tokens, 1000);
    EXPECT_EQ(back.hidden, 2048);
    EXPECT_EQ(back.inter, 512);
    EXPECT_EQ(back.experts, 256);
    EXPECT_EQ(back.topk, 8);
    EXPECT_EQ(back.mode, LOOM_MODE_FFN);
    EXPECT_EQ(back.dtype, LOOM_DTYPE_FP8);
    // describe: the C++ text, in full or cut to the buffer with a NUL; the length is always whole.
    size_t length = 0;
    ASSERT_EQ(loom_plan_describe(h.p, nullptr, 0, &length), LOOM_OK);
    EXPECT_EQ(length, loom::describe(cpp).size());
    std::vector<char> text(length + 1, 'x');
    ASSERT_EQ(loom_plan_describe(h.p, text.data(), text.size(), nullptr), LOOM_OK);
    EXPECT_EQ(std::string(text.data()), loom::describe(cpp));
    char small[8];
    ASSERT_EQ(loom_plan_describe(h.p, small, sizeof small, &length), LOOM_OK);
    EXPECT_EQ(std::string(small), loom::describe(cpp).substr(0, 7));
  }
  // A config key goes through to the plan (and an unknown one is refused with the reason).
  d.o.deterministic = 0;
  d.o.gemm_config = "wM.early.s8.red.compact.k2.warm";
  const loom_shape_t one = layer_shape(1);
  Held h;
  ASSERT_EQ(loom_plan_create(&one, &d.r, &d.o, "h200", &h.p), LOOM_OK) << loom_last_error();
  size_t length = 0;
  ASSERT_EQ(loom_plan_describe(h.p, nullptr, 0, &length), LOOM_OK);
  std::string text(length + 1, '\0');
  ASSERT_EQ(loom_plan_describe(h.p, text.data(), text.size(), nullptr), LOOM_OK);
  EXPECT_NE(text.find("wM.early.s8.red.compact.k2.warm"), std::string::npos);
  d.o.gemm_config = "wM.nonsense";
  loom_plan_t bad = reinterpret_cast<loom_plan_t>(0x1);
  EXPECT_EQ(loom_plan_create(&one, &d.r, &d.o, "h200", &bad), LOOM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(bad, nullptr);
  EXPECT_NE(std::string(loom_last_error()).find("wM.nonsense"), std::string::npos) << loom_last_error();
}

TEST(CApi, ErrorsAreCodesWithTheReason) {
  Defaults d;
  auto create = [&](loom_shape_t s, const char* device = "h200") {
    loom_plan_t p = nullptr;
    const loom_status_code c = loom_plan_create(&s, &d.r, &d.o, device, &p);
    loom_plan_destroy(p);
    EXPECT_EQ(p == nullptr, c != LOOM_OK);
    return c;
  };
  auto says = [](const char* part) {
    EXPECT_NE(std::string(loom_last_error()).find(part), std::string::npos) << "'" << loom_last_error() << "'";
  };
  loom_shape_t s = layer_shape(128);
  s.hidden = 2050;
  EXPECT_EQ(create(s), LOOM_ERROR_INVALID_ARGUMENT);
  says("2050");
  s = layer_shape(128);
  s.experts = 600;
  EXPECT_EQ(create(s), LOOM_ERROR_INVALID_ARGUMENT);
  says("experts");
  s = layer_shape(128);
  s.mode = 7;
  EXPECT_EQ(create(s), LOOM_ERROR_INVALID_ARGUMENT);
  says("mode");
  s = layer_shape(128);
  s.dtype = 9;
  EXPECT_EQ(create(s), LOOM_ERROR_INVALID_ARGUMENT);
  says("dtype");
  s = layer_shape(128);
  s.dtype = LOOM_DTYPE_BF16;
  s.mode = LOOM_MODE_SINGLE;  // bf16 runs the ffn layer only
  EXPECT_EQ(create(s), LOOM_ERROR_INVALID_ARGUMENT);
  says("bf16");
  EXPECT_EQ(create(layer_shape(128), "a100"), LOOM_ERROR_INVALID_ARGUMENT);
  says("a100");
  d.r.scoring = 5;
  EXPECT_EQ(create(layer_shape(128)), LOOM_ERROR_INVALID_ARGUMENT);
  says("scoring");
  Defaults fresh;
  loom_plan_t p = nullptr;
  const loom_shape_t ok = layer_shape(128);
  EXPECT_EQ(loom_plan_create(nullptr, &fresh.r, &fresh.o, "h200", &p), LOOM_ERROR_INVALID_ARGUMENT);
  says("shape");
  EXPECT_EQ(loom_plan_create(&ok, nullptr, &fresh.o, "h200", &p), LOOM_ERROR_INVALID_ARGUMENT);
  says("routing");
  EXPECT_EQ(loom_plan_create(&ok, &fresh.r, nullptr, "h200", &p), LOOM_ERROR_INVALID_ARGUMENT);
  says("options");
  EXPECT_EQ(loom_plan_create(&ok, &fresh.r, &fresh.o, "h200", nullptr), LOOM_ERROR_INVALID_ARGUMENT);
  says("plan");
  // The current device: a plan where there is a GPU, a CUDA error where there is none.
  const loom_status_code c = loom_plan_create(&ok, &fresh.r, &fresh.o, nullptr, &p);
  if (loom::query_device()) {
    EXPECT_EQ(c, LOOM_OK) << loom_last_error();
  } else {
    EXPECT_EQ(c, LOOM_ERROR_CUDA);
    says("no GPU");
  }
  loom_plan_destroy(p);
  loom_plan_destroy(nullptr);
  EXPECT_EQ(loom_plan_workspace_bytes(nullptr), 0u);
  loom_shape_t back;
  EXPECT_EQ(loom_plan_shape(nullptr, &back), LOOM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(loom_plan_describe(nullptr, nullptr, 0, nullptr), LOOM_ERROR_INVALID_ARGUMENT);
  loom_layer_status_t st;
  EXPECT_EQ(loom_read_status(nullptr, reinterpret_cast<void*>(0x1000), nullptr, &st), LOOM_ERROR_INVALID_ARGUMENT);
}

// run()'s checks on the host: all before any launch, so no GPU is needed to see them.
TEST(CApi, RunChecksItsArgumentsBeforeAnyLaunch) {
  Defaults d;
  const loom_shape_t s = layer_shape(64);
  Held h;
  ASSERT_EQ(loom_plan_create(&s, &d.r, &d.o, "h200", &h.p), LOOM_OK) << loom_last_error();
  auto at = [](uintptr_t a) { return reinterpret_cast<void*>(a); };
  loom_weights_t w{};
  w.w1 = at(0x100000);
  w.w1_scales = static_cast<const float*>(at(0x200000));
  w.w2 = at(0x300000);
  w.w2_scales = static_cast<const float*>(at(0x400000));
  loom_inputs_t in{};
  in.tokens = 64;
  in.hidden = at(0x500000);
  in.router_logits = static_cast<const float*>(at(0x600000));
  void* out = at(0x700000);
  void* ws = at(0x800000);
  auto run_says = [&](loom_weights_t w2, loom_inputs_t in2, void* o, void* wsp, const char* part) {
    EXPECT_EQ(loom_run(h.p, &w2, &in2, o, wsp, nullptr), LOOM_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(loom_last_error()).find(part), std::string::npos) << "'" << loom_last_error() << "'";
  };
  loom_inputs_t bad = in;
  bad.tokens = 65;
  run_says(w, bad, out, ws, "tokens");
  bad = in;
  bad.topk_ids = static_cast<const int32_t*>(at(0x900000));
  run_says(w, bad, out, ws, "exactly one");
  bad = in;
  bad.hidden = at(0x500008);
  run_says(w, bad, out, ws, "hidden must be 16-byte aligned");
  loom_weights_t wb = w;
  wb.w2 = nullptr;
  run_says(wb, in, out, ws, "w2");
  wb = w;
  wb.w1_scales = static_cast<const float*>(at(0x200004));
  run_says(wb, in, out, ws, "w1_scales must be 16-byte aligned");
  run_says(w, in, at(0x700002), ws, "output must be 16-byte aligned");
  run_says(w, in, out, at(0x800010), "workspace must be 256-byte aligned");
  run_says(w, in, nullptr, ws, "null");
  // T = 0 launches nothing and succeeds.
  bad = in;
  bad.tokens = 0;
  EXPECT_EQ(loom_run(h.p, &w, &bad, out, ws, nullptr), LOOM_OK) << loom_last_error();
  EXPECT_EQ(loom_run(nullptr, &w, &in, out, ws, nullptr), LOOM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(loom_run(h.p, nullptr, &in, out, ws, nullptr), LOOM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(loom_run(h.p, &w, nullptr, out, ws, nullptr), LOOM_ERROR_INVALID_ARGUMENT);
}
