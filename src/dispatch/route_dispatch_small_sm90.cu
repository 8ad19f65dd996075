#include "dispatch/route_dispatch_small_sm90.cuh"

#include <string>

#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "ptx/pdl.cuh"
#include "quant/quant_gather_device.cuh"
#include "route/route_topk_device.cuh"

namespace loom {

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kSmallMaxExperts = 512;
static_assert(kSmallBatchMaxTokens <= kWarps, "the fused kernel routes one token per warp");

// Shared memory: per-warp per-expert counts (turned into per-warp cursors), expert totals and
// offsets, and two counters. Dynamic: sized for the run's E.
struct Layout {
  static size_t bytes(int experts) { return size_t(kWarps + 2) * size_t(experts + 1) * 4 + 16; }
};

// kRoute: route first (V slots per lane); else dispatch the top-k ids already in dp.
// kQuant: then quantise and gather (qp) in the same CTA.
template <bool kRoute, bool kQuant, int V>
__global__ void __launch_bounds__(kThreads, 1)
    route_dispatch_small_kernel(const RouteTopkParams rp, const DispatchParams dp, const QuantGatherParams qp) {
  extern __shared__ int32_t smem[];
  const int E = dp.experts, k = dp.topk;
  const int routes = dp.tokens * k;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int32_t* counts = smem;                        // [kWarps][E]: routes of warp w's range per expert
  int32_t* totals = counts + kWarps * (E + 1);   // [E+1]: per expert, then offsets after the scan
  int32_t* counters = totals + (E + 1);          // [0]: NaN tokens, [1]: dropped routes

  for (int i = threadIdx.x; i < (kWarps + 1) * (E + 1) + 2; i += kThreads) counts[i] = 0;
  // Everything below reads or writes memory the previous kernels of the chain may own.
  ptx::pdl_wait();
  ptx::pdl_launch_dependents();
  __syncthreads();

  // 1. Routing: warp w routes token w; ids and weights go to global memory and are read back below
  //    by other threads of this CTA (ordered by the barrier). Without routing: count NaN flags.
  const int32_t* ids = kRoute ? rp.topk_ids : dp.topk_ids;
  const float* weights = kRoute ? rp.topk_weights : dp.topk_weights;
  if constexpr (kRoute) {
    if (warp < rp.tokens && route_detail::route_one_token<V, false, kWarps>(rp, warp, lane, warp) && lane == 0)
      atomicAdd(&counters[0], 1);
  } else if (dp.nan_flags) {
    int nan_tokens = 0;
    for (int t = threadIdx.x; t < dp.tokens; t += kThreads) nan_tokens += dp.nan_flags[t] != 0;
    nan_tokens = __reduce_add_sync(0xffffffffu, nan_tokens);
    if (lane == 0 && nan_tokens) atomicAdd(&counters[0], nan_tokens);
  }
  __syncthreads();

  // 2. Counts: warp w owns the contiguous routes [w * per_warp, (w + 1) * per_warp).
  const int per_warp = (routes + kWarps - 1) / kWarps;
  const int begin = warp * per_warp, end = min(routes, begin + per_warp);
  int dropped = 0;
  for (int i = begin + lane; i < end; i += 32) {
    const int32_t e = ids[i];
    if (e >= 0 && e < E)
      atomicAdd(&counts[warp * (E + 1) + e], 1);
    else
      ++dropped;
  }
  if (dropped) atomicAdd(&counters[1], dropped);
  __syncthreads();

  // 3. Per expert: exclusive scan over warps (warp cursors) and the expert's total.
  for (int e = threadIdx.x; e < E; e += kThreads) {
    int run = 0;
    for (int w = 0; w < kWarps; ++w) {
      const int c = counts[w * (E + 1) + e];
      counts[w * (E + 1) + e] = run;
      run += c;
    }
    totals[e] = run;
  }
  __syncthreads();
  // Exclusive scan of the totals over experts (warp 0, 32 experts per step).
  if (warp == 0) {
    int base = 0;
    for (int e0 = 0; e0 < E; e0 += 32) {
      const int e = e0 + lane;
      const int v = e < E ? totals[e] : 0;
      int incl = v;
#pragma unroll
      for (int d = 1; d < 32; d *= 2) {
        const int n = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += n;
      }
      if (e < E) totals[e] = base + incl - v;
      base += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0) totals[E] = base;
  }
  __syncthreads();

  // 4. Stable rows: each warp walks its routes in order, 32 at a time; lanes with the same expert
  //    rank among themselves (match_any), the group's leader advances the warp's cursor.
  for (int i0 = begin; i0 < end; i0 += 32) {
    const int i = i0 + lane;
    const bool active = i < end;
    const int32_t e = active ? ids[i] : -1;
    const bool valid = active && e >= 0 && e < E;
    const unsigned same = __match_any_sync(0xffffffffu, valid ? e : -1);
    if (valid) {
      const int rank = __popc(same & ((1u << lane) - 1));
      const int row = totals[e] + counts[warp * (E + 1) + e] + rank;
      dp.route_row[i] = row;
      dp.row_token[row] = i / k;
      dp.row_weight[row] = weights[i];
    } else if (active) {
      dp.route_row[i] = -1;
    }
    __syncwarp();
    // The lowest lane of each group moves the cursor past the group (after every lane read it).
    if (valid && (same & ((1u << lane) - 1)) == 0) counts[warp * (E + 1) + e] += __popc(same);
    __syncwarp();
  }

  for (int e = threadIdx.x; e <= E; e += kThreads) dp.offsets[e] = totals[e];
  if (threadIdx.x == 0) {
    LayerStatus st;
    st.nan_tokens = uint32_t(counters[0]);
    st.dropped_routes = uint32_t(counters[1]);
    *dp.status = st;
  }
  if constexpr (kQuant) {
    // route_row is complete (this CTA wrote it above): the same stage code as the quantise kernel.
    __syncthreads();
    quant_detail::quant_gather_body(qp, uint64_t(warp), uint64_t(kWarps), int64_t(threadIdx.x), int64_t(kThreads));
  }
}

}  // namespace

bool route_dispatch_small_fits(int tokens, int topk, int experts, const Routing& routing) {
  return routing.scoring == Scoring::softmax && experts <= kSmallMaxExperts && tokens <= kSmallBatchMaxTokens;
}

bool dispatch_small_fits(int tokens, int topk, int experts) {
  return experts <= kSmallMaxExperts && int64_t(tokens) * topk <= kSmallBatchMaxRoutes;
}

namespace {
template <bool kRoute, bool kQuant, int V>
void launch_one(const RouteTopkParams& rp, const DispatchParams& dp, const QuantGatherParams& qp, cudaStream_t stream,
                bool pdl) {
  const size_t smem = Layout::bytes(dp.experts);
  LOOM_CUDA_CHECK(cudaFuncSetAttribute(route_dispatch_small_kernel<kRoute, kQuant, V>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  launch_kernel(route_dispatch_small_kernel<kRoute, kQuant, V>, dim3(1), dim3(kThreads), smem, stream, pdl, rp, dp, qp);
}

template <bool kQuant>
void launch_routed(const RouteTopkParams& rp, const DispatchParams& dp, const QuantGatherParams& qp, cudaStream_t stream,
                   bool pdl) {
  int slots = 1;  // per lane: ceil(E / 32) rounded up to a power of two, as the routing kernel
  while (slots * 32 < rp.experts) slots *= 2;
  switch (slots) {
    case 1: launch_one<true, kQuant, 1>(rp, dp, qp, stream, pdl); break;
    case 2: launch_one<true, kQuant, 2>(rp, dp, qp, stream, pdl); break;
    case 4: launch_one<true, kQuant, 4>(rp, dp, qp, stream, pdl); break;
    case 8: launch_one<true, kQuant, 8>(rp, dp, qp, stream, pdl); break;
    default: launch_one<true, kQuant, 16>(rp, dp, qp, stream, pdl); break;
  }
}
}  // namespace

void launch_dispatch_small(const DispatchParams& dp, cudaStream_t stream, bool pdl) {
  if (!dispatch_small_fits(dp.tokens, dp.topk, dp.experts))
    throw Error("dispatch_small: batch outside the single-CTA kernel's range");
  if (dp.tokens == 0) return;
  if (!dp.topk_ids || !dp.topk_weights || !dp.offsets || !dp.route_row || !dp.row_token || !dp.row_weight || !dp.status)
    throw Error("dispatch_small: null device pointer");
  RouteTopkParams unused;
  unused.tokens = dp.tokens;
  launch_one<false, false, 1>(unused, dp, QuantGatherParams{}, stream, pdl);
}

void launch_route_dispatch_small(const RouteTopkParams& rp, const DispatchParams& dp, const QuantGatherParams* qp,
                                 cudaStream_t stream, bool pdl) {
  if (!route_dispatch_small_fits(rp.tokens, rp.topk, rp.experts, rp.routing))
    throw Error("route_dispatch_small: batch outside the fused kernel's range");
  if (dp.tokens != rp.tokens || dp.topk != rp.topk || dp.experts != rp.experts)
    throw Error("route_dispatch_small: route and dispatch shapes differ");
  if (rp.tokens == 0) return;
  if (qp) {
    if (qp->tokens != rp.tokens || qp->topk != rp.topk || qp->route_row != dp.route_row || rp.tokens > kSmallBatchQuantTokens)
      throw Error("route_dispatch_small: quantise stage does not match the batch");
    if (qp->hidden_dim <= 0 || qp->hidden_dim % 16 || !qp->hidden || !qp->a_sorted || !qp->a_scales)
      throw Error("route_dispatch_small: bad quantise parameters");
    launch_routed<true>(rp, dp, *qp, stream, pdl);
  } else {
    launch_routed<false>(rp, dp, QuantGatherParams{}, stream, pdl);
  }
}

}  // namespace loom
