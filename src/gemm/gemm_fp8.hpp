// The FP8 grouped GEMM over expert segments (128 x 128 weight-block scales, 1 x 128 activation
// scales, the weighted combine in its epilogue): its parameters and its launch. Three kernel
// families share one skeleton (kernel/grouped_gemm_sm90.cuh; docs/architecture.md):
//   weights on M   weight rows on the MMA's M side, an expert's token rows on N in chunks of 16..128,
//                  rows gathered by token or read from an expert-sorted copy; decode-sized batches
//   resident rows  weights on M, an expert's rows held in shared memory over all of K
//   tokens on M    an expert's rows on M in 128- or 64-row tiles, A fragments from a shared-memory
//                  ring filled by token; prefill-sized batches
// Which one and how: a GemmConfig (select/config.hpp), chosen by select/choose.hpp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "common/device_info.hpp"
#include "contract/device_layout.hpp"
#include "gemm/select/config.hpp"

namespace loom {

// The output the epilogue writes: atomic, out[T, N] += top-k weight x the expert's row (the output
// zeroed before); store, y[R, N] = top-k weight x the row, one row per route (the combine kernel
// then sums a token's rows in slot order: deterministic).
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
// The gathering kernels' chunks are at most this many rows: the batches they take have no expert
// with more (a token routes to an expert at most once), or they come from expert bins in chunks.
inline constexpr int kGatherMaxTokens = 32;
// The tokens-on-M kernels: K blocks of activations in flight per consumer thread (K >= 128 x this),
// token rows per tall tile, and K up to which a unit's weight scales fit its record.
inline constexpr int kRegsRing = 3;
inline constexpr int kRegsTileRows = 128;
inline constexpr int kRegsMaxK = 64 * 128;
// The work queue of the configs with a dynamic tail: int32 words of the GEMM's workspace
// (scheduler/work_queue.cuh).
inline constexpr int kWorkQueueWords = 2;

struct GemmFp8Params {
  const uint8_t* weights = nullptr;        // [E, N, K] e4m3, K-major
  const float* weight_scales = nullptr;    // [E, N/segment_rows x ceil(segment_rows/128), ceil(K/128)]
  // The weight rows in segments of this many, each cut into its own 128-row blocks (ffn GEMM 1 on
  // w13: I, the gate rows then the up rows; WeightSegments); 0: one segment of N rows.
  int segment_rows = 0;
  const uint8_t* x = nullptr;              // [x_rows, K] e4m3: row t = token t, or the expert-sorted rows
  const float* x_scales = nullptr;         // their 1x128 scales, laid out as x_scale_layout says
  // As the config reads them (scale_layout(config); launch_gemm_fp8 checks the pairing).
  ScaleLayout x_scale_layout = ScaleLayout::group_major;
  int64_t x_rows = 0;                      // >= T, or R_pad (a multiple of 4) for sorted rows
  const int32_t* offsets = nullptr;        // [E+1]
  const int32_t* row_token = nullptr;      // [R] token of each expert-sorted row: the gather index
  const float* row_weight = nullptr;       // [R]; null: every row's weight is 1 (ffn GEMM 1's stored rows)
  // Expert bins instead of sorted rows (rows from bins, resident rows, tokens on M): expert e's rows are
  // row_token / row_weight [e * expert_stride, + min(expert_counts[e * kBinCountStride],
  // expert_stride)), in any order (RouteTopkParams::bin_counts); offsets are then not read and may
  // be null. Atomic combine only.
  const int32_t* expert_counts = nullptr;  // [E * kBinCountStride]
  int expert_stride = 0;
  float* out = nullptr;                    // atomic: [T, N] (zeroed before); store: [R, N]
  // Configs with the dynamic tail: the work queue, kWorkQueueWords int32 words, zero when the kernel
  // starts; it leaves them zero when it completes (scheduler/work_queue.cuh).
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
  // Optional (weights-on-M sorted rows; under PDL): before the PDL wait each CTA bulk-prefetches into
  // L2 its first units' weights, prewait_prefetch_bytes / grid of them (the weights are no kernel's
  // output), so that the weight stream starts while the kernel before still runs. Dense walks only,
  // unless walk_inputs_ready: the offsets and hit list were written by a kernel that the kernel
  // before this one waited for (ffn GEMM 2), and the compact walk is built before the wait too.
  int64_t prewait_prefetch_bytes = 0;
  bool walk_inputs_ready = false;
  // combine == store: the route rows in bf16 (each weighted value rounded to nearest even), out
  // then holding [R, N] bf16 (ffn GEMM 2, deterministic: half the bytes for the combine to read).
  bool store_bf16 = false;
  // combine == atomic on a weights-on-M config: reduce into out[sorted row] ([R, N], zeroed before;
  // unweighted with row_weight null) instead of out[token]: ffn GEMM 1 over split K or balanced
  // shares, whose partial sums meet in the rows the intermediate's kernel reads.
  bool reduce_rows = false;
  int experts = 0, n = 0, k = 0;
  CombineMode combine = CombineMode::atomic;
  // The SiLU*up epilogue (TokensOnMConfig::act, ffn GEMM 1 with N = 2I on w13): writes the
  // intermediate instead of out (not read); combine as the fused config says (store).
  struct Intermediate {
    uint8_t* codes = nullptr;   // [rows, inter] e4m3, plain or in A-fragment order
    float* scales = nullptr;    // scale_floats(ceil(inter/128), rows), laid out as scale_layout says
    int64_t rows = 0;           // the padded sorted rows (GEMM 2's x_rows)
    ScaleLayout scale_layout = ScaleLayout::group_major;
    bool fragment_order = false;  // inter a multiple of 128
    int inter = 0;              // I: N = 2I
    float* values = nullptr;    // optional [rows, inter] fp32: the act values quantised (tests)
  } act;
};

// The most rows of one expert the resident-rows kernel holds in shared memory over all of K (a
// multiple of 16, at most 48; 48 at K=2048), or 0 where it cannot take N and K: K not a multiple
// of 128, too large to hold 16 rows, or a unit's weight scales (N/128 x K/128) more than its record
// holds.
int resident_rows_capacity(int64_t n, int64_t k);

// Launches the config's instance: one persistent CTA per SM of `device` (at most one per unit where
// the units are known on the host). Throws loom::Error for what the config's kernel cannot take
// (shapes, alignment, a combine or scale layout the config does not read, options it does not
// have) and on launch failure.
void launch_gemm_fp8(const GemmFp8Params& p, const GemmConfig& cfg, const DeviceInfo& device, cudaStream_t stream,
                     bool pdl);

}  // namespace loom
