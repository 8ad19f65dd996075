// The dispatch kernel (sm_90a): per-expert counts, exclusive offsets, and the expert-sorted row
// of every route, bit for bit what dispatch_ref computes (stable: inside one expert, ascending
// token, then slot), plus the gathered token and top-k weight of every sorted row.
//
// One kernel, CTAs of 1024 threads, no global scratch and nothing to clear before it: everything
// it accumulates lives in shared memory and every global output is a plain store.
//   - Each CTA owns a slice of 1024 * steps consecutive routes (steps in 1..4), 32 routes per warp
//     per step. T*k <= 1024 (decode: T = 128, k = 8) is one CTA; larger batches get more CTAs,
//     which never talk to each other. They need the global per-expert totals and the counts of the
//     routes before their slice: a count kernel launched first writes each slice's per-expert
//     counts to DispatchParams::slice_counts (plain stores of every word: nothing to clear).
//   - Experts are processed in windows of at most 1024 (one window for E <= 1024).
// Header usable from plain C++ (no device code).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "contract/device_layout.hpp"

namespace loom {

struct DispatchParams {
  const int32_t* topk_ids = nullptr;      // [T, k]
  const float* topk_weights = nullptr;    // [T, k]
  const uint8_t* nan_flags = nullptr;     // [T] or nullptr (precomputed routes): status.nan_tokens =
                                          // number of nonzero flags (0 without flags)
  int tokens = 0, topk = 0, experts = 0;
  int32_t* offsets = nullptr;     // [E+1] exclusive scan of per-expert counts; offsets[E] = T*k - dropped
  int32_t* route_row = nullptr;   // [T*k] sorted row of route t*k+j, -1 if its id is outside [0, E)
  int32_t* row_token = nullptr;   // [T*k] token of each sorted row (rows >= offsets[E] untouched)
  float* row_weight = nullptr;    // [T*k] top-k weight of each sorted row (bits copied)
  LayerStatus* status = nullptr;  // written with plain stores every run (nan_tokens, dropped_routes, reserved = 0)
  // Optional [1 + E]: {count of experts with rows}, then (expert, first row, rows, 0) of each of
  // them, ascending: the GEMM's compact unit walk reads it instead of scanning the offsets. Only
  // the fused small-batch kernel writes it (launch_route_dispatch_small); others ignore it.
  int4* hit_list = nullptr;
  // Optional [ceil(T/32), E] token masks of these routes (RouteTopkParams::token_masks): the fused
  // dispatch+quantise kernel loads them instead of counting the ids (then dropped routes are
  // R - rows); other kernels ignore them.
  const uint32_t* token_masks = nullptr;
  // [ctas, E + 1] per-slice counts, written and read by launch_dispatch's two kernels when it runs
  // more than one CTA (DispatchLaunch::slice_count_words; required then, else unused).
  int32_t* slice_counts = nullptr;
};

// How launch_dispatch runs one shape (for plan descriptions, tests and benchmarks).
struct DispatchLaunch {
  int ctas = 0;           // CTAs of `threads` threads; 0 when T = 0 (nothing is launched)
  int threads = 0;        // 1024
  int steps = 0;          // 32-route steps per warp: a CTA owns 1024 * steps consecutive routes
  int windows = 0;        // expert windows (passes), ceil(E / 1024)
  int window = 0;         // experts per window
  size_t smem_bytes = 0;  // dynamic shared memory per CTA
  size_t slice_count_words = 0;  // DispatchParams::slice_counts words: ctas * (E + 1) when ctas > 1
};

// Throws Error when the shape is invalid: T < 0, k <= 0, E outside [1, 4096], T*k beyond int32.
DispatchLaunch dispatch_launch_shape(int64_t tokens, int64_t topk, int64_t experts);

// Bytes of DispatchParams::slice_counts that every batch of up to max_tokens tokens needs.
size_t dispatch_slice_count_bytes(int64_t max_tokens, int64_t topk, int64_t experts);

// T = 0 launches nothing (and writes nothing). Throws Error for an invalid shape (see above) or a
// null required pointer (all but nan_flags; slice_counts when the launch has several CTAs), before
// any CUDA call. Several CTAs: the count kernel, then the dispatch kernel. With `pdl` each is
// launched with the programmatic-dependent-launch attribute and waits (ptx::pdl_wait) before its
// first global memory access.
void launch_dispatch(const DispatchParams& p, cudaStream_t stream, bool pdl);

}  // namespace loom
