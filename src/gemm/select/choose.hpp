// The FP8 GEMM's chooser: the config (select/config.hpp) for a batch, from rows per expert (uniform
// routing assumed), the shape, and the device's SM count and L2 size; never from one preset's
// token counts. The measurements behind each choice are in docs/perf/journal.
#pragma once

#include <cstdint>

#include "common/device_info.hpp"
#include "gemm/select/config.hpp"

namespace loom {

// Gathering by token: up to kGatherMaxTokens tokens (an expert then has at most that many rows, a
// token routing to an expert at most once), and from expert bins up to this many rows per expert.
inline constexpr double kGatherBinsMaxRowsPerExpert = 24.0;
// Tokens on M from this many routed rows per expert, where K allows it; in wide tiles (K a
// multiple of 256) from kWideTilesRowsPerExpert[0] (kWideTilesFromBinsRowsPerExpert where the
// routes reach the GEMM in expert bins) up to [1]; 128 x 128 tiles from kTallTilesRowsPerExpert.
inline constexpr double kTokenFragmentsMinRowsPerExpert = 52.0;
inline constexpr double kWideTilesRowsPerExpert[2] = {30.0, kTokenFragmentsMinRowsPerExpert};
inline constexpr double kWideTilesFromBinsRowsPerExpert = 24.0;
inline constexpr double kTallTilesRowsPerExpert = 40.0;
// Resident rows up to this many routed rows per expert (from expert bins, nearly every expert hit,
// 1.5x the mean within the kernel's capacity).
inline constexpr double kResidentRowsMaxRowsPerExpert = 32.0;

// What the chooser decides from.
struct GemmProblem {
  int64_t tokens = 0, topk = 0, experts = 0, n = 0, k = 0;
  bool deterministic = false;  // the combine must not use float atomics
  // The routes can reach the GEMM in expert bins (routes from logits, fast combine): batches above
  // kGatherMaxTokens may then gather by token, and the resident and wide-tile kernels start lower.
  bool routes_in_bins = false;
  // false: keep to the weights-on-M kernels (tests of their walks at any batch).
  bool allow_tokens_on_m = true;
};

GemmConfig choose_gemm_config(const GemmProblem& problem, const DeviceInfo& device);

// Whether the chooser takes the tokens-on-M kernels for this batch (from the wide-tile range on
// where K is a multiple of 256, else from kTokenFragmentsMinRowsPerExpert), within their limits.
bool use_token_fragments(int64_t tokens, int64_t topk, int64_t experts, int64_t k, bool routes_in_bins = false);

}  // namespace loom
