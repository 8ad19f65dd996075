// Routing and the token-order activation quantisation in one launch. The two stages share no data
// (quantising in token order does not need the routing), so CTAs [0, route_ctas) route, one warp
// per token, to the same ids and weights as launch_route_topk (by the two-best ranking, which
// issues fewer instructions), and the remaining CTAs quantise to the same codes and scales as
// launch_quant_gather with route_row = nullptr (two passes per warp at a time), and clear the fast
// combine's output. One launch instead of two takes a kernel boundary off the chain before the
// dispatch. With expert bins (RouteTopkParams::bin_counts) the routing warps also append their
// routes to the bins, and no dispatch kernel runs at all: the register-loaded GEMM reads the bins.
#pragma once

#include <cuda_runtime.h>

#include "quant/quant_gather_sm90.cuh"
#include "route/route_topk_sm90.cuh"

namespace loom {

// quant.route_row must be nullptr (token order) and quant.tokens == route.tokens. Throws
// loom::Error on what either launcher would reject; tokens == 0 launches nothing.
void launch_route_quant(const RouteTopkParams& route, const QuantGatherParams& quant, cudaStream_t stream, bool pdl);

}  // namespace loom
