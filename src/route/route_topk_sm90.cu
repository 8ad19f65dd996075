// Routing kernel: one warp per token, kWarpsPerCta tokens per CTA.
//
// Lane l holds experts l, l + 32, l + 64, ... (slot s = expert / 32): V = ceil(E / 32) rounded up to
// a power of two, at most 16 scores per lane, all in registers. Loads of one slot are coalesced.
//
// Ranking: every expert gets a 32-bit key, larger = better, that encodes the route_ref order:
//   number -> its IEEE bits made monotone (-0 folded onto +0, so the two tie like in the reference),
//   NaN    -> 1 (below -inf, whose key is 0x007fffff),
//   0      -> not a candidate (padding, already chosen, or outside the kept groups).
// Top-k is k rounds of a warp arg-max: each lane finds its best slot (strict >, slots in ascending
// id order, so the lower id wins a tie), then redux.sync max over the keys and redux.sync min over
// the ids of the lanes holding that key give the winner, which its lane removes. Slot r of the
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

#include <cmath>
#include <string>

#include "common/launch.hpp"
#include "ptx/pdl.cuh"

namespace loom {

namespace {

constexpr int kWarpsPerCta = 4;
constexpr int kThreads = kWarpsPerCta * 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr uint32_t kNotCandidate = 0;
constexpr uint32_t kNanKey = 1;
constexpr uint32_t kNoId = 0xffffffffu;

// Monotone key of a score under the reference ranking (see the file comment).
__device__ __forceinline__ uint32_t rank_key(float v) {
  if (isnan(v)) return kNanKey;
  const uint32_t u = v == 0.0f ? 0u : __float_as_uint(v);  // -0 ties with +0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
}

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFullMask, v, off);
  return v;
}

// exp(c - m) for c <= m, m finite; 0 for c = -inf or NaN. The rounding error of c - m is carried
// separately (two-sum) and applied to first order, so a large logit spread costs no accuracy.
__device__ __forceinline__ float exp_shifted(float c, float m) {
  const float d = c - m;
  if (!(d > -128.0f)) return 0.0f;  // -inf or NaN logit, or exp(d) below fp32 anyway
  const float c_part = d + m;
  const float m_part = d - c_part;
  const float err = (c - c_part) + (-m - m_part);
  const float e = expf(d);
  return fmaf(e, err, e);
}

// One round of the warp arg-max over the lanes' keys: returns the winning expert id (expert
// s * 32 + lane for slot s), removes it from its lane, and broadcasts its `val` to every lane.
template <int V>
__device__ __forceinline__ uint32_t take_best(uint32_t (&key)[V], const float (&val)[V], int lane, float& win_val) {
  uint32_t best_key = kNotCandidate, best_id = kNoId;
  float best_val = 0.0f;
#pragma unroll
  for (int s = 0; s < V; ++s) {
    if (key[s] > best_key) {
      best_key = key[s];
      best_id = uint32_t(s * 32 + lane);
      best_val = val[s];
    }
  }
  const uint32_t top = __reduce_max_sync(kFullMask, best_key);
  const uint32_t win = __reduce_min_sync(kFullMask, best_key == top ? best_id : kNoId);
  win_val = __shfl_sync(kFullMask, best_val, int(win & 31u));
#pragma unroll
  for (int s = 0; s < V; ++s)
    if (uint32_t(s * 32 + lane) == win) key[s] = kNotCandidate;
  return win;
}

// Group stage of sigmoid routing: clears the keys of experts outside the topk_group best groups.
// b: biased scores (NaN for a NaN logit or bias) of this lane's slots.
template <int V>
__device__ __forceinline__ void keep_best_groups(uint32_t (&key)[V], const float (&b)[V], int lane, int warp,
                                                 int experts, int n_group, int topk_group) {
  __shared__ float s_score[kWarpsPerCta][V * 32];
  __shared__ uint8_t s_kept[kWarpsPerCta][V * 32];
  float* score = s_score[warp];
  uint8_t* kept = s_kept[warp];
#pragma unroll
  for (int s = 0; s < V; ++s) {
    const int e = s * 32 + lane;
    if (e < experts) score[e] = b[s];
  }
  __syncwarp();

  const int group_size = experts / n_group;
  int lanes = 32;  // per group
  while (lanes > 1 && n_group * lanes > 32) lanes >>= 1;
  const int per_pass = 32 / lanes;  // groups per pass; more than one pass only when n_group > 32
  const int sub = lane & (lanes - 1);
  const int need = group_size >= 2 ? 2 : 1;

  // Group g of pass i is handled by lanes (g - i * per_pass) * lanes + sub; its key lives in
  // gkey[i] of the lane with sub == 0. n_group <= experts <= 32 * V, so V passes suffice.
  uint32_t gkey[V];
#pragma unroll
  for (int i = 0; i < V; ++i) {
    gkey[i] = kNotCandidate;
    if (i * per_pass < n_group) {  // warp-uniform
      const int g = i * per_pass + lane / lanes;
      // The two largest numbers of the group and how many numbers it has: its two best under the
      // ranking rule hold a NaN exactly when it has fewer than `need` numbers.
      float v1 = -INFINITY, v2 = -INFINITY;
      int count = 0;
      if (g < n_group) {
        for (int m = sub; m < group_size; m += lanes) {
          const float v = score[g * group_size + m];
          if (isnan(v)) continue;
          ++count;
          if (v > v1) {
            v2 = v1;
            v1 = v;
          } else if (v > v2) {
            v2 = v;
          }
        }
      }
      for (int off = lanes >> 1; off > 0; off >>= 1) {
        const float o1 = __shfl_xor_sync(kFullMask, v1, off);
        const float o2 = __shfl_xor_sync(kFullMask, v2, off);
        count += __shfl_xor_sync(kFullMask, count, off);
        v2 = fmaxf(fminf(v1, o1), fmaxf(v2, o2));
        v1 = fmaxf(v1, o1);
      }
      const float group_score = count >= need ? (need == 2 ? v1 + v2 : v1) : NAN;
      if (g < n_group && sub == 0) gkey[i] = rank_key(group_score);
    }
  }

  uint32_t kept_bits = 0;  // bit i: the group of gkey[i] survives
  for (int r = 0; r < topk_group; ++r) {
    uint32_t best_key = kNotCandidate, best_group = kNoId;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      if (gkey[i] > best_key) {
        best_key = gkey[i];
        best_group = uint32_t(i * per_pass + lane / lanes);
      }
    }
    const uint32_t top = __reduce_max_sync(kFullMask, best_key);
    const uint32_t win = __reduce_min_sync(kFullMask, best_key == top ? best_group : kNoId);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      if (sub == 0 && uint32_t(i * per_pass + lane / lanes) == win) {
        gkey[i] = kNotCandidate;
        kept_bits |= 1u << i;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int g = i * per_pass + lane / lanes;
    if (sub == 0 && g < n_group) kept[g] = uint8_t((kept_bits >> i) & 1u);
  }
  __syncwarp();
#pragma unroll
  for (int s = 0; s < V; ++s) {
    const int e = s * 32 + lane;
    if (e < experts && !kept[uint32_t(e) / uint32_t(group_size)]) key[s] = kNotCandidate;
  }
}

template <int V, bool kSigmoid>
__global__ void __launch_bounds__(kThreads) route_topk_kernel(const RouteTopkParams p) {
  // Everything below reads or writes memory the previous kernels of the chain may own.
  ptx::pdl_wait();
  ptx::pdl_launch_dependents();

  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  const int64_t token = int64_t(blockIdx.x) * kWarpsPerCta + warp;
  if (token >= p.tokens) return;  // warp-uniform
  const int experts = p.experts, topk = p.topk;
  const float* row = p.logits + token * experts;

  float x[V];
  bool has_nan = false;
#pragma unroll
  for (int s = 0; s < V; ++s) {
    const int e = s * 32 + lane;
    x[s] = e < experts ? row[e] : 0.0f;
    has_nan |= e < experts && isnan(x[s]);
  }
  has_nan = __any_sync(kFullMask, has_nan);

  uint32_t key[V];
  int32_t my_id = 0;  // lane r < k: the expert of slot r
  float weight = 0.0f;

  if constexpr (!kSigmoid) {
    const float cap = p.routing.softcap;
    float c[V];
    float cmax = -INFINITY;
#pragma unroll
    for (int s = 0; s < V; ++s) {
      const bool valid = s * 32 + lane < experts;
      key[s] = valid ? rank_key(x[s]) : kNotCandidate;
      c[s] = cap > 0.0f ? cap * tanhf(x[s] / cap) : x[s];  // NaN stays NaN
      if (valid) cmax = fmaxf(cmax, c[s]);                  // fmaxf skips NaN
    }
    cmax = warp_max(cmax);

    // e[s] = unnormalised probability: exp(c - max) for a finite max; for a +inf max the +inf
    // logits share the mass (1 each); nothing above -inf (or all NaN) gives no mass at all.
    float e[V];
    float part = 0.0f;
#pragma unroll
    for (int s = 0; s < V; ++s) {
      const bool valid = s * 32 + lane < experts;
      if (cmax == INFINITY)
        e[s] = valid && c[s] == INFINITY ? 1.0f : 0.0f;
      else if (cmax == -INFINITY)
        e[s] = 0.0f;
      else
        e[s] = valid ? exp_shifted(c[s], cmax) : 0.0f;
      part += e[s];
    }
    const float denominator = warp_sum(part);

    float mine = 0.0f;
    for (int r = 0; r < topk; ++r) {
      float v;
      const uint32_t id = take_best(key, e, lane, v);
      if (lane == r) {
        my_id = int32_t(id);
        mine = v;
      }
    }
    // Renormalised: e / sum over the k chosen e (the full denominator cancels); a zero sum means
    // every weight is 0 and stays 0.
    const float chosen = warp_sum(lane < topk ? mine : 0.0f);
    const float divisor = p.routing.renormalize ? chosen : denominator;
    weight = divisor > 0.0f ? mine / divisor : 0.0f;
    weight *= p.routing.scale;
  } else {
    float b[V];
#pragma unroll
    for (int s = 0; s < V; ++s) {
      const int e = s * 32 + lane;
      const bool valid = e < experts;
      const float bias = valid && p.bias ? p.bias[e] : 0.0f;
      b[s] = 1.0f / (1.0f + expf(-x[s])) + bias;  // NaN logit or bias -> NaN -> ranks last
      key[s] = valid ? rank_key(b[s]) : kNotCandidate;
    }
    if (p.routing.topk_group < p.routing.n_group)  // else every group survives
      keep_best_groups(key, b, lane, warp, experts, p.routing.n_group, p.routing.topk_group);

    float my_logit = 0.0f;
    for (int r = 0; r < topk; ++r) {
      float v;
      const uint32_t id = take_best(key, x, lane, v);
      if (lane == r) {
        my_id = int32_t(id);
        my_logit = v;
      }
    }
    // Weights are the unbiased sigmoid of the chosen experts, recomputed in double like the
    // reference: k values per token cost nothing, and fp32 would lose them below x = -87.
    const double s = lane < topk && !isnan(my_logit) ? 1.0 / (1.0 + exp(-double(my_logit))) : 0.0;
    const double sum = warp_sum(s);
    const double w = p.routing.renormalize && sum > 0.0 ? s / sum : s;
    weight = float(w * double(p.routing.scale));
  }

  if (lane < topk) {
    p.topk_ids[token * topk + lane] = my_id;
    p.topk_weights[token * topk + lane] = weight;
  }
  if (lane == 0) p.nan_flags[token] = has_nan ? 1 : 0;
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

void launch_route_topk(const RouteTopkParams& p, cudaStream_t stream, bool pdl) {
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
  if (p.tokens == 0) return;
  if (!p.logits || !p.topk_ids || !p.topk_weights || !p.nan_flags) throw Error("route_topk: null device pointer");

  int slots = 1;  // per lane: ceil(E / 32) rounded up to a power of two
  while (slots * 32 < p.experts) slots *= 2;
  const dim3 grid(unsigned((int64_t(p.tokens) + kWarpsPerCta - 1) / kWarpsPerCta));
  if (p.routing.scoring == Scoring::softmax)
    launch_for_scoring<false>(p, slots, grid, stream, pdl);
  else
    launch_for_scoring<true>(p, slots, grid, stream, pdl);
}

}  // namespace loom
