// Device-side routing of one token by one warp, shared by the routing kernel and the fused
// small-batch route+dispatch kernel. See route_topk_sm90.cu for the algorithm.
#pragma once

#include <cuda/atomic>

#include <cmath>
#include <cstdint>

#include "diag/chain_trace.cuh"
#include "contract/device_layout.hpp"
#include "ptx/prefetch.cuh"
#include "route/route_topk_sm90.cuh"

namespace loom::route_detail {


constexpr unsigned kFullMask = 0xffffffffu;
constexpr uint32_t kNotCandidate = 0;
constexpr uint32_t kNanKey = 1;
constexpr uint32_t kNoId = 0xffffffffu;

// Monotone key of a score under the reference ranking (see the file comment). kSelect: selects
// only, no branch (the softmax path, where it runs for every slot of every token: measured
// faster); the sigmoid path keeps the branch, which spares registers at V = 16.
template <bool kSelect>
__device__ __forceinline__ uint32_t rank_key(float v) {
  if constexpr (!kSelect)
    if (isnan(v)) return kNanKey;
  const uint32_t u = v == 0.0f ? 0u : __float_as_uint(v);  // -0 ties with +0
  const uint32_t key = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return kSelect && isnan(v) ? kNanKey : key;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
}

// The warp's largest value, for lane values that are never NaN: one redux.sync over their
// order-preserving keys instead of a five-step shuffle butterfly (it ranks +0 above -0, where
// fmaxf may return either; exp(c - m) is the same for m = +0 and m = -0).
__device__ __forceinline__ float warp_max_not_nan(float v) {
  const uint32_t u = __float_as_uint(v);
  const uint32_t top = __reduce_max_sync(kFullMask, (u & 0x80000000u) ? ~u : (u | 0x80000000u));
  return __uint_as_float((top & 0x80000000u) ? (top & 0x7fffffffu) : ~top);
}

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFullMask, v, off);
  return v;
}

// warp_sum where only lanes [0, n) hold values (the others +0 or 0): the butterfly's steps over
// lanes n and up add exact zeros, so lanes [0, n) get the same bits in fewer steps (n <= 32).
template <class T>
__device__ __forceinline__ T warp_sum_first(T v, int n) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1)
    if (off < n) v += __shfl_xor_sync(kFullMask, v, off);  // warp-uniform
  return v;
}

// exp(c - m) for c <= m, m finite; 0 for c = -inf or NaN. The rounding error of c - m is carried
// separately (two-sum) and applied to first order, so a large logit spread costs no accuracy.
// Branch-free (the select discards what a -inf or NaN logit computed).
__device__ __forceinline__ float exp_shifted(float c, float m) {
  const float d = c - m;
  const float c_part = d + m;
  const float m_part = d - c_part;
  const float err = (c - c_part) + (-m - m_part);
  const float e = expf(d);
  return d > -128.0f ? fmaf(e, err, e) : 0.0f;  // -inf or NaN logit, or exp(d) below fp32 anyway
}

// Lane l holds experts l * V .. l * V + V - 1 (slot s: expert l * V + s), so a lower lane holds
// only lower ids: among lanes tied on the best key the lowest lane has the reference's winner (the
// lower id), which one ballot finds. Each lane's V logits are contiguous (vector loads).
template <int V>
__device__ __forceinline__ int expert_of(int slot, int lane) {
  return lane * V + slot;
}

// Unnormalised softmax probability of a (valid) expert's capped logit c: exp(c - max) for a finite
// max; for a +inf max the +inf logits share the mass (1 each); nothing above -inf (or all NaN)
// gives no mass.
__device__ __forceinline__ float softmax_mass(float c, float cmax) {
  return cmax == INFINITY ? (c == INFINITY ? 1.0f : 0.0f) : cmax == -INFINITY ? 0.0f : exp_shifted(c, cmax);
}

// A lane's V slot values by value, so that the out-of-line helpers below take and return them in
// registers (an array reference would put the caller's array in local memory).
template <int V>
struct SlotValues {
  float v[V];
};

// The softmax routing's rare paths (a soft-cap, no renormalisation) are calls, not inline blocks.
// Inline, each put a few KiB of code on the common path, which jumped over it, and at every replay
// that jump missed the cold instruction cache on the small batches' chain (journal, thirty-third
// session).
template <int V>
__device__ __noinline__ SlotValues<V> soft_capped(SlotValues<V> x, float cap) {
#pragma unroll
  for (int s = 0; s < V; ++s) x.v[s] = cap * tanhf(x.v[s] / cap);  // NaN stays NaN
  return x;
}

// The full softmax denominator over the token's valid experts (every lane gets it).
template <int V>
__device__ __noinline__ float softmax_denominator(SlotValues<V> c, float cmax, int lane, int experts) {
  float part = 0.0f;
#pragma unroll
  for (int s = 0; s < V; ++s) part += expert_of<V>(s, lane) < experts ? softmax_mass(c.v[s], cmax) : 0.0f;
  return warp_sum(part);
}

// One round of the warp arg-max over the lanes' keys: returns the winning expert id, removes it
// from its lane, and broadcasts its `val` to every lane. One reduction and one ballot on the
// round's critical path; the id and value are shuffled off it.
template <int V>
__device__ __forceinline__ uint32_t take_best(uint32_t (&key)[V], const float (&val)[V], int lane, float& win_val) {
  // The lane's best key by a tree (depth log2 V: it is on the round's path), then its lowest slot
  // holding that key (the lower id keeps a tie), found while the reduction runs.
  uint32_t tree[V];
#pragma unroll
  for (int s = 0; s < V; ++s) tree[s] = key[s];
#pragma unroll
  for (int w = V / 2; w > 0; w /= 2)
#pragma unroll
    for (int s = 0; s < w; ++s) tree[s] = max(tree[s], tree[s + w]);
  const uint32_t best_key = tree[0];  // kNotCandidate (0) when the lane has none left
  int best_slot = V - 1;
#pragma unroll
  for (int s = V - 2; s >= 0; --s) best_slot = key[s] == best_key ? s : best_slot;
  const uint32_t top = __reduce_max_sync(kFullMask, best_key);
  const unsigned tied = __ballot_sync(kFullMask, best_key == top);
  // The lowest tied lane wins. The next round waits only on this test; find-first-set, for the
  // winner's shuffles below, stays off that path.
  const bool won = best_key == top && (tied & ((1u << lane) - 1u)) == 0u;
  const int win_lane = __ffs(tied) - 1;
  float best_val = val[0];
#pragma unroll
  for (int s = 1; s < V; ++s) best_val = best_slot == s ? val[s] : best_val;
  // No candidate left anywhere (top == kNotCandidate): no id, nothing removed.
  const uint32_t best_id = best_key != kNotCandidate ? uint32_t(expert_of<V>(best_slot, lane)) : kNoId;
  win_val = __shfl_sync(kFullMask, best_val, win_lane);
  const uint32_t win = __shfl_sync(kFullMask, best_id, win_lane);
#pragma unroll
  for (int s = 0; s < V; ++s)
    if (won && s == best_slot) key[s] = kNotCandidate;
  return win;
}

// The warp arg-max rounds for throughput (kTwoBest in route_one_token). Each lane keeps its two
// best candidates (key, slot, value) from one scan of its V slots, so a round costs one reduction,
// one ballot and the winner's two shuffles; only a lane that wins a third time rescans (~1 in 20
// tokens with random logits, more with many ties), where take_best also rescans V slots. Faster
// where routing is issue-bound (large batches), slower where it is latency-bound (small ones;
// journal, thirteenth session), so only the large-batch launch uses it.
// Ties: a lane's scan goes up its slots with a strict comparison (the lower slot, i.e. the lower
// id, ranks first), and among lanes tied on the best key the lowest lane, whose ids are lower,
// wins the ballot.
template <int V>
struct WarpRanker {
  static_assert(V <= 16, "slots fit the 16-bit taken mask and a byte each in `slots`");
  static constexpr uint32_t kRunnerUpKnown = 1u << 16;
  uint32_t taken = 0;  // this lane's slots already ranked
  uint32_t key1 = kNotCandidate, key2 = kNotCandidate;
  // Best slot | runner-up slot << 8 | kRunnerUpKnown while key2 is the lane's true runner-up: a
  // promotion (slots >> 8) moves the runner-up to best and clears that bit.
  uint32_t slots = 0;
  float val1 = 0.0f, val2 = 0.0f;
  bool stale = true;  // key1 is not this lane's best: scan before the round (every lane at first)

  // One round, as take_best: the winning expert id and its value on every lane (kNoId and NaN
  // when no candidate is left anywhere, which validated shapes never reach: k <= E, and the kept
  // groups hold >= k experts).
  __device__ __forceinline__ uint32_t take(const uint32_t (&key)[V], const float (&val)[V], int lane, float& win_val) {
    if (stale) {  // the best two of the slots not yet taken
      key1 = key2 = kNotCandidate;
      slots = 0;
#pragma unroll
      for (int s = 0; s < V; ++s) {
        const uint32_t k = (taken >> s) & 1u ? kNotCandidate : key[s];
        if (k > key1) {  // strict: the lower slot keeps a tie
          key2 = key1, val2 = val1;
          key1 = k, val1 = val[s];
          slots = ((slots & 0xffu) << 8) | uint32_t(s);
        } else if (k > key2) {
          key2 = k, val2 = val[s];
          slots = (slots & 0xffu) | (uint32_t(s) << 8);
        }
      }
      slots |= kRunnerUpKnown;
      stale = false;
    }
    const uint32_t top = __reduce_max_sync(kFullMask, key1);
    const int win_lane = __ffs(__ballot_sync(kFullMask, key1 == top)) - 1;
    const uint32_t slot1 = slots & 0xffu;
    const uint32_t my_id = key1 != kNotCandidate ? uint32_t(expert_of<V>(int(slot1), lane)) : kNoId;
    win_val = __shfl_sync(kFullMask, key1 != kNotCandidate ? val1 : NAN, win_lane);
    const uint32_t win = __shfl_sync(kFullMask, my_id, win_lane);
    if (top != kNotCandidate && lane == win_lane) {  // nothing left anywhere: nothing removed
      stale = !(slots & kRunnerUpKnown);  // its next best is the runner-up only if that was known
      taken |= 1u << slot1;
      key1 = key2, val1 = val2, slots >>= 8;
      key2 = kNotCandidate;
    }
    return win;
  }
};

// The k ranking rounds: lane r < topk gets rank r's id and value. kTwoBest: WarpRanker, else
// take_best (a rescan of every slot each round).
template <int V, bool kTwoBest>
__device__ __forceinline__ void rank_topk(uint32_t (&key)[V], const float (&val)[V], int topk, int lane,
                                          int32_t& my_id, float& my_val) {
  WarpRanker<V> ranker;  // unused without kTwoBest
  for (int r = 0; r < topk; ++r) {
    float v;
    uint32_t id;
    if constexpr (kTwoBest)
      id = ranker.take(key, val, lane, v);
    else
      id = take_best(key, val, lane, v);
    if (lane == r) {
      my_id = int32_t(id);
      my_val = v;
    }
  }
}

// Group stage of sigmoid routing: clears the keys of experts outside the topk_group best groups.
// b: biased scores (NaN for a NaN logit or bias) of this lane's slots.
template <int V, int kWarps>
__device__ __forceinline__ void keep_best_groups(uint32_t (&key)[V], const float (&b)[V], int lane, int warp,
                                                 int experts, int n_group, int topk_group) {
  __shared__ float s_score[kWarps][V * 32];
  __shared__ uint8_t s_kept[kWarps][V * 32];
  float* score = s_score[warp];
  uint8_t* kept = s_kept[warp];
#pragma unroll
  for (int s = 0; s < V; ++s) {
    const int e = expert_of<V>(s, lane);
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
      if (g < n_group && sub == 0) gkey[i] = rank_key<false>(group_score);
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
    const int e = expert_of<V>(s, lane);
    if (e < experts && !kept[uint32_t(e) / uint32_t(group_size)]) key[s] = kNotCandidate;
  }
}

// Before the caller's PDL wait: asks L2 for the token's logits (one 128-byte line per lane), so the
// routing's first loads wait on L2 rather than HBM.
__device__ __forceinline__ void prefetch_token_logits(const RouteTopkParams& p, int64_t token, int lane) {
  if (lane * 32 < p.experts) ptx::prefetch_l2(p.logits + token * p.experts + lane * 32);
}

// Routes one token with the whole warp (see the file comment); lanes 0..k-1 store its ids and
// weights, and also return them in slot_id / slot_weight (lane j: slot j), so a caller needs no
// read-back of what it stored. Returns whether the token has a NaN logit (the same on every lane).
// kWarps: warps per CTA of the calling kernel (sigmoid groups keep per-warp scratch in shared
// memory). kTwoBest: rank with WarpRanker (fewer instructions; for throughput-bound launches).
template <int V, bool kSigmoid, int kWarps, bool kTwoBest = false>
__device__ __forceinline__ bool route_one_token(const RouteTopkParams& p, int64_t token, int lane, int warp,
                                                int32_t& slot_id, float& slot_weight) {
  const int experts = p.experts, topk = p.topk;
  const float* row = p.logits + token * experts;

  float x[V];
  bool has_nan = false;
  // A lane's slots are contiguous: 16-byte loads when its whole range is inside an aligned row.
  bool vector_loads = false;
  if constexpr (V % 4 == 0)
    vector_loads = (lane + 1) * V <= experts && (reinterpret_cast<uintptr_t>(row) % 16) == 0;
  if (vector_loads) {
#pragma unroll
    for (int s = 0; s < V; s += 4) {
      const float4 v = *reinterpret_cast<const float4*>(row + expert_of<V>(s, lane));
      x[s] = v.x, x[s + 1] = v.y, x[s + 2] = v.z, x[s + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int s = 0; s < V; ++s) {
      const int e = expert_of<V>(s, lane);
      x[s] = e < experts ? row[e] : 0.0f;
    }
  }
#pragma unroll
  for (int s = 0; s < V; ++s) has_nan |= expert_of<V>(s, lane) < experts && isnan(x[s]);
  has_nan = __any_sync(kFullMask, has_nan);
  if (token == 0 && lane == 0) LOOM_TRACE(kRankLoaded);

  uint32_t key[V];
  int32_t my_id = 0;  // lane r < k: the expert of slot r
  float weight = 0.0f;

  if constexpr (!kSigmoid) {
    const float cap = p.routing.softcap;
    SlotValues<V> c;
    if (cap > 0.0f) {  // warp-uniform: one branch for the soft-cap, not one per slot
      SlotValues<V> raw;
#pragma unroll
      for (int s = 0; s < V; ++s) raw.v[s] = x[s];
      c = soft_capped(raw, cap);
    } else {
#pragma unroll
      for (int s = 0; s < V; ++s) c.v[s] = x[s];
    }
    float cmax = -INFINITY;
    float tree[V];  // latency: the valid slots' capped logits
#pragma unroll
    for (int s = 0; s < V; ++s) {
      const bool valid = expert_of<V>(s, lane) < experts;
      key[s] = valid ? rank_key<true>(x[s]) : kNotCandidate;
      if constexpr (kTwoBest)
        cmax = valid ? fmaxf(cmax, c.v[s]) : cmax;  // fmaxf skips NaN
      else
        tree[s] = valid ? c.v[s] : -INFINITY;
    }
    if constexpr (kTwoBest) {  // throughput: the fewest instructions
      cmax = warp_max(cmax);
    } else {  // latency: a tree (depth log2 V), then one reduction
#pragma unroll
      for (int w = V / 2; w > 0; w /= 2)
#pragma unroll
        for (int s = 0; s < w; ++s) tree[s] = fmaxf(tree[s], tree[s + w]);  // skips a NaN, unless both are
      // -inf, not NaN, when every slot is NaN or past E: the warp max takes no NaN.
      cmax = warp_max_not_nan(fmaxf(tree[0], -INFINITY));
    }
    if (token == 0 && lane == 0) LOOM_TRACE(kRankMax);

    // The full denominator only without renormalisation (renormalised, it cancels): the k chosen
    // experts' masses are all the exps a renormalised token needs.
    const float denominator = p.routing.renormalize ? 0.0f : softmax_denominator(c, cmax, lane, experts);

    float my_c = 0.0f;  // lane r < k: the (capped) logit of rank r
    rank_topk<V, kTwoBest>(key, c.v, topk, lane, my_id, my_c);
    if (token == 0 && lane == 0) LOOM_TRACE(kRankRanked);
    // The GEMM's weight loads wait on the ids alone: publish them before the weights.
    if (p.early_ids != nullptr && lane < topk)
      cuda::atomic_ref<uint32_t, cuda::thread_scope_device>(p.early_ids[token * topk + lane])
          .store(kEarlyIdValid | (my_id >= 0 && my_id < experts ? uint32_t(my_id + 1) : 0u),
                 cuda::std::memory_order_relaxed);
    // Once, after the ranking: inside the loop the warp issued the exp of every round.
    const float mine = lane < topk ? softmax_mass(my_c, cmax) : 0.0f;
    // Renormalised: e / sum over the k chosen e (the full denominator cancels); a zero sum means
    // every weight is 0 and stays 0.
    // mine is +0 on lanes >= topk: latency takes fewer butterfly steps for the same bits.
    const float chosen = kTwoBest ? warp_sum(mine) : warp_sum_first(mine, topk);
    const float divisor = p.routing.renormalize ? chosen : denominator;
    weight = divisor > 0.0f ? mine / divisor : 0.0f;
    weight *= p.routing.scale;
    if (token == 0 && lane == 0) LOOM_TRACE(kRankWeighted);
  } else {
    float b[V];
#pragma unroll
    for (int s = 0; s < V; ++s) {
      const int e = expert_of<V>(s, lane);
      const bool valid = e < experts;
      const float bias = valid && p.bias ? p.bias[e] : 0.0f;
      b[s] = 1.0f / (1.0f + expf(-x[s])) + bias;  // NaN logit or bias -> NaN -> ranks last
      key[s] = valid ? rank_key<false>(b[s]) : kNotCandidate;
    }
    if (p.routing.topk_group < p.routing.n_group)  // else every group survives
      keep_best_groups<V, kWarps>(key, b, lane, warp, experts, p.routing.n_group, p.routing.topk_group);

    float my_logit = 0.0f;  // lane r < k: the logit of rank r
    rank_topk<V, kTwoBest>(key, x, topk, lane, my_id, my_logit);
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
  slot_id = my_id;
  slot_weight = weight;
  if (lane == 0) p.nan_flags[token] = has_nan ? 1 : 0;
  return has_nan;
}

}  // namespace loom::route_detail
