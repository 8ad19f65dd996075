#include "dispatch/route_dispatch_small_sm90.cuh"

#include <cooperative_groups.h>
#include <cuda/atomic>

#include <string>

#include "diag/chain_trace.cuh"
#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "ptx/pdl.cuh"
#include "quant/quant_gather_device.cuh"
#include "route/route_topk_device.cuh"

namespace loom {

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
static_assert(kSmallBatchMaxTokens <= kWarps && kSmallBatchMaxTokens <= 32,
              "the fused kernel routes one token per warp and keeps 32-bit token masks");
static_assert(kGpuMaxExperts <= kThreads && kWarps == 32, "the offset scan: one expert per thread, one warp of warp sums");

constexpr int kMaxRoutes = kSmallBatchMaxTokens * int(kGpuMaxTopk);  // T * k: the routed ids and weights CTA 0 gathers
constexpr int kTokensPerRouteCta = 8;  // one SM routes up to 8 tokens (warps) without running out of issue
constexpr int kMaxRouteCtas = kSmallBatchMaxTokens / kTokensPerRouteCta;
static_assert(kMaxRouteCtas <= 8, "a portable cluster has at most 8 CTAs");

// Shared memory: per-warp per-expert counts (turned into per-warp cursors), expert totals and
// offsets, and two counters; routing adds the routed ids and weights. Dynamic: sized for the E.
struct Layout {
  static size_t bytes(int experts) { return size_t(kWarps + 2) * size_t(experts + 1) * 4 + 16 + kMaxRoutes * 8; }
};

// Routing and dispatch of T <= 32 tokens by the route_ctas CTAs of one cluster. A token routes to
// an expert at most once, so an expert's routes form a 32-bit token mask: its row count is a
// popcount, and a route's rank in the expert's stable order (ascending token) the popcount of the
// lower tokens' bits. Warp w of cluster rank r routes token w * route_ctas + r (routing 32 tokens
// on one SM is issue-bound) and sets its bits in CTA 0's masks through distributed shared memory;
// after one cluster barrier CTA 0 alone scans the experts and writes the layout.
template <int V>
__device__ __forceinline__ void route_dispatch_by_token_masks(const RouteTopkParams& rp, const DispatchParams& dp,
                                                              int route_ctas, int32_t* smem) {
  namespace cg = cooperative_groups;
  const int E = dp.experts, k = dp.topk;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int rank = int(blockIdx.x);  // the routing CTAs are the grid's first cluster
  uint32_t* masks = reinterpret_cast<uint32_t*>(smem);  // [E]: bit t = token t routes to the expert
  int32_t* offsets = smem + E;                           // [E]
  int32_t* warp_base = offsets + E;                      // [kWarps]: the per-warp expert sums
  int32_t* counters = warp_base + kWarps;                // [0]: NaN tokens, [1]: dropped routes
  int32_t* route_id = counters + 2;                      // [T * k]: routed ids (CTA 0's copy is used)
  float* route_w = reinterpret_cast<float*>(route_id + kMaxRoutes);  // [T * k]: their weights
  const int token = warp * route_ctas + rank;
  if (token < rp.tokens) route_detail::prefetch_token_logits(rp, token, lane);
  if (int(threadIdx.x) < E) masks[threadIdx.x] = 0u;  // E <= kThreads: no loop to unroll on the path
  if (threadIdx.x < 2) counters[threadIdx.x] = 0;
  // Early ids: the launcher passes them only with one routing CTA, whose last warp routes no token
  // (T <= kTokensPerRouteCta < kWarps) and lets the GEMM launch.
  const bool early = rp.early_ids != nullptr;  // route_one_token stores them
  constexpr int kEarlyWarp = kWarps - 1;
  static_assert(kTokensPerRouteCta < kEarlyWarp && kEarlyIdWords <= 32, "the arming warp routes no token");
  // Everything below reads or writes memory the previous kernels of the chain may own.
  ptx::pdl_wait();
  if (!early) ptx::pdl_launch_dependents();
  if (threadIdx.x == 0) LOOM_TRACE(kSmallWaited);
  // The previous run's GEMM has completed (the wait): clear its ids before this run's GEMM can
  // start (below) and before this run's ids (after the barrier, so they land after the clear).
  if (early && warp == kEarlyWarp && lane < kEarlyIdWords)
    cuda::atomic_ref<uint32_t, cuda::thread_scope_device>(rp.early_ids[lane])
        .store(0u, cuda::std::memory_order_relaxed);
  // CTA 0's tables are cleared, and every CTA of the cluster runs (distributed shared memory may be
  // accessed only then).
  cg::cluster_group cluster = cg::this_cluster();
  // The routing CTAs' barrier: the cluster's when several route, else the CTA's.
  auto sync_routing_ctas = [&] {
    if (route_ctas > 1)
      cluster.sync();
    else
      __syncthreads();
  };
  sync_routing_ctas();
  if (early && warp == kEarlyWarp) {
    // The clear is visible at GPU scope before any GEMM CTA can read the ids: those start only
    // once every CTA of this grid has let them (the first launch_dependents of a CTA counts).
    __threadfence();
    ptx::pdl_launch_dependents();
  }
  // Lane j < k of the token's warp then holds slot j in registers. CTA 0's tables are mapped after
  // the routing, which needs every register it can get.
  if (token < rp.tokens) {
    int32_t id;
    float weight;
    const bool has_nan = route_detail::route_one_token<V, false, kWarps>(rp, token, lane, warp, id, weight);
    uint32_t* masks0 = route_ctas > 1 ? cluster.map_shared_rank(masks, 0) : masks;
    int32_t* counters0 = route_ctas > 1 ? cluster.map_shared_rank(counters, 0) : counters;
    int32_t* route_id0 = route_ctas > 1 ? cluster.map_shared_rank(route_id, 0) : route_id;
    float* route_w0 = route_ctas > 1 ? cluster.map_shared_rank(route_w, 0) : route_w;
    if (has_nan && lane == 0) atomicAdd(&counters0[0], 1);
    if (lane < k) {
      route_id0[token * k + lane] = id;
      route_w0[token * k + lane] = weight;
      if (id >= 0 && id < E)
        atomicOr(&masks0[id], 1u << token);
      else
        atomicAdd(&counters0[1], 1);
    }
  }
  // Every routed bit, id and weight is in CTA 0 (the barrier orders the remote writes before it).
  sync_routing_ctas();
  if (rank != 0) return;
  if (threadIdx.x == 0) LOOM_TRACE(kSmallRouted);

  // Offsets: exclusive scan of the popcounts, thread e = expert e (E <= 512 <= kThreads), and in the
  // upper half-word the scan of "has rows" (the hit list's slots): both stay below 2^16.
  static_assert(kMaxRoutes < (1 << 16) && kGpuMaxExperts < (1 << 15), "two 16-bit scans in one word");
  const int count = int(threadIdx.x) < E ? __popc(masks[threadIdx.x]) : 0;
  const int count_hit = count | (count > 0 ? 1 << 16 : 0);
  int incl = count_hit;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int n = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += n;
  }
  if (lane == 31) warp_base[warp] = incl;  // the warp's sums
  __syncthreads();
  // The warp's base is the sum of the warps' sums before it: one reduction, not a barrier and a
  // second scan in warp 0 (on the small batches' path).
  const int base = __reduce_add_sync(0xffffffffu, lane < warp ? warp_base[lane] : 0);
  const int excl = base + incl - count_hit;
  const int offset = excl & 0xffff, hit_slot = excl >> 16;
  if (int(threadIdx.x) < E) {
    offsets[threadIdx.x] = offset;
    dp.offsets[threadIdx.x] = offset;
    if (int(threadIdx.x) == E - 1) dp.offsets[E] = offset + count;
    if (dp.hit_list != nullptr) {
      if (count > 0) dp.hit_list[1 + hit_slot] = make_int4(int(threadIdx.x), offset, count, 0);
      if (int(threadIdx.x) == E - 1) dp.hit_list[0] = make_int4(hit_slot + (count > 0 ? 1 : 0), 0, 0, 0);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) LOOM_TRACE(kSmallLayout);

  // Warp t writes token t's routes, lane j slot j (T <= kWarps, k <= 16): no loop, whose unrolled
  // copies the compiler laid out on the path (cold instruction fetch at every replay), and no
  // division for the token.
  static_assert(kSmallBatchMaxTokens <= kWarps && int(kGpuMaxTopk) <= 32, "a warp per token, a lane per slot");
  if (const int t = warp; t < rp.tokens && lane < k) {
    const int route = t * k + lane;
    const int32_t id = route_id[route];
    if (id >= 0 && id < E) {
      const int row = offsets[id] + __popc(masks[id] & ((1u << t) - 1u));
      dp.route_row[route] = row;
      dp.row_token[row] = t;
      dp.row_weight[row] = route_w[route];
    } else {
      dp.route_row[route] = -1;
    }
  }
  if (threadIdx.x == 0) {
    LayerStatus st;
    st.nan_tokens = uint32_t(counters[0]);
    st.dropped_routes = uint32_t(counters[1]);
    *dp.status = st;
    LOOM_TRACE(kSmallRouteEnd);
  }
}

// The quantising CTAs of the fused kernel (blockIdx.x >= route_ctas): qp's rows in token order.
__device__ __noinline__ void quantise_in_token_order(const QuantGatherParams qp, int route_ctas) {
  const int64_t tid = int64_t(int(blockIdx.x) - route_ctas) * kThreads + threadIdx.x,
                nth = int64_t(int(gridDim.x) - route_ctas) * kThreads;
  quant_detail::prefetch_first_units(qp, uint64_t(tid) >> 5);
  // The quantised rows and the output cleared here may still be read by the previous run.
  ptx::pdl_wait();
  ptx::pdl_launch_dependents();
  if (threadIdx.x == 0) LOOM_TRACE(kSmallWaited);
  quant_detail::quant_gather_body(qp, uint64_t(tid) >> 5, uint64_t(nth) >> 5, tid, nth);
  if (threadIdx.x == 0) LOOM_TRACE(kSmallQuantEnd);
}

// kRoute: route first (V slots per lane, T <= 32: token masks); else dispatch the top-k ids already
// in dp (up to kSmallBatchMaxRoutes: per-warp count tables).
// CTAs [0, route_ctas) route (one cluster) and CTA 0 dispatches; the CTAs after them (if any)
// quantise qp in token order meanwhile.
template <bool kRoute, int V>
__global__ void __launch_bounds__(kThreads, 1)
    route_dispatch_small_kernel(const RouteTopkParams rp, const DispatchParams dp, const QuantGatherParams qp,
                                int route_ctas) {
  extern __shared__ int32_t smem[];
  if (threadIdx.x == 0) LOOM_TRACE(kSmallStart);
  // The quantising CTAs call their code out of line, so that the routing CTAs fall through into
  // theirs: the chain waits on the routing, and their jump over the inlined quantiser missed the
  // cold instruction cache at every replay (journal, thirty-third session).
  if (int(blockIdx.x) >= route_ctas) {
    quantise_in_token_order(qp, route_ctas);
    return;
  }
  if constexpr (kRoute) {
    route_dispatch_by_token_masks<V>(rp, dp, route_ctas, smem);
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
  return routing.scoring == Scoring::softmax && experts <= kGpuMaxExperts && tokens <= kSmallBatchMaxTokens &&
         topk <= int(kGpuMaxTopk);
}

// One SM routes up to 8 tokens; beyond, 32 tokens on one SM are issue-bound, while a cluster costs
// its barriers and whole-cluster grid at the smallest batches; four CTAs measured best from 16
// tokens (journal).
int route_dispatch_small_ctas(int tokens) { return tokens <= kTokensPerRouteCta ? 1 : kMaxRouteCtas; }

bool dispatch_small_fits(int tokens, int topk, int experts) {
  return experts <= kGpuMaxExperts && int64_t(tokens) * topk <= kSmallBatchMaxRoutes;
}

namespace {
// quant_ctas: extra CTAs that quantise qp (0: none). The routing CTAs (route_dispatch_small_ctas)
// come first; the quantising CTAs follow, rounded up to whole clusters.
template <bool kRoute, int V>
void launch_one(const RouteTopkParams& rp, const DispatchParams& dp, const QuantGatherParams& qp, int quant_ctas,
                cudaStream_t stream, bool pdl) {
  const size_t smem = Layout::bytes(dp.experts);
  ensure_dynamic_smem(route_dispatch_small_kernel<kRoute, V>, smem);
  const int route_ctas = kRoute ? route_dispatch_small_ctas(rp.tokens) : 1;
  const int quant_clusters = (quant_ctas + route_ctas - 1) / route_ctas;
  launch_kernel_clustered(route_dispatch_small_kernel<kRoute, V>, dim3(route_ctas * (1 + quant_clusters)),
                          dim3(kThreads), smem, stream, pdl, unsigned(route_ctas), rp, dp, qp, route_ctas);
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
  if (rp.bin_counts) throw Error("route_dispatch_small: expert bins are filled by launch_route_quant only");
  if (rp.tokens == 0) return;
  if (rp.early_ids && (route_dispatch_small_ctas(rp.tokens) != 1 || int64_t(rp.tokens) * rp.topk > kEarlyIdWords))
    throw Error("route_dispatch_small: early ids need one routing CTA and at most " + std::to_string(kEarlyIdWords) +
                " routes");
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
