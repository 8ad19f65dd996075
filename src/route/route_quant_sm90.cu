#include "route/route_quant_sm90.cuh"

#include <algorithm>
#include <string>

#include "diag/chain_trace.cuh"
#include "common/launch.hpp"
#include "contract/device_layout.hpp"
#include "ptx/pdl.cuh"
#include "quant/quant_gather_device.cuh"
#include "route/route_topk_device.cuh"

namespace loom {

namespace {

constexpr int kWarpsPerCta = 4;  // one token per warp
constexpr int kThreads = kWarpsPerCta * 32;
// Quantising warps take two passes of 4 (token, group) units at a time, all loads first
// (quant_token_order_body): faster at large T than one pass or four (journal, thirteenth session).
constexpr int kQuantPasses = 2;

// The token's k routes into their experts' bins (RouteTopkParams::bin_counts): one returning atomic
// per route; the status counters were zeroed by the clear kernel before this launch.
__device__ __forceinline__ void append_to_bins(const RouteTopkParams& rp, int64_t token, int lane, int32_t id,
                                               float weight, bool has_nan) {
  if (lane < rp.topk) {
    bool kept = false;
    if (unsigned(id) < unsigned(rp.experts)) {
      const int slot = atomicAdd(rp.bin_counts + id * kBinCountStride, 1);
      if (slot < rp.bin_stride) {
        const int64_t at = int64_t(id) * rp.bin_stride + slot;
        rp.bin_token[at] = int32_t(token);
        rp.bin_weight[at] = weight;
        kept = true;
      }
    }
    if (!kept) atomicAdd(&rp.status->dropped_routes, 1u);
  }
  if (lane == 0 && has_nan) atomicAdd(&rp.status->nan_tokens, 1u);
}

template <int V, bool kSigmoid>
__global__ void __launch_bounds__(kThreads, 1) route_quant_kernel(const RouteTopkParams rp, const QuantGatherParams qp,
                                                               int route_ctas) {
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  const bool routing_cta = int(blockIdx.x) < route_ctas;
  if (threadIdx.x == 0) {
    if (routing_cta) LOOM_TRACE(kRouteStart); else LOOM_TRACE(kQuantStart);
  }
  if (routing_cta) {
    const int64_t token = int64_t(blockIdx.x) * kWarpsPerCta + warp;
    if (token < rp.tokens) route_detail::prefetch_token_logits(rp, token, lane);
  } else {
    quant_detail::prefetch_first_token_item<kQuantPasses>(
        qp, uint64_t(int64_t(blockIdx.x) - route_ctas) * kWarpsPerCta + uint64_t(warp));
  }
  // Every CTA, routing or quantising: the buffers written here may still be read by the previous
  // run's kernels.
  ptx::pdl_wait();
  ptx::pdl_launch_dependents();
  if (threadIdx.x == 0) {
    if (routing_cta) LOOM_TRACE(kRouteWaited); else LOOM_TRACE(kQuantWaited);
  }
  if (routing_cta) {
    const int64_t token = int64_t(blockIdx.x) * kWarpsPerCta + warp;
    int32_t id;
    float weight;
    // This launch runs for the token_fragments GEMM (T >= 960 on the preset): issue-bound, so the
    // two-best ranking.
    if (token < rp.tokens) {
      const bool has_nan =
          route_detail::route_one_token<V, kSigmoid, kWarpsPerCta, true>(rp, token, lane, warp, id, weight);
      if (rp.bin_counts) append_to_bins(rp, token, lane, id, weight, has_nan);
    }
  } else {
    const int64_t block = int64_t(blockIdx.x) - route_ctas, blocks = int64_t(gridDim.x) - route_ctas;
    const int64_t tid = block * kThreads + threadIdx.x, nth = blocks * kThreads;
    quant_detail::quant_token_order_body<kQuantPasses>(qp, uint64_t(tid) >> 5, uint64_t(nth) >> 5, tid, nth);
  }
#ifdef LOOM_CHAIN_TRACE
  __syncthreads();  // the CTA's end (trace builds only)
  if (threadIdx.x == 0) {
    if (routing_cta) LOOM_TRACE(kRouteEnd); else LOOM_TRACE(kQuantEnd);
  }
#endif
}

template <bool kSigmoid>
void launch_for_scoring(const RouteTopkParams& rp, const QuantGatherParams& qp, int slots, int route_ctas,
                        int quant_ctas, cudaStream_t stream, bool pdl) {
  const dim3 grid(unsigned(route_ctas + quant_ctas)), block(kThreads);
  switch (slots) {
    case 1: launch_kernel(route_quant_kernel<1, kSigmoid>, grid, block, 0, stream, pdl, rp, qp, route_ctas); break;
    case 2: launch_kernel(route_quant_kernel<2, kSigmoid>, grid, block, 0, stream, pdl, rp, qp, route_ctas); break;
    case 4: launch_kernel(route_quant_kernel<4, kSigmoid>, grid, block, 0, stream, pdl, rp, qp, route_ctas); break;
    case 8: launch_kernel(route_quant_kernel<8, kSigmoid>, grid, block, 0, stream, pdl, rp, qp, route_ctas); break;
    default: launch_kernel(route_quant_kernel<16, kSigmoid>, grid, block, 0, stream, pdl, rp, qp, route_ctas); break;
  }
}

}  // namespace

void launch_route_quant(const RouteTopkParams& rp, const QuantGatherParams& qp, cudaStream_t stream, bool pdl) {
  check_route_topk(rp);
  if (rp.early_ids) throw Error("route_quant: early expert ids are written by launch_route_dispatch_small only");
  check_quant_gather(qp);
  if (qp.route_row != nullptr || qp.tokens != rp.tokens)
    throw Error("route_quant: the quantisation must be token order over the routed tokens");
  if (rp.tokens == 0) return;
  int slots = 1;  // per lane: ceil(E / 32) rounded up to a power of two
  while (slots * 32 < rp.experts) slots *= 2;
  const int64_t route_ctas = (int64_t(rp.tokens) + kWarpsPerCta - 1) / kWarpsPerCta;
  // One warp per item (quant_token_order_body), or 16 float4 of the output's clear per thread
  // where that needs more.
  const int64_t zero4 = qp.zero_out ? int64_t(qp.tokens) * qp.zero_cols / 4 : 0;
  const int64_t quant_threads =
      std::max(int64_t(rp.tokens) * quant_detail::items_per_token<kQuantPasses>(qp.hidden_dim) * 32, (zero4 + 15) / 16);
  const int64_t quant_ctas = std::min<int64_t>((quant_threads + kThreads - 1) / kThreads, int64_t(1) << 20);
  if (route_ctas + quant_ctas > INT32_MAX) throw Error("route_quant: problem too large");
  if (rp.routing.scoring == Scoring::softmax)
    launch_for_scoring<false>(rp, qp, slots, int(route_ctas), int(quant_ctas), stream, pdl);
  else
    launch_for_scoring<true>(rp, qp, slots, int(route_ctas), int(quant_ctas), stream, pdl);
}

}  // namespace loom
