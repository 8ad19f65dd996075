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
static_assert(kSmallBatchMaxTokens <= kWarps && kSmallBatchMaxTokens <= 32,
              "the fused kernel routes one token per warp and keeps 32-bit token masks");
static_assert(kSmallMaxExperts <= kThreads && kWarps == 32, "the offset scan: one expert per thread, one warp of warp sums");

// Shared memory: per-warp per-expert counts (turned into per-warp cursors), expert totals and
// offsets, and two counters. Dynamic: sized for the run's E.
struct Layout {
  static size_t bytes(int experts) { return size_t(kWarps + 2) * size_t(experts + 1) * 4 + 16; }
};

// Routing and dispatch of T <= 32 tokens in one CTA. A token routes to an expert at most once, so
// an expert's routes form a 32-bit token mask: its row count is a popcount, and a route's rank in
// the expert's stable order (ascending token) the popcount of the lower tokens' bits. No per-warp
// count tables and no scan over warps: one barrier after routing, one scan over experts.
template <int V>
__device__ __forceinline__ void route_dispatch_by_token_masks(const RouteTopkParams& rp, const DispatchParams& dp,
                                                              int32_t* smem) {
  const int E = dp.experts, k = dp.topk;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  uint32_t* masks = reinterpret_cast<uint32_t*>(smem);  // [E]: bit t = token t routes to the expert
  int32_t* offsets = smem + E;                           // [E]
  int32_t* warp_base = offsets + E;                      // [kWarps]: scan of the per-warp expert sums
  int32_t* counters = warp_base + kWarps;                // [0]: NaN tokens, [1]: dropped routes
  for (int i = threadIdx.x; i < E; i += kThreads) masks[i] = 0u;
  if (threadIdx.x < 2) counters[threadIdx.x] = 0;
  // Everything below reads or writes memory the previous kernels of the chain may own.
  ptx::pdl_wait();
  ptx::pdl_launch_dependents();
  __syncthreads();

  // Warp w routes token w; lane j < k then holds slot j, which it stored itself (read back without
  // a barrier).
  const bool has_token = warp < rp.tokens;
  int32_t id = -1;
  float weight = 0.0f;
  if (has_token) {
    if (route_detail::route_one_token<V, false, kWarps>(rp, warp, lane, warp) && lane == 0) atomicAdd(&counters[0], 1);
    if (lane < k) {
      id = rp.topk_ids[warp * k + lane];
      weight = rp.topk_weights[warp * k + lane];
      if (id >= 0 && id < E)
        atomicOr(&masks[id], 1u << warp);
      else
        atomicAdd(&counters[1], 1);
    }
  }
  __syncthreads();

  // Offsets: exclusive scan of the popcounts, thread e = expert e (E <= 512 <= kThreads).
  const int count = int(threadIdx.x) < E ? __popc(masks[threadIdx.x]) : 0;
  int incl = count;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int n = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += n;
  }
  if (lane == 31) warp_base[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const int total = warp_base[lane];
    int run = total;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int n = __shfl_up_sync(0xffffffffu, run, d);
      if (lane >= d) run += n;
    }
    warp_base[lane] = run - total;
  }
  __syncthreads();
  const int offset = warp_base[warp] + incl - count;
  if (int(threadIdx.x) < E) {
    offsets[threadIdx.x] = offset;
    dp.offsets[threadIdx.x] = offset;
    if (int(threadIdx.x) == E - 1) dp.offsets[E] = offset + count;
  }
  __syncthreads();

  if (has_token && lane < k) {
    const int route = warp * k + lane;
    if (id >= 0 && id < E) {
      const int row = offsets[id] + __popc(masks[id] & ((1u << warp) - 1u));
      dp.route_row[route] = row;
      dp.row_token[row] = warp;
      dp.row_weight[row] = weight;
    } else {
      dp.route_row[route] = -1;
    }
  }
  if (threadIdx.x == 0) {
    LayerStatus st;
    st.nan_tokens = uint32_t(counters[0]);
    st.dropped_routes = uint32_t(counters[1]);
    *dp.status = st;
  }
}

// kRoute: route first (V slots per lane, T <= 32: token masks); else dispatch the top-k ids already
// in dp (up to kSmallBatchMaxRoutes: per-warp count tables).
// CTA 0 routes and dispatches; CTAs 1.. (if any) quantise qp in token order meanwhile.
template <bool kRoute, int V>
__global__ void __launch_bounds__(kThreads, 1)
    route_dispatch_small_kernel(const RouteTopkParams rp, const DispatchParams dp, const QuantGatherParams qp) {
  extern __shared__ int32_t smem[];
  if (blockIdx.x > 0) {
    // The quantised rows and the output cleared here may still be read by the previous run.
    ptx::pdl_wait();
    ptx::pdl_launch_dependents();
    const int64_t tid = int64_t(blockIdx.x - 1) * kThreads + threadIdx.x, nth = int64_t(gridDim.x - 1) * kThreads;
    quant_detail::quant_gather_body(qp, uint64_t(tid) >> 5, uint64_t(nth) >> 5, tid, nth);
    return;
  }
  if constexpr (kRoute) {
    route_dispatch_by_token_masks<V>(rp, dp, smem);
    return;
  }
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

  // 1. NaN tokens, from the routing kernel's flags.
  const int32_t* ids = dp.topk_ids;
  const float* weights = dp.topk_weights;
  if (dp.nan_flags) {
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
}

}  // namespace

bool route_dispatch_small_fits(int tokens, int topk, int experts, const Routing& routing) {
  return routing.scoring == Scoring::softmax && experts <= kSmallMaxExperts && tokens <= kSmallBatchMaxTokens;
}

bool dispatch_small_fits(int tokens, int topk, int experts) {
  return experts <= kSmallMaxExperts && int64_t(tokens) * topk <= kSmallBatchMaxRoutes;
}

namespace {
// quant_ctas: extra CTAs that quantise qp (0: none).
template <bool kRoute, int V>
void launch_one(const RouteTopkParams& rp, const DispatchParams& dp, const QuantGatherParams& qp, int quant_ctas,
                cudaStream_t stream, bool pdl) {
  const size_t smem = Layout::bytes(dp.experts);
  LOOM_CUDA_CHECK(cudaFuncSetAttribute(route_dispatch_small_kernel<kRoute, V>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  launch_kernel(route_dispatch_small_kernel<kRoute, V>, dim3(1 + quant_ctas), dim3(kThreads), smem, stream, pdl, rp, dp,
                qp);
}

void launch_routed(const RouteTopkParams& rp, const DispatchParams& dp, const QuantGatherParams& qp, int quant_ctas,
                   cudaStream_t stream, bool pdl) {
  int slots = 1;  // per lane: ceil(E / 32) rounded up to a power of two, as the routing kernel
  while (slots * 32 < rp.experts) slots *= 2;
  switch (slots) {
    case 1: launch_one<true, 1>(rp, dp, qp, quant_ctas, stream, pdl); break;
    case 2: launch_one<true, 2>(rp, dp, qp, quant_ctas, stream, pdl); break;
    case 4: launch_one<true, 4>(rp, dp, qp, quant_ctas, stream, pdl); break;
    case 8: launch_one<true, 8>(rp, dp, qp, quant_ctas, stream, pdl); break;
    default: launch_one<true, 16>(rp, dp, qp, quant_ctas, stream, pdl); break;
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
  launch_one<false, 1>(unused, dp, QuantGatherParams{}, 0, stream, pdl);
}

void launch_route_dispatch_small(const RouteTopkParams& rp, const DispatchParams& dp, const QuantGatherParams* qp,
                                 cudaStream_t stream, bool pdl) {
  if (!route_dispatch_small_fits(rp.tokens, rp.topk, rp.experts, rp.routing))
    throw Error("route_dispatch_small: batch outside the fused kernel's range");
  if (dp.tokens != rp.tokens || dp.topk != rp.topk || dp.experts != rp.experts)
    throw Error("route_dispatch_small: route and dispatch shapes differ");
  if (rp.tokens == 0) return;
  if (qp) {
    check_quant_gather(*qp);
    if (qp->tokens != rp.tokens || qp->route_row != nullptr)
      throw Error("route_dispatch_small: the quantisation must be token order over the routed tokens");
    launch_routed(rp, dp, *qp, int((quant_gather_threads(*qp) + kThreads - 1) / kThreads), stream, pdl);
  } else {
    launch_routed(rp, dp, QuantGatherParams{}, 0, stream, pdl);
  }
}

}  // namespace loom
