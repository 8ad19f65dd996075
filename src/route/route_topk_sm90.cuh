// Routing on the GPU: router logits -> top-k expert ids and weights, one warp per token.
//
// Semantics are those of route_ref (src/route/route_ref.hpp), which documents them in full:
// softmax (optional soft-cap) or sigmoid (+bias, grouped) scoring, ranking with NaN last and ties
// to the lower id, optional renormalisation, x scale, slot 0 = best.
//
// Precision. Softmax ranks by the raw fp32 logit, so its ids equal the reference's bit for bit; its
// weights are fp32 (tanhf, expf) and agree with the double reference to ~1e-6 relative while the
// capped logits stay small (fp32 cannot hold a capped logit near 30 closer than ~1e-6). Sigmoid
// ranks by fp32 b = 1 / (1 + expf(-x)) + bias, so it can order two experts (or groups) whose double
// scores differ by a few fp32 ulps differently from the reference; its weights are recomputed in
// double for the k chosen experts and match the reference to fp32 rounding.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "loom/status.hpp"
#include "loom/types.hpp"

namespace loom {

// Each lane keeps ceil(E / 32) <= 16 scores in registers.
static_assert(kGpuMaxExperts <= 32 * 16, "the routing's per-lane score slots");

struct RouteTopkParams {
  const float* logits = nullptr;  // [T, E] fp32, device
  const float* bias = nullptr;    // [E] sigmoid only, may be nullptr (zeros); ignored by softmax
  int32_t* topk_ids = nullptr;    // [T, k]
  float* topk_weights = nullptr;  // [T, k]
  uint8_t* nan_flags = nullptr;   // [T]: 1 if the token has any NaN logit, else 0
  // Optional [ceil(T/32), E]: bit t % 32 of word (t / 32, e) = token t routes to expert e (the
  // dispatch+quantise kernel's token masks, so it need not count the ids). Every word is written,
  // bits of tokens >= T are 0. The routing's ids are always distinct and in [0, E).
  uint32_t* token_masks = nullptr;
  // Optional [kEarlyIdWords] early expert ids (device_layout.hpp; launch_route_dispatch_small only,
  // softmax, T * k <= kEarlyIdWords): token t's ids as soon as they are ranked, before its weights.
  uint32_t* early_ids = nullptr;
  // Optional expert bins, the register-loaded GEMM's rows without a dispatch kernel (launch_route_quant
  // only): lane j < k of token t appends the route to the bin of its expert e,
  //   slot = atomicAdd(bin_counts + e * kBinCountStride, 1); bin_token[e * bin_stride + slot] = t,
  // bin_weight[...] = weight, so a bin's order is whatever the atomics give. The E counters
  // (bin_counts[E * kBinCountStride], device_layout.hpp) and *status must be zero before the
  // launch (launch_expert_bins_clear); tokens with a NaN logit are counted into status->nan_tokens,
  // and a route without room (impossible: ids are distinct per token and bin_stride >= T) into
  // status->dropped_routes.
  int32_t* bin_counts = nullptr;  // [E * kBinCountStride]
  int32_t* bin_token = nullptr;   // [E, bin_stride]
  float* bin_weight = nullptr;    // [E, bin_stride]
  int bin_stride = 0;
  LayerStatus* status = nullptr;
  int tokens = 0, experts = 0, topk = 0;
  Routing routing;
};

// Throws loom::Error for what launch_route_topk rejects (below).
void check_route_topk(const RouteTopkParams& p);

// Enqueues the routing kernel on `stream`, with the programmatic-dependent-launch attribute when
// `pdl` (the kernel waits for its predecessor before touching memory). No host synchronisation.
// Throws loom::Error for unsupported sizes (E > 512, k > 16, k > E), a bad routing (loom::validate)
// or a null pointer; tokens == 0 launches nothing.
void launch_route_topk(const RouteTopkParams& p, cudaStream_t stream, bool pdl);

}  // namespace loom
