// The FP8 GEMM launcher's checks of what a config asks of its parameters, on the host (no GPU: each
// case is rejected before any CUDA call): the ffn intermediate's epilogue and the sorted-row
// tokens-on-M instances.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "common/device_info.hpp"
#include "gemm/gemm_fp8.hpp"
#include "gemm/select/config.hpp"
#include "loom/types.hpp"

namespace loom {
namespace {

template <class T>
T* fake(uintptr_t at) {  // an aligned address the checks accept; never dereferenced
  return reinterpret_cast<T*>(at);
}

GemmFp8Params act_params() {
  GemmFp8Params p;
  p.weights = fake<const uint8_t>(0x10000);
  p.weight_scales = fake<const float>(0x20000);
  p.x = fake<const uint8_t>(0x30000);
  p.x_scales = fake<const float>(0x40000);
  p.x_scale_layout = ScaleLayout::row_quads;
  p.x_rows = 2048;
  p.offsets = fake<const int32_t>(0x50000);
  p.row_token = fake<const int32_t>(0x60000);
  p.experts = 256;
  p.n = 1024;
  p.k = 2048;
  p.work_queue = fake<int32_t>(0x70000);
  p.act.codes = fake<uint8_t>(0x80000);
  p.act.scales = fake<float>(0x90000);
  p.act.rows = 16384;
  p.act.scale_layout = ScaleLayout::row_quads;
  p.act.fragment_order = true;
  p.act.inter = 512;
  return p;
}

// A weights-on-M launch's parameters (no intermediate, group-major scales), writing `out`.
GemmFp8Params plain_params(CombineMode combine) {
  GemmFp8Params p = act_params();
  p.act = {};
  p.x_scale_layout = ScaleLayout::group_major;
  p.combine = combine;
  p.out = fake<float>(0xa0000);
  return p;
}

void expect_rejected(const GemmFp8Params& p, const GemmConfig& cfg, const std::string& says) {
  DeviceInfo dev;
  dev.sm_count = 132;
  try {
    launch_gemm_fp8(p, cfg, dev, nullptr, false);
    ADD_FAILURE() << key(cfg) << " accepted; expected: " << says;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
}

TEST(GemmLaunchChecks, ActEpilogueRejectsWhatItCannotWrite) {
  const GemmConfig act = parse_gemm_key("tM.wide.s4.act.dyn");
  GemmFp8Params p = act_params();
  p.n = 1008;  // not 2 inter
  expect_rejected(p, act, "N = 2 inter");
  p = act_params();
  p.act.codes = nullptr;
  expect_rejected(p, act, "codes, scales");
  p = act_params();
  p.act.rows = 16385;  // not padded to 4
  expect_rejected(p, act, "codes, scales");
  p = act_params();
  p.act.inter = 208;
  p.n = 416;
  expect_rejected(p, act, "fragment order takes inter a multiple of 128");
  p = act_params();
  p.act.codes = fake<uint8_t>(0x80004);
  expect_rejected(p, act, "16-byte");
  p = act_params();
  p.k = 1152;  // wide tiles: K a multiple of 256
  expect_rejected(p, act, "multiple of 256");
  EXPECT_THROW(parse_gemm_key("tM.tall.s4.act.dyn"), Error);
  EXPECT_THROW(parse_gemm_key("tM.wide.sorted.s4.act.dyn"), Error);
}

TEST(GemmLaunchChecks, SortedRowTokenTilesNeedOffsets) {
  const GemmConfig sorted = parse_gemm_key("tM.tall.sorted.s4.bulk.dyn");
  GemmFp8Params p = act_params();
  p.n = 2048;
  p.k = 512;
  p.out = fake<float>(0xa0000);
  p.row_weight = fake<const float>(0xb0000);
  p.offsets = nullptr;
  p.expert_counts = fake<const int32_t>(0xc0000);
  p.expert_stride = 64;
  expect_rejected(p, sorted, "reads A by sorted row");
  p.offsets = fake<const int32_t>(0x50000);
  p.expert_counts = nullptr;
  p.expert_stride = 0;
  p.x_rows = 2050;
  expect_rejected(p, sorted, "multiple of 4");
}

// Weight segments (ffn w13 with I not a multiple of 128): a multiple of 16 that divides N; the
// resident-rows kernel cuts N into plain 128-row blocks only.
TEST(GemmLaunchChecks, WeightSegmentsDivideNIntoWholeSegments) {
  GemmFp8Params p = plain_params(CombineMode::store);
  p.n = 384;
  const GemmConfig sorted = parse_gemm_key("wM.sorted.s6.store.dense.dyn");
  p.segment_rows = 100;
  expect_rejected(p, sorted, "segment_rows must be 0 or a multiple of 16 that divides N");
  p.segment_rows = 144;  // a multiple of 16 that does not divide 384
  expect_rejected(p, sorted, "segment_rows must be 0 or a multiple of 16 that divides N");
  p.segment_rows = -16;
  expect_rejected(p, sorted, "segment_rows must be 0 or a multiple of 16 that divides N");
  p.segment_rows = 192;
  p.combine = CombineMode::atomic;
  expect_rejected(p, parse_gemm_key("wM.res.s5.bulk.dyn"), "segment_rows must be a multiple of 128");
}

// bf16 route rows: only where the config stores route rows.
TEST(GemmLaunchChecks, Bf16RouteRowsNeedAStoringConfig) {
  GemmFp8Params p = plain_params(CombineMode::atomic);
  p.store_bf16 = true;
  expect_rejected(p, parse_gemm_key("wM.sorted.s6.red.dense.dyn"), "store_bf16 is for configs that store route rows");
}

// Reducing into sorted rows: weights-on-M configs that reduce.
TEST(GemmLaunchChecks, ReduceRowsNeedsAReducingWeightsOnMConfig) {
  GemmFp8Params p = plain_params(CombineMode::store);
  p.reduce_rows = true;
  expect_rejected(p, parse_gemm_key("wM.sorted.s6.store.dense.dyn"), "reduce_rows is for weights-on-M configs that reduce");
  p.combine = CombineMode::atomic;
  p.x_scale_layout = ScaleLayout::row_quads;
  expect_rejected(p, parse_gemm_key("tM.tall.s4.bulk.dyn"), "reduce_rows is for weights-on-M configs that reduce");
}

// The pre-wait weight prefetch: a non-negative budget, weights-on-M only.
TEST(GemmLaunchChecks, PrewaitPrefetchIsTheWeightsOnMKernels) {
  GemmFp8Params p = plain_params(CombineMode::store);
  p.prewait_prefetch_bytes = -1;
  expect_rejected(p, parse_gemm_key("wM.sorted.s6.store.dense.dyn"), "must not be negative");
  p.prewait_prefetch_bytes = 30 << 20;
  p.x_scale_layout = ScaleLayout::row_quads;
  expect_rejected(p, parse_gemm_key("tM.tall.s4.store.dyn"), "weights-on-M kernels' only");
  p.prewait_prefetch_bytes = 0;
  p.walk_inputs_ready = true;
  expect_rejected(p, parse_gemm_key("tM.tall.s4.store.dyn"), "weights-on-M kernels' only");
}

}  // namespace
}  // namespace loom
