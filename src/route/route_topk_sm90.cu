// Routing kernel: one warp per token, kWarpsPerCta tokens per CTA.
//
// Lane l holds experts l * V .. l * V + V - 1 (slot s = expert % V): V = ceil(E / 32) rounded up to
// a power of two, at most 16 scores per lane, all in registers, loaded 16 bytes at a time.
//
// Ranking: every expert gets a 32-bit key, larger = better, that encodes the route_ref order:
//   number -> its IEEE bits made monotone (-0 folded onto +0, so the two tie like in the reference),
//   NaN    -> 1 (below -inf, whose key is 0x007fffff),
//   0      -> not a candidate (padding, already chosen, or outside the kept groups).
// Top-k is k rounds of a warp arg-max: each lane finds its best slot (strict >, slots in ascending
// id order, so the lower id wins a tie), then redux.sync max over the keys gives the best key and a
// ballot the lowest lane holding it (lower lanes hold lower ids): the winner, which its lane removes. Slot r of the
// output is kept by lane r (k <= 16 < 32), and lanes 0..k-1 store ids and weights coalesced.
//
// Sigmoid groups go through shared memory (per warp: the biased scores, then one kept flag per
// group): L lanes per group (the largest power of two with n_group * L <= 32) gather each group's
// two best scores and merge them with shuffles; the topk_group groups are chosen by the same arg-max
// rounds, and experts of other groups stop being candidates.
//
// Weights. Softmax: fp32 (tanhf, expf), exp(c - max) with the rounding error of the difference
// carried by a two-sum, the denominator summed per lane then across the warp; renormalised weights
// divide by the sum of the k chosen terms (the full denominator cancels). Sigmoid: the k chosen
// experts' sigmoids are recomputed in double from their logits (k exps per token), so tiny weights
// renormalise like the reference's instead of underflowing to 0 in fp32.
//
// PDL: every thread executes griddepcontrol.wait before its first global access (even warps with no
// token), then launch_dependents so the next kernel can start its prologue.
#include "route/route_topk_sm90.cuh"

#include <string>

#include "common/chain_trace.cuh"
#include "common/launch.hpp"
#include "ptx/pdl.cuh"
#include "route/route_topk_device.cuh"

namespace loom {

namespace {

using route_detail::route_one_token;

constexpr int kWarpsPerCta = 4;
constexpr int kThreads = kWarpsPerCta * 32;

template <int V, bool kSigmoid>
__global__ void __launch_bounds__(kThreads) route_topk_kernel(const RouteTopkParams p) {
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  const int64_t token = int64_t(blockIdx.x) * kWarpsPerCta + warp;
  if (threadIdx.x == 0) LOOM_TRACE(kRouteStart);
  if (token < p.tokens) route_detail::prefetch_token_logits(p, token, lane);
  // Everything below reads or writes memory the previous kernels of the chain may own.
  ptx::pdl_wait();
  ptx::pdl_launch_dependents();
  if (threadIdx.x == 0) LOOM_TRACE(kRouteWaited);
  if (token >= p.tokens) return;  // warp-uniform
  int32_t id;
  float weight;
  route_one_token<V, kSigmoid, kWarpsPerCta>(p, token, lane, warp, id, weight);
  if (threadIdx.x == 0) LOOM_TRACE(kRouteEnd);
}

template <bool kSigmoid>
void launch_for_scoring(const RouteTopkParams& p, int slots, dim3 grid, cudaStream_t stream, bool pdl) {
  const dim3 block(kThreads);
  switch (slots) {
    case 1: launch_kernel(route_topk_kernel<1, kSigmoid>, grid, block, 0, stream, pdl, p); break;
    case 2: launch_kernel(route_topk_kernel<2, kSigmoid>, grid, block, 0, stream, pdl, p); break;
    case 4: launch_kernel(route_topk_kernel<4, kSigmoid>, grid, block, 0, stream, pdl, p); break;
    case 8: launch_kernel(route_topk_kernel<8, kSigmoid>, grid, block, 0, stream, pdl, p); break;
    default: launch_kernel(route_topk_kernel<16, kSigmoid>, grid, block, 0, stream, pdl, p); break;
  }
}

}  // namespace

void check_route_topk(const RouteTopkParams& p) {
  if (p.tokens < 0) throw Error("route_topk: tokens must be >= 0, got " + std::to_string(p.tokens));
  if (p.experts <= 0 || p.experts > kRouteMaxExperts)
    throw Error("route_topk: experts = " + std::to_string(p.experts) + " is outside the kernel's range [1, " +
                std::to_string(kRouteMaxExperts) + "]");
  if (p.topk <= 0 || p.topk > kRouteMaxTopk || p.topk > p.experts)
    throw Error("route_topk: topk = " + std::to_string(p.topk) + " must be in [1, min(experts = " +
                std::to_string(p.experts) + ", " + std::to_string(kRouteMaxTopk) + ")]");
  Shape shape;
  shape.experts = p.experts;
  shape.topk = p.topk;
  validate(p.routing, shape);
  if (p.tokens > 0 && (!p.logits || !p.topk_ids || !p.topk_weights || !p.nan_flags))
    throw Error("route_topk: null device pointer");
}

void launch_route_topk(const RouteTopkParams& p, cudaStream_t stream, bool pdl) {
  check_route_topk(p);
  if (p.tokens == 0) return;

  int slots = 1;  // per lane: ceil(E / 32) rounded up to a power of two
  while (slots * 32 < p.experts) slots *= 2;
  const dim3 grid(unsigned((int64_t(p.tokens) + kWarpsPerCta - 1) / kWarpsPerCta));
  if (p.routing.scoring == Scoring::softmax)
    launch_for_scoring<false>(p, slots, grid, stream, pdl);
  else
    launch_for_scoring<true>(p, slots, grid, stream, pdl);
}

}  // namespace loom
