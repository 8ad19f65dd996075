// Internal entry points of the pipeline beyond the public plan()/run(): the benchmark times single
// stages on a workspace a full run prepared, and tools launch the GEMM themselves.
#pragma once

#include <string>

#include "gemm/gemm_fp8.hpp"
#include "loom/loom.hpp"
#include "pipeline/plan_buckets.hpp"

namespace loom {

enum class Stages {
  all,            // the whole layer (what run() does)
  gemm_only,      // just the grouped GEMM, on the routing, layout and activations a full run left
  route_only,     // single glue kernels, likewise on a prepared workspace
  dispatch_only,
  quant_only,
  glue_only,      // route -> dispatch -> quantise, without the GEMM
  // ffn, each alone on a prepared workspace (gemm_only: all four, in order)
  ffn_gemm1,      // GEMM 1
  ffn_act,        // the intermediate (SiLU(gate)*up, requantised)
  ffn_gemm2,      // GEMM 2
  ffn_out,        // the deterministic combine (if any) and the bf16 output
  // The whole deterministic ffn layer but its combine: each route's weighted row, bf16, left in
  // the workspace's y at its route_row (expert parallelism returns these rows to their senders).
  route_rows,
  none,           // nothing launched (gemm_launch_for: what the GEMM launch would be)
};

// The GEMM launch a run makes: its parameters on the run's output and workspace, and its config.
struct GemmLaunch {
  GemmFp8Params params;
  GemmConfig config;
};

// A plan for precomputed routes only (no router logits), whose k may exceed its E: expert
// parallelism's local plan, whose token rows carry the layer's k slots, the slots of other ranks'
// experts -1 (dropped). Otherwise as plan().
Plan plan_routed(const Shape& max_shape, const Options& options, const DeviceSpec& device);

// The batch's hidden rows already quantised (expert parallelism's FP8 rows on the wire): token-major
// codes [T, H] and fp32 scales [T, ceil(H/128)], bit for bit what the layer's quantisation makes of
// the bf16 rows (QuantGatherParams::codes). Inputs::hidden is then unused (may be null).
struct QuantisedHidden {
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
};

// gemm: when given, receives the GEMM launch's parameters and config. quantised: an FP8 plan's
// rows, quantised already (precomputed routes only).
void run_stages(const Plan& p, const Weights& w, const Inputs& in, void* output, void* workspace, cudaStream_t stream,
                Stages stages, GemmLaunch* gemm = nullptr, const QuantisedHidden* quantised = nullptr);

// The GEMM launch a run of these inputs makes, on this output and workspace: for tools that launch
// the GEMM themselves (the lab's phase profile) on the workspace a full run prepared.
GemmLaunch gemm_launch_for(const Plan& p, const Weights& w, const Inputs& in, void* output, void* workspace);

// The kernels a run of `tokens` tokens launches before the GEMM (launches_for(...).chain).
inline Chain chain_for(const Plan& p, int64_t tokens, bool from_logits) {
  return launches_for(p, tokens, from_logits).chain;
}

}  // namespace loom
