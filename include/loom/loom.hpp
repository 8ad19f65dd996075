// loom: fused MoE layer on Hopper. Plan once (validate the shape, size the workspace, choose kernel
// configs), run many (device pointers and a stream; no host synchronisation, no allocation).
//
//   loom::Plan p = loom::plan(shape, routing, options);       // throws loom::Error with a one-line reason
//   void* ws;  cudaMalloc(&ws, loom::workspace_bytes(p));
//   loom::run(p, weights, inputs, output, ws, stream);         // capturable in a CUDA graph (one per T)
//   loom::LayerStatus st = loom::read_status(p, ws);          // when you like: dropped ids, NaN rows
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "loom/status.hpp"
#include "loom/types.hpp"

namespace loom {

struct Options {
  // Bitwise-identical output run to run and between eager and graph launches: no float atomics;
  // expert rows are stored and a combine kernel sums each token's k rows in slot order.
  bool deterministic = false;
  // Chain the kernels with programmatic dependent launch (each starts while its predecessor ends).
  bool pdl = true;
  // Check synchronously after each run and throw loom::Error on bad device data (ids out of range,
  // NaN router logits) or a CUDA error. Not capturable; for debugging.
  bool debug_checks = false;
  // Small batches routed by softmax: routing, dispatch and quantisation in one launch (up to 32
  // tokens), and the single-CTA dispatch (up to 2048 routes). Off: separate kernels, for comparison.
  bool fuse_small_batch = true;
  // Batches on the register-loaded GEMM, routed from logits, fast combine: the routing kernel appends
  // each route to its expert's bin (one atomic) and the GEMM reads the bins, so no dispatch kernel
  // runs (a one-CTA clear kernel zeroes the bin counters first). Off: the count and dispatch kernels.
  bool expert_bins = true;
  // A GEMM config key (e.g. "tM.tall.s4.bulk.dyn", see `loom info`) that every batch runs instead of
  // the chooser's; plan() rejects one the shape or these options cannot run. Empty: the chooser.
  // ffn mode: GEMM 1's.
  std::string gemm_config;
  // ffn mode: GEMM 2's config key in the same way (a config that reads the intermediate's sorted
  // rows: wM.sorted... or tM.<tall|wide>.sorted...). Empty: the chooser.
  std::string gemm2_config;
};

// The device a plan is made for: what the plan's choices depend on. A plan can be made for a
// described device without one present (device_spec("h200")) to see what it would launch; it runs
// on any sm_90 GPU, tuned for the one it was made for.
struct DeviceSpec {
  std::string name;
  int major = 9, minor = 0;
  int sm_count = 0;
  int64_t l2_bytes = 0;
  int64_t smem_per_block = 0;  // opt-in shared memory per block
};
// The current CUDA device; throws loom::Error without one.
DeviceSpec current_device();
// A described device: "h200" or "h100" (SXM). Throws loom::Error for other names.
DeviceSpec device_spec(const std::string& name);

struct PlanBuckets;  // the launch lists, by token count (src/pipeline/plan_buckets.hpp)

struct Plan {
  Shape shape;  // shape.tokens = the most tokens a run may carry
  Routing routing;
  Options options;
  int sm_count = 0;
  int64_t l2_bytes = 0;
  std::string device_name;
  std::string gemm_config;  // the GEMM config key at the plan's most tokens, routed from logits
  // What run() enqueues for each range of token counts, computed once by plan().
  std::shared_ptr<const PlanBuckets> buckets;
  // Workspace carve-up (byte offsets), sized for shape.tokens.
  struct Layout {
    size_t topk_ids, topk_weights, nan_flags, offsets, route_row, row_token, row_weight, x, x_scales, y,
        gemm_queue, hit_list, early_ids, token_masks, slice_counts, bin_counts, bin_token, bin_weight, status,
        // ffn: GEMM 1's rows [R, 2I] fp32, the intermediate's codes [R, I] and scales, GEMM 2's
        // queue, the output's fp32 accumulator [T, H] (y then holds GEMM 2's weighted rows [R, H] bf16)
        h, act, act_scales, gemm2_queue, acc, total;
    int64_t bin_stride;  // slots per expert bin (shape.tokens), 0 when the plan never uses the bins
    int64_t x_rows;  // activation rows the x and x_scales buffers hold (any batch of the plan fits)
  } layout{};
};

Plan plan(const Shape& max_shape, const Routing& routing, const Options& options = {});
Plan plan(const Shape& max_shape, const Routing& routing, const Options& options, const DeviceSpec& device);
size_t workspace_bytes(const Plan& p);
std::string describe(const Plan& p);  // every choice, one per line, and the launches of every bucket

// dtype fp8: e4m3 codes with their block scales; dtype bf16 (ffn only): bf16 values, no scales.
struct Weights {
  const void* w1 = nullptr;         // single: [E, N, K] e4m3 codes, K-major; ffn: w13 [E, 2I, H] (gate rows, then up rows)
  const float* w1_scales = nullptr; // [E, ceil(N/128), ceil(K/128)] fp32 block scales (ffn: gate and up blocks apart,
                                    // [E, 2 ceil(I/128), ceil(H/128)]); bf16: unused
  const void* w2 = nullptr;         // ffn: [E, H, I] e4m3 codes (or bf16 values), I-major
  const float* w2_scales = nullptr; // ffn: [E, ceil(H/128), ceil(I/128)]; bf16: unused
};

struct Inputs {
  int64_t tokens = 0;                  // T of this run, <= plan's tokens; 0 launches nothing
  const void* hidden = nullptr;        // [T, H] bf16
  const float* router_logits = nullptr;  // [T, E] fp32 ... or
  const float* expert_bias = nullptr;    // [E] sigmoid scoring only (optional)
  const int32_t* topk_ids = nullptr;     // ... precomputed routes [T, k] with
  const float* topk_weights = nullptr;   // [T, k]
};

// output: single mode fp32 [T, N]; ffn mode bf16 [T, H]. Every pointer is device memory; all work is enqueued on `stream`.
void run(const Plan& p, const Weights& w, const Inputs& in, void* output, void* workspace, cudaStream_t stream);

// Synchronous convenience: copies the status word of the last run on `stream` from the workspace.
LayerStatus read_status(const Plan& p, const void* workspace, cudaStream_t stream);

}  // namespace loom
