// The plan's launch lists: for each range of token counts (a bucket), what one run enqueues, from
// router logits and from precomputed top-k ids. plan() computes them once (from the chooser, or
// the Options::gemm_config override); run() finds the bucket and enqueues, choosing nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gemm/select/config.hpp"
#include "loom/loom.hpp"

namespace loom {

// The kernels a run launches before the GEMM, and what each one does.
struct Chain {
  bool fused_route_dispatch = false;  // one launch routes and dispatches (small softmax batches)
  bool quant_with_route = false;      // the token-order quantisation rides in the routing launch
  bool sorted_rows = false;           // the GEMM reads an expert-sorted copy, quantised after the dispatch
  bool dispatch_with_quant = false;   // ... by the dispatch launch itself (routes from logits, masks fit)
  bool token_masks = false;           // ... which copies the token masks the routing kernel wrote
  bool expert_bins = false;           // no dispatch kernel: the routing appends routes to expert bins the GEMM reads
  bool dispatch_small = false;        // the single-CTA dispatch (a separate dispatch launch, small batches)
  bool early_ids = false;             // the fused kernel publishes the routes' ids; the GEMM starts on them
  std::string route_label() const;     // what the routing launch does, e.g. "route+quant"
  std::string dispatch_label() const;  // "dispatch" or "dispatch+quant"
  bool operator==(const Chain&) const = default;
};

// What one run of a bucket enqueues.
struct Launches {
  Chain chain;
  GemmConfig gemm;
  bool combine_rows = false;  // the deterministic combine kernel after the (last) GEMM
  // ffn: `gemm` is GEMM 1 (w13), storing each sorted row unweighted; then the intermediate
  // (SiLU(gate)*up, requantised), GEMM 2 (w2, sorted rows of the intermediate) with the combine,
  // then the bf16 output pass.
  bool ffn = false;
  GemmConfig gemm2;
  // dtype bf16 (ffn): the expert-sorted bf16 copy (the gather), the BF16 GEMMs (GEMM 1 with the
  // SiLU*up epilogue, GEMM 2 storing bf16 route rows) and the combine; gemm and gemm2 are unused.
  bool bf16 = false;
  bool bf16_weights_on_m = false;  // bf16: both GEMMs with weights on M (GemmBf16Params::weights_on_m)
  std::string error;          // non-empty: this routing source cannot run with the plan's options
  // "clear+route+quant+bins -> gemm tM.tall.s4.bulk.dyn.efw.exl", one line.
  std::string summary(bool from_logits) const;
  // GEMM (1)'s config key, or the BF16 kernel's name.
  std::string gemm_key() const;
};

struct PlanBuckets {
  struct Bucket {
    int64_t first = 0, last = 0;  // token counts, inclusive
    Launches from_logits, from_ids;
  };
  std::vector<Bucket> buckets;  // ascending, covering 1 .. the plan's tokens
  const Bucket& find(int64_t tokens) const;
};

// The launches of a run of `tokens` tokens (1 .. the plan's); throws loom::Error where that routing
// source cannot run (Launches::error).
const Launches& launches_for(const Plan& p, int64_t tokens, bool from_logits);

}  // namespace loom
