// Grouped FP8 GEMM over expert segments with 128x128 weight-block scales and 1x128 activation
// scales, and the weighted combine fused into its epilogue.
//
// Orientation ("swap AB"): weight rows sit on the MMA's M side (64 per consumer warpgroup, 128 per
// CTA) and an expert's token rows on its N side, so an expert with 4 routed rows does not pad a
// 64-row MMA; the N width of each chunk is picked at run time from {16, 32, 64, 128} to fit the
// expert's rows. A work unit is (expert, 128 weight rows); the persistent grid strides over units
// in expert-major order (with sorted rows, the last round's worth of units from a global queue; or,
// balanced, each CTA takes an equal share of the (unit, K block) pairs),
// and each unit streams its 128 x K weight tile once through a TMA pipeline for every chunk of up
// to 128 of the expert's rows. The chunk's activation rows are gathered by
// token (row_token) from the token-order quantised activations with cp.async, or, for wide chunks,
// loaded by TMA from an expert-sorted copy (XSource).
//
// Per 128-wide K block: four wgmma m64nWk32 into a block accumulator, then on the CUDA cores
// final += block * weight_scale * activation_scale(column) (the promotion that bounds the tensor
// cores' reduced-precision FP8 accumulation).
//
// Epilogue: atomic — out[token, n] += topk_weight * final (red.global.add.v4.f32);
//           store  — y[row, n] = topk_weight * final (no atomics; the combine kernel sums rows).
// With narrow chunks the consumer warpgroups run it themselves; with wide ones (sorted rows) they
// stage the chunk's result in shared memory and the producer warpgroup's three spare warps run it
// while the consumers go on with the next chunk (GemmFp8Config::handoff_epilogue).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "common/device_info.hpp"
#include "contract/device_layout.hpp"

namespace loom {

enum class CombineMode { atomic, store };

// Tile geometry every FP8 GEMM shares: 128-wide K blocks (one activation and weight scale block
// each) and blocks of 128 weight rows (one weight-scale block); the weights-on-M kernels' widest
// token chunk.
inline constexpr int kFp8BlockK = 128;
inline constexpr int kFp8BlockRows = 128;
inline constexpr int kWeightsOnMMaxChunk = 128;
// Pipeline depths of the weights-on-M kernels (16 KiB weight tile + activation tile per stage): the
// gathering kernels' stages hold tiles of at most 32 rows (4 KiB), so 8 fit where the sorted-row
// kernel with its epilogue in the consumers takes 6; the hand-off epilogue's staging (a whole
// 128 x 128 fp32 chunk result) takes the shared memory of two stages.
inline constexpr int kStagesInline = 6, kStagesHandoff = 4, kStagesGathered = 8;

// Where a chunk's activation rows come from.
//  gather_by_token: token-order quantised rows, gathered by row_token with cp.async: no sorted copy
//                   to write, so small batches have one kernel before the GEMM. Chosen up to
//                   kGatherMaxTokens tokens, where no chunk is wider than 32. It runs in a kernel
//                   instantiation of its own whose chunks are at most 32 rows (an expert with more
//                   rows takes several), so none of the wide-chunk code is in its path. Also chosen
//                   up to kGatherBinsMaxRowsPerExpert rows per expert when the routes reach the GEMM
//                   in expert bins (routes from logits): then no dispatch kernel either.
//  sorted_rows:     an expert-sorted copy, loaded by TMA boxes (cp.async cannot keep the bytes of
//                   64- and 128-wide chunks in flight: T=2048 GEMM 154.8 us gathered, 106 sorted).
//  token_fragments: token-order rows whose codes the quantiser laid out in wgmma A-fragment order
//                   (fragment_word), loaded by each consumer thread into registers: no sorted copy.
//                   Its own kernels (kernel/fp8_tokens_on_m_kernel.cuh), tokens on the MMA's M side, from
//                   kTokenFragmentsMinRowsPerExpert rows per expert and in kWideTilesRowsPerExpert.
enum class XSource { gather_by_token, sorted_rows, token_fragments };
inline constexpr int kGatherMaxTokens = 32;
inline constexpr double kGatherBinsMaxRowsPerExpert = 24.0;  // T=768 on the preset (28 rows lost)
// token_fragments from this many routed rows per expert (uniform routing), where K allows it, and
// in wide tiles (GemmFp8Config::wide_tiles; K a multiple of 256) for [kWideTilesRowsPerExpert[0],
// [1]) rows per expert, or from kWideTilesFromBinsRowsPerExpert where the routes reach the GEMM in
// expert bins (no count or dispatch kernel before it; the measurements: choose_gemm_fp8_config).
inline constexpr double kTokenFragmentsMinRowsPerExpert = 52.0;
inline constexpr double kWideTilesRowsPerExpert[2] = {30.0, kTokenFragmentsMinRowsPerExpert};
inline constexpr double kWideTilesFromBinsRowsPerExpert = 24.0;
// Inside that range, 128 x 128 tiles from this many rows per expert, 64 x 256 below (choose_gemm_fp8_config).
inline constexpr double kTallTilesRowsPerExpert = 40.0;
// Resident token rows (GemmFp8Config::resident_rows) up to this many routed rows per expert, where
// the routes reach the GEMM in expert bins, nearly every expert has rows, and the kernel holds 1.5x
// the mean in one chunk (the measurements: choose_gemm_fp8_config).
inline constexpr double kResidentRowsMaxRowsPerExpert = 32.0;
inline constexpr int kRegsRing = 3;        // the kernel's K blocks in flight (its ring): K >= 128 kRegsRing
inline constexpr int kRegsTileRows = 128;  // an expert's token rows per tile (128 x 128 tiles)
inline constexpr int kRegsMaxK = 64 * 128; // its weight scales per unit in shared memory
// Whether choose_gemm_fp8_config reads token_fragments for this batch (from the wide-tile range on
// where K is a multiple of 256, else from kTokenFragmentsMinRowsPerExpert). routes_in_bins: as the
// chooser's (the wide tiles then start lower).
bool use_token_fragments(int64_t tokens, int64_t topk, int64_t experts, int64_t k, bool routes_in_bins = false);

struct GemmFp8Config {
  // TMA pipeline depth (weight tile 16 KiB + activation tile per stage): what pipeline_stages()
  // says for the rest of the config (8 for gathered rows, the default source).
  int stages = 8;
  int max_width = 128;   // widest token chunk (the MMA's N)
  // dense: units walk all E experts (empty ones skipped), so a CTA knows its first unit before the
  // routing exists. compact: units walk only the experts with rows (found after the wait), spread
  // evenly over the grid.
  bool dense = true;
  int split_k = 1;       // K ranges per (expert, 128 rows); > 1 only with the atomic combine
  // Each CTA takes an equal share of all (unit, K block) pairs, cutting units at any K block
  // (atomic combine only; replaces split_k): no CTA streams a whole unit more than another.
  bool balanced = false;
  // Sorted rows and token fragments: units go round robin but for the last round's worth, which
  // CTAs take from a global queue (GemmFp8Params::work_queue) as they finish, so no CTA is left
  // with a whole unit more than the others at the end (units of unequal width, SMs that stream at
  // unequal rates).
  bool dynamic = false;
  XSource x_source = XSource::gather_by_token;  // what GemmFp8Params::x holds
  // L2 eviction priority of the TMA loads (evict_first: the loaded lines leave L2 first).
  bool weights_evict_first = false;
  bool x_evict_first = false;  // sorted rows only
  bool x_evict_last = false;   // token fragments only: the activation rows' loads L2 evict-last
  // Sorted rows only: the consumers stage each chunk's result once and go on to the next chunk's
  // MMAs while the producer warpgroup's spare warps (thread 0 alone issues the loads) weight and
  // reduce it; its staging takes two stages' shared memory (stages 4, else 6). It reads the
  // activation scales in row quads (GemmFp8Params::x_scale_layout), one bulk copy per 4 K blocks.
  bool handoff_epilogue = false;
  // Gathered rows, launched with PDL: before the wait the producer walks to its first unit's rows
  // once, dry, so that code is in the instruction caches when the wait ends (instruction fetch
  // was half of the GEMM's stall samples at T=1; docs/perf.md).
  bool warm_up = false;
  // Token fragments only: tiles of 64 rows x 256 weight rows (both consumer warpgroups on the same
  // rows) instead of 128 x 128, for experts of about 64 rows (mainloop/fp8_tokens_on_m.cuh); K a multiple
  // of 256.
  bool wide_tiles = false;
  // Gathered rows (XSource::gather_by_token), fast combine: the kernel that holds an expert's token
  // rows in shared memory over all of K while its weights stream past them, weight rows on M
  // (kernel/fp8_resident_kernel.cuh). With dynamic, units past the first round come from work_queue.
  bool resident_rows = false;
  std::string str() const;
};

// The config for a run of `tokens` tokens; every choice is printable and justified in the
// implementation. deterministic: the combine must not depend on atomics (no split-K). The caller
// lays the activations out as x_source says. allow_token_fragments = false keeps to the kernels
// with weights on M (for tests of their walks at any batch). routes_in_bins: the routes
// can reach the GEMM in expert bins (GemmFp8Params::expert_counts; routes from logits, fast
// combine), which lets batches above kGatherMaxTokens gather by token too.
GemmFp8Config choose_gemm_fp8_config(int64_t tokens, int64_t topk, int64_t experts, int64_t n, int64_t k,
                                     bool deterministic, const DeviceInfo& device, bool allow_token_fragments = true,
                                     bool routes_in_bins = false);

// Sets GemmFp8Config::handoff_epilogue and the pipeline depth instantiated with it.
void set_handoff_epilogue(GemmFp8Config& c, bool on);
// The pipeline depth of the kernel instantiation that runs a config (its epilogue, activation
// source and promotion): GemmFp8Config::stages must equal it.
int pipeline_stages(const GemmFp8Config& c);

struct GemmFp8Params {
  const uint8_t* weights = nullptr;        // [E, N, K] e4m3, K-major
  const float* weight_scales = nullptr;    // [E, ceil(N/128), ceil(K/128)]
  const uint8_t* x = nullptr;              // [x_rows, K] e4m3: row t = token t, or the expert-sorted rows
  const float* x_scales = nullptr;         // their 1x128 scales, laid out as x_scale_layout says
  // group_major, except row_quads for sorted rows under the hand-off epilogue (whose stages hold a
  // 4-group box per row; launch_gemm_fp8 checks the pairing).
  ScaleLayout x_scale_layout = ScaleLayout::group_major;
  int64_t x_rows = 0;                      // >= T, or R_pad (a multiple of 4) for sorted rows
  const int32_t* offsets = nullptr;        // [E+1]
  const int32_t* row_token = nullptr;      // [R] token of each expert-sorted row: the gather index
  const float* row_weight = nullptr;       // [R]
  // Expert bins instead of sorted rows (the register-loaded GEMM only): expert e's rows are
  // row_token / row_weight [e * expert_stride, + min(expert_counts[e * kBinCountStride],
  // expert_stride)), in any order (RouteTopkParams::bin_counts); offsets are then not read and may
  // be null. Atomic combine only.
  const int32_t* expert_counts = nullptr;  // [E * kBinCountStride]
  int expert_stride = 0;
  float* out = nullptr;                    // atomic: [T, N] (zeroed before); store: [R, N]
  // GemmFp8Config::dynamic: two int32 words, zero when the kernel starts; it leaves them zero when
  // it completes (the pipeline also clears them in the kernel before the GEMM, so a run never
  // depends on how the previous one ended).
  int32_t* work_queue = nullptr;
  // Optional: the experts with rows and their row ranges (DispatchParams::hit_list, written by the
  // kernel before): compact walks read them instead of scanning the offsets.
  const int4* hit_list = nullptr;
  // Optional, with hit_list, for a compact gathering walk: the routes' early expert ids
  // (RouteTopkParams::early_ids, early_routes = T * k <= kEarlyIdWords). The kernel spins on them
  // before its PDL wait and builds its hit list from them, so its first weight loads need not wait
  // for the kernel before to complete. That kernel must clear them before it lets this one launch.
  const uint32_t* early_ids = nullptr;
  int early_routes = 0;
  int experts = 0, n = 0, k = 0;
  CombineMode combine = CombineMode::atomic;
};

// The most rows of one expert the resident-rows kernel holds in shared memory over all of K (a
// multiple of 16, at most 48; 48 at K=2048), or 0 where it cannot take N and K: K not a multiple
// of 128, too large to hold 16 rows, or a unit's weight scales (N/128 x K/128) more than its record
// holds.
int resident_rows_capacity(int64_t n, int64_t k);

// Throws loom::Error for shapes the kernel cannot take (N or K not a multiple of 16, sizes beyond
// the TMA limits) and on launch failure.
void launch_gemm_fp8(const GemmFp8Params& p, const GemmFp8Config& cfg, const DeviceInfo& device, cudaStream_t stream,
                     bool pdl);

}  // namespace loom
