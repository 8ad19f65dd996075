// Routing kernel: one warp per token, 4 tokens per CTA (8 when it also writes token masks).
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
// ballot the lowest lane holding it (lower lanes hold lower ids): the winner, which its lane
// removes. Slot r of the output is kept by lane r (k <= 16 < 32), and lanes 0..k-1 store ids and
// weights coalesced.
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

#include "diag/chain_trace.cuh"
#include "common/launch.hpp"
#include "ptx/pdl.cuh"
#include "route/route_topk_device.cuh"

namespace loom {

namespace {

using route_detail::route_one_token;

// CTAs of 4 warps (tokens), or of 8 when writing token masks (kMasks, a kernel of its own so the
// plain routing's code and registers stay as they were): then a CTA's tokens are one byte of each
// 32-token mask word, so CTAs write disjoint bytes of the masks (no atomics, and no zeroed buffer to
// OR into).
constexpr int kWarpsPerCta = 4, kMaskWarpsPerCta = 8;
static_assert(kMaskWarpsPerCta == 8, "a CTA's tokens fill one byte of each token mask word");

template <int V, bool kSigmoid, bool kMasks>
__device__ __forceinline__ void route_topk_body(const RouteTopkParams& p) {
  constexpr int kWarps = kMasks ? kMaskWarpsPerCta : kWarpsPerCta;
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  const int64_t token = int64_t(blockIdx.x) * kWarps + warp;
  if (threadIdx.x == 0) LOOM_TRACE(kRouteStart);
  if (token < p.tokens) route_detail::prefetch_token_logits(p, token, lane);
  // Everything below reads or writes memory the previous kernels of the chain may own.
  ptx::pdl_wait();
  ptx::pdl_launch_dependents();
  if (threadIdx.x == 0) LOOM_TRACE(kRouteWaited);
  if constexpr (!kMasks) {
    if (token >= p.tokens) return;  // warp-uniform
    int32_t id;
    float weight;
    route_one_token<V, kSigmoid, kWarps>(p, token, lane, warp, id, weight);
    if (threadIdx.x == 0) LOOM_TRACE(kRouteEnd);
  } else {
    __shared__ uint32_t expert_bits[kWarps][kGpuMaxExperts / 32];  // per token: its experts as bits
    int32_t id = 0;  // lane j < k: the expert of slot j
    float weight;
    const bool routed = token < p.tokens;  // every warp reaches the barrier below
    if (routed) route_one_token<V, kSigmoid, kWarps>(p, token, lane, warp, id, weight);
    if (threadIdx.x == 0) LOOM_TRACE(kRouteEnd);
    // Lane j of a token's warp gathers the token's experts 32j .. 32j + 31 as bits (none past the
    // last token), then thread e puts bit e of the CTA's 8 tokens into byte (token0 % 32) / 8 of
    // word (token0 / 32, e).
    uint32_t bits = 0;
    for (int r = 0; r < p.topk; ++r) {
      const int e = __shfl_sync(0xffffffffu, id, r);
      if (routed && (e >> 5) == lane) bits |= 1u << (e & 31);
    }
    if (lane < kGpuMaxExperts / 32) expert_bits[warp][lane] = bits;
    __syncthreads();
    const int64_t token0 = int64_t(blockIdx.x) * kWarps;
    uint8_t* dst = reinterpret_cast<uint8_t*>(p.token_masks + (token0 / 32) * p.experts) + (token0 % 32) / 8;
    for (int e = int(threadIdx.x); e < p.experts; e += kWarps * 32) {
      uint32_t byte = 0;
#pragma unroll
      for (int j = 0; j < kWarps; ++j) byte |= ((expert_bits[j][e >> 5] >> (e & 31)) & 1u) << j;
      dst[int64_t(e) * 4] = uint8_t(byte);
    }
  }
}

template <int V, bool kSigmoid>
__global__ void __launch_bounds__(kWarpsPerCta * 32) route_topk_kernel(const RouteTopkParams p) {
  route_topk_body<V, kSigmoid, false>(p);
}

// minBlocks 1: without it ptxas held the kernel to 32 registers (full occupancy at 256 threads).
template <int V, bool kSigmoid>
__global__ void __launch_bounds__(kMaskWarpsPerCta * 32, 1) route_topk_masks_kernel(const RouteTopkParams p) {
  route_topk_body<V, kSigmoid, true>(p);
}

template <int V, bool kSigmoid>
void launch_with_slots(const RouteTopkParams& p, dim3 grid, cudaStream_t stream, bool pdl) {
  if (p.token_masks)
    launch_kernel(route_topk_masks_kernel<V, kSigmoid>, grid, dim3(kMaskWarpsPerCta * 32), 0, stream, pdl, p);
  else
    launch_kernel(route_topk_kernel<V, kSigmoid>, grid, dim3(kWarpsPerCta * 32), 0, stream, pdl, p);
}

template <bool kSigmoid>
void launch_for_scoring(const RouteTopkParams& p, int slots, dim3 grid, cudaStream_t stream, bool pdl) {
  switch (slots) {
    case 1: launch_with_slots<1, kSigmoid>(p, grid, stream, pdl); break;
    case 2: launch_with_slots<2, kSigmoid>(p, grid, stream, pdl); break;
    case 4: launch_with_slots<4, kSigmoid>(p, grid, stream, pdl); break;
    case 8: launch_with_slots<8, kSigmoid>(p, grid, stream, pdl); break;
    default: launch_with_slots<16, kSigmoid>(p, grid, stream, pdl); break;
  }
}

}  // namespace

void check_route_topk(const RouteTopkParams& p) {
  if (p.tokens < 0) throw Error("route_topk: tokens must be >= 0, got " + std::to_string(p.tokens));
  if (p.experts <= 0 || p.experts > kGpuMaxExperts)
    throw Error("route_topk: experts = " + std::to_string(p.experts) + " is outside the kernel's range [1, " +
                std::to_string(kGpuMaxExperts) + "]");
  if (p.topk <= 0 || p.topk > kGpuMaxTopk || p.topk > p.experts)
    throw Error("route_topk: topk = " + std::to_string(p.topk) + " must be in [1, min(experts = " +
                std::to_string(p.experts) + ", " + std::to_string(kGpuMaxTopk) + ")]");
  Shape shape;
  shape.experts = p.experts;
  shape.topk = p.topk;
  validate(p.routing, shape);
  if (p.tokens > 0 && (!p.logits || !p.topk_ids || !p.topk_weights || !p.nan_flags))
    throw Error("route_topk: null device pointer");
  if (p.bin_counts && (!p.bin_token || !p.bin_weight || !p.status || p.bin_stride < p.tokens ||
                       int64_t(p.experts) * p.bin_stride >= (int64_t(1) << 31)))
    throw Error("route_topk: expert bins need bin_token, bin_weight, status and a stride of at least T = " +
                std::to_string(p.tokens) + " with E * stride below 2^31 (got " + std::to_string(p.bin_stride) + ")");
}

void launch_route_topk(const RouteTopkParams& p, cudaStream_t stream, bool pdl) {
  check_route_topk(p);
  if (p.bin_counts) throw Error("route_topk: expert bins are filled by launch_route_quant only");
  if (p.early_ids) throw Error("route_topk: early expert ids are written by launch_route_dispatch_small only");
  if (p.tokens == 0) return;

  int slots = 1;  // per lane: ceil(E / 32) rounded up to a power of two
  while (slots * 32 < p.experts) slots *= 2;
  // With token masks, whole 32-token words: every byte of every word is written.
  const int64_t words = (int64_t(p.tokens) + 31) / 32;
  const dim3 grid(unsigned(p.token_masks ? words * (32 / kMaskWarpsPerCta)
                                         : (int64_t(p.tokens) + kWarpsPerCta - 1) / kWarpsPerCta));
  if (p.routing.scoring == Scoring::softmax)
    launch_for_scoring<false>(p, slots, grid, stream, pdl);
  else
    launch_for_scoring<true>(p, slots, grid, stream, pdl);
}

}  // namespace loom
