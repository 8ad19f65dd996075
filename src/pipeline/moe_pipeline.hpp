// Internal entry points of the pipeline beyond the public plan()/run(): the benchmark times the
// GEMM alone on a workspace a full run prepared.
#pragma once

#include <string>

#include "gemm/gemm_fp8.hpp"
#include "loom/loom.hpp"

namespace loom {

enum class Stages {
  all,            // the whole layer (what run() does)
  gemm_only,      // just the grouped GEMM, on the routing, layout and activations a full run left
  route_only,     // single glue kernels, likewise on a prepared workspace
  dispatch_only,
  quant_only,
  glue_only,      // route -> dispatch -> quantise, without the GEMM
  none,           // nothing launched (gemm_launch_for: what the GEMM launch would be)
};

// Whether a run of `tokens` tokens from router logits uses the fused route+dispatch kernel.
bool fused_route_dispatch(const Plan& p, int64_t tokens, bool from_logits);
// Whether its routes can reach the GEMM in expert bins (from logits, fast combine, not fused, bins
// in the plan's workspace); the GEMM config then decides whether they do (Chain::expert_bins).
bool routes_through_bins(const Plan& p, int64_t tokens, bool from_logits);

// The kernels a run launches before the GEMM, and what each one does.
struct Chain {
  bool fused_route_dispatch;  // one launch routes and dispatches (small softmax batches)
  bool quant_with_route;      // the token-order quantisation rides in the routing launch
  bool sorted_rows;           // the GEMM reads an expert-sorted copy, quantised after the dispatch
  bool dispatch_with_quant;   // ... by the dispatch launch itself (routes from logits, masks fit)
  bool token_masks;           // ... which copies the token masks the routing kernel wrote, not counting ids
  bool expert_bins;           // no dispatch kernel: the routing appends routes to expert bins the GEMM reads
  std::string route_label() const;     // what the routing launch does, e.g. "route+quant"
  std::string dispatch_label() const;  // "dispatch" or "dispatch+quant"
};
Chain chain_for(const Plan& p, int64_t tokens, bool from_logits);

// gemm: when given, receives the GEMM launch's parameters and config.
void run_stages(const Plan& p, const Weights& w, const Inputs& in, void* output, void* workspace, cudaStream_t stream,
                Stages stages, struct GemmLaunch* gemm = nullptr);

// The GEMM launch a run of these inputs makes, on this output and workspace: for tools that launch
// the GEMM themselves (the lab's phase profile) on the workspace a full run prepared.
struct GemmLaunch {
  GemmFp8Params params;
  GemmFp8Config config;
};
GemmLaunch gemm_launch_for(const Plan& p, const Weights& w, const Inputs& in, void* output, void* workspace);

}  // namespace loom
