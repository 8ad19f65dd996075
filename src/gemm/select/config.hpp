// The FP8 grouped GEMM's configurations: one type per kernel family, each a small set of explicit
// choices that name exactly one instance (src/gemm/instances/) and its run-time switches, and a
// short printable key for each (what describe(), `loom info` and every benchmark record carry, and
// what Options::gemm_config takes to override the chooser):
//
//   wM.<rows>.s<stages>.<epilogue>.<walk>[.<hint>...]   weights on M (kernel/fp8_weights_on_m_kernel.cuh)
//       rows      gather (by token, from the dispatch's offsets or a hit list) | early (from the
//                 routes' early expert ids) | bins (from expert bins, the chunk walk) | sorted (an
//                 expert-sorted copy by TMA)
//       stages    8 gathering, 6 sorted, 4 with the hand-off (the instance's ring)
//       epilogue  red (red.v4 into the output) | store (route rows, deterministic); ho.red / ho.store:
//                 handed to the producer warpgroup's spare warps (sorted only)
//       walk      dense | compact, then bal (balanced shares) | k<N> (split K) | dyn (queue tail)
//       hints     efw (weights L2 evict-first), exf (activations evict-first), warm (the producer's
//                 dry walk before the PDL wait)
//   wM.res.s5.bulk.<dyn|rr>[.efw]                       resident rows (kernel/fp8_resident_kernel.cuh)
//   tM.<tall|wide>.s4.<bulk|store>.<dyn|rr>[.efw][.exl] tokens on M (kernel/fp8_tokens_on_m_kernel.cuh)
//
// e.g. wM.gather.s8.red.compact.bal.warm, wM.sorted.s4.ho.red.dyn.efw, tM.tall.s4.bulk.dyn.efw.exl.
#pragma once

#include <cstdint>
#include <string>
#include <variant>

#include "contract/device_layout.hpp"

namespace loom {

enum class WmRows { gather, early, bins, sorted };

struct WeightsOnMConfig {
  WmRows rows = WmRows::gather;
  bool store = false;    // deterministic combine: route rows instead of red.v4 into the output
  bool handoff = false;  // sorted only: the epilogue in the producer warpgroup's spare warps
  // dense: units walk all E experts (empty ones skipped), so a CTA knows its first unit before the
  // routing exists; compact: only the experts with rows (found after the wait).
  bool dense = true;
  int split_k = 1;        // K ranges per unit (> 1: red only)
  bool balanced = false;  // equal shares of (unit, K block) per CTA (red only; no split_k)
  bool dynamic = false;   // sorted only: the last round of units from the work queue
  bool weights_evict_first = false;
  bool x_evict_first = false;  // sorted only
  bool warm_up = false;        // gathering only, under PDL
  int stages() const;          // the instance's ring: kStagesGathered, kStagesInline or kStagesHandoff
};

struct ResidentConfig {
  bool dynamic = true;  // units past the first round from the work queue
  bool weights_evict_first = false;
};

struct TokensOnMConfig {
  bool wide = false;    // 64 x 256 tiles instead of 128 x 128
  bool sorted = false;  // A: expert-sorted rows in fragment order, read by sorted row (ffn GEMM 2)
  // Epilogue: SiLU(gate)*up requantised into the ffn intermediate (ffn GEMM 1 on w13; wide tiles
  // whose 256 weight rows are a gate block and its up block). Neither reduces nor stores rows.
  bool act = false;
  bool store = false;   // deterministic combine: route rows instead of bulk reductions
  bool dynamic = true;  // the last round of units from the work queue
  bool weights_evict_first = false;
  bool x_evict_last = false;
};

using GemmConfig = std::variant<WeightsOnMConfig, ResidentConfig, TokensOnMConfig>;

std::string key(const GemmConfig& c);
// Throws loom::Error naming the token it cannot read; the result is validated (validate()).
GemmConfig parse_gemm_key(const std::string& key);
// Throws loom::Error when the choices contradict each other (a hand-off without sorted rows, ...).
void validate(const GemmConfig& c);
// Throws loom::Error when the config's kernel cannot take this shape (K not a multiple of what its
// ring needs, too large for its tables, ...); max_tokens bounds the activation rows it may read.
void check_shape(const GemmConfig& c, int64_t n, int64_t k, int64_t experts, int64_t max_tokens);
// One line of prose: what the instance does.
std::string describe(const GemmConfig& c);

// What a config asks of the kernels before it.
XSource x_source(const GemmConfig& c);        // the activation layout it reads
ScaleLayout scale_layout(const GemmConfig& c);  // row quads: the hand-off and tokens-on-M kernels
bool uses_work_queue(const GemmConfig& c);
bool combine_stores_rows(const GemmConfig& c);  // the deterministic combine (a combine kernel after it)
bool fused_act(const GemmConfig& c);  // the SiLU*up epilogue: writes the ffn intermediate (TokensOnMConfig::act)

}  // namespace loom
