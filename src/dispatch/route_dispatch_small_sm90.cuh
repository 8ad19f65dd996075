// Small batches (decode), CTAs of 1024 threads:
//  - launch_route_dispatch_small: routing AND the dispatch layout in one kernel, so the chain loses a
//    kernel boundary. One token per warp (T <= 32: more tokens per warp would serialise their
//    latency), softmax scoring only (sigmoid groups keep per-warp scratch 32 warps cannot afford).
//    Up to 8 tokens one CTA routes them all; beyond, a cluster of 4 CTAs shares the tokens and
//    gathers their routes in CTA 0's shared memory, which builds the layout. Extra CTAs of the same
//    launch quantise the activations in token order meanwhile (the whole glue in one kernel: the
//    chain to the GEMM has a single boundary).
//  - launch_dispatch_small: the dispatch layout alone, from top-k ids (any scoring), for up to
//    kSmallBatchMaxRoutes routes: a lean single pass of counting, two scans and a stable walk.
// Both write exactly what launch_route_topk + launch_dispatch write (bit-identical results).
#pragma once

#include <cuda_runtime.h>

#include "dispatch/dispatch_sm90.cuh"
#include "quant/quant_gather_sm90.cuh"
#include "route/route_topk_sm90.cuh"

namespace loom {

inline constexpr int kSmallBatchMaxTokens = 32;    // fused route+dispatch: one token per warp
inline constexpr int kSmallBatchMaxRoutes = 2048;  // dispatch alone (a single CTA beyond is slower)

// Whether the fused route+dispatch kernel takes this batch.
bool route_dispatch_small_fits(int tokens, int topk, int experts, const Routing& routing);
// The routing CTAs (one cluster) the fused kernel uses for `tokens` tokens.
int route_dispatch_small_ctas(int tokens);
// Whether the single-CTA dispatch takes this batch.
bool dispatch_small_fits(int tokens, int topk, int experts);

// route: logits -> topk_ids/topk_weights/nan_flags; dispatch: its outputs (its topk inputs and
// nan_flags are ignored: the fused kernel uses what it routed); quant: nullptr, or the token-order
// quantisation (route_row = nullptr) to run in extra CTAs of the same launch.
void launch_route_dispatch_small(const RouteTopkParams& route, const DispatchParams& dispatch,
                                 const QuantGatherParams* quant, cudaStream_t stream, bool pdl);
void launch_dispatch_small(const DispatchParams& dispatch, cudaStream_t stream, bool pdl);

}  // namespace loom
