// Small batches (decode): routing and the dispatch layout in ONE kernel of one CTA, so the chain
// loses a kernel boundary and the single-CTA dispatch loses its separate launch. Softmax scoring
// only (sigmoid groups keep per-warp scratch that 32 warps cannot afford); larger batches and
// sigmoid use launch_route_topk + launch_dispatch.
//
// Writes exactly what those two kernels write together: topk ids/weights, nan flags, offsets,
// route_row, row_token, row_weight and the status word (bit-identical results).
#pragma once

#include <cuda_runtime.h>

#include "dispatch/dispatch_sm90.cuh"
#include "route/route_topk_sm90.cuh"

namespace loom {

inline constexpr int kSmallBatchMaxRoutes = 2048;  // T*k handled by the fused kernel

// Whether the fused kernel takes this batch.
bool route_dispatch_small_fits(int tokens, int topk, int experts, const Routing& routing);

// route: logits -> topk_ids/topk_weights/nan_flags; dispatch: its outputs (its topk inputs and
// nan_flags are ignored: the fused kernel uses what it routed).
void launch_route_dispatch_small(const RouteTopkParams& route, const DispatchParams& dispatch, cudaStream_t stream,
                                 bool pdl);

}  // namespace loom
