#include "dispatch/dispatch_quant_sm90.cuh"

#include <algorithm>
#include <string>

#include "diag/chain_trace.cuh"
#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "ptx/pdl.cuh"
#include "quant/quant_gather_device.cuh"

namespace loom {

namespace {

// CTA size: 512 threads, or 1024 from kWideMinTokens tokens on. The CTAs are few (at most one per
// SM: the masks fill shared memory) and the quantisation in them is bound by loads in flight; twice
// the warps pays from about a thousand tokens on, and costs below (half the CTAs rebuild the layout
// for the same work).
constexpr int kNarrowThreads = 512, kWideThreads = 1024;
constexpr int64_t kWideMinTokens = 1024;
constexpr int kIdBatch = 8;                   // top-k id (or token mask) loads in flight per thread
constexpr int kMaxWarps = 32;
constexpr size_t kMaxSmemBytes = 160 * 1024;  // masks + prefixes of E x ceil(T/32) words each

struct Smem {
  // Word-major, so the lanes of one token looking up different experts hit different banks.
  uint32_t* masks;     // [words][E]: bit t%32 of word t/32 = token t routes to the expert
  int32_t* prefix;     // [words][E]: tokens of the expert in the words before
  int32_t* offsets;    // [E+1]
  int32_t* warp_base;  // [kMaxWarps]
  int32_t* counters;   // [0]: NaN tokens, [1]: dropped routes
  static size_t bytes(int experts, int words) {
    return (size_t(experts) * words * 2 + experts + 1 + kMaxWarps + 2) * 4;
  }
};

// Sorted row of slot j of token t, from the CTA's own layout.
struct RowsFromMasks {
  const uint32_t* masks;
  const int32_t* prefix;
  const int32_t* offsets;
  const int32_t* ids;
  int experts, words;
  __device__ __forceinline__ int32_t operator()(const QuantGatherParams& p, uint32_t t, int j) const {
    const int32_t e = ids[int64_t(t) * p.topk + j];
    if (e < 0 || e >= experts) return -1;
    const int w = int(t / 32u);
    return offsets[e] + prefix[w * experts + e] + __popc(masks[w * experts + e] & ((1u << (t % 32u)) - 1u));
  }
};

// kMasks: DispatchParams::token_masks given (copied, not counted): a kernel of its own, so the
// counting kernel's code and registers stay as they were.
template <int kThreads, bool kMasks>
__global__ void __launch_bounds__(kThreads)
    dispatch_quant_kernel(const DispatchParams dp, const QuantGatherParams qp, int quantise_early) {
  constexpr int kWarps = kThreads / 32;
  static_assert(kGpuMaxExperts <= kThreads && kWarps <= kMaxWarps && kThreads % 32 == 0,
                "offset scan: one expert per thread, one warp of warp sums");
  extern __shared__ int32_t smem_raw[];
  const int E = dp.experts, k = dp.topk, T = dp.tokens, words = (T + 31) / 32;
  const int64_t R = int64_t(T) * k;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  Smem s;
  s.masks = reinterpret_cast<uint32_t*>(smem_raw);
  s.prefix = smem_raw + size_t(E) * words;
  s.offsets = s.prefix + size_t(E) * words;
  s.warp_base = s.offsets + E + 1;
  s.counters = s.warp_base + kMaxWarps;
  if (threadIdx.x == 0) LOOM_TRACE(kDqStart);
  if (!kMasks)
    for (int i = threadIdx.x; i < E * words; i += kThreads) s.masks[i] = 0u;
  if (threadIdx.x < 2) s.counters[threadIdx.x] = 0;
  // quantise_early: the kernel before this one (the routing) triggers its dependents only after its
  // own PDL wait, so everything before it has completed by now: the hidden rows (which the routing
  // does not write) are quantised and the output cleared before our wait.
  // Otherwise only an L2 prefetch of those rows is safe before the wait.
  const uint64_t first_warp = (uint64_t(blockIdx.x) * kThreads + threadIdx.x) >> 5;
  quant_detail::UnitCodes first_pass{};
  QuantGatherParams qp_rest = qp;
  if (quantise_early) {
    first_pass = quant_detail::quantize_first_pass(qp, first_warp);
    quant_detail::clear_output(qp, int64_t(blockIdx.x) * kThreads + threadIdx.x, int64_t(gridDim.x) * kThreads);
    qp_rest.zero_out = nullptr;
    qp_rest.zero_words = nullptr;
    if (threadIdx.x == 0) LOOM_TRACE(kDqEarlyDone);
  } else {
    quant_detail::prefetch_first_units(qp, first_warp);
  }
  // Everything below reads what the routing kernel wrote, or writes what the previous run may
  // still read.
  ptx::pdl_wait();
  ptx::pdl_launch_dependents();
  if (threadIdx.x == 0) LOOM_TRACE(kDqWaited);
  __syncthreads();

  const bool writer = blockIdx.x == 0;
  int dropped = 0;
  if constexpr (kMasks) {
    // The routing kernel wrote the masks: every CTA copies them (as many words as T*k/8 ids at
    // E = 256), kIdBatch loads in flight per thread, no shared atomics.
    const int n = E * words;
    for (int base = 0; base < n; base += kThreads * kIdBatch) {
      uint32_t m[kIdBatch];
#pragma unroll
      for (int b = 0; b < kIdBatch; ++b) {
        const int i = base + b * kThreads + int(threadIdx.x);
        m[b] = i < n ? dp.token_masks[i] : 0u;
      }
#pragma unroll
      for (int b = 0; b < kIdBatch; ++b) {
        const int i = base + b * kThreads + int(threadIdx.x);
        if (i < n) s.masks[i] = m[b];
      }
    }
  }
  // Otherwise every CTA reads all ids: kIdBatch loads in flight per thread before their shared atomics.
  for (int64_t base = 0; !kMasks && base < R; base += int64_t(kThreads) * kIdBatch) {
    int32_t e[kIdBatch];
#pragma unroll
    for (int b = 0; b < kIdBatch; ++b) {
      const int64_t i = base + int64_t(b) * kThreads + threadIdx.x;
      e[b] = i < R ? dp.topk_ids[i] : 0;
    }
#pragma unroll
    for (int b = 0; b < kIdBatch; ++b) {
      const int64_t i = base + int64_t(b) * kThreads + threadIdx.x;
      if (i >= R) continue;
      const int t = int(i / k);
      if (e[b] >= 0 && e[b] < E)
        atomicOr(&s.masks[(t / 32) * E + e[b]], 1u << (t % 32));
      else
        ++dropped;
    }
  }
  if (writer) {
    if (dropped) atomicAdd(&s.counters[1], dropped);
    if (dp.nan_flags) {
      int nan_tokens = 0;
      for (int t = threadIdx.x; t < T; t += kThreads) nan_tokens += dp.nan_flags[t] != 0;
      nan_tokens = __reduce_add_sync(0xffffffffu, nan_tokens);
      if (lane == 0 && nan_tokens) atomicAdd(&s.counters[0], nan_tokens);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) LOOM_TRACE(kDqCounted);

  // Per expert (thread e): prefix popcounts over its words and its row count; then the exclusive
  // scan of the counts over experts.
  int count = 0;
  if (int(threadIdx.x) < E) {
    for (int w = 0; w < words; ++w) {
      s.prefix[w * E + threadIdx.x] = count;
      count += __popc(s.masks[w * E + threadIdx.x]);
    }
  }
  int incl = count;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int n = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += n;
  }
  if (lane == 31) s.warp_base[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const int total = lane < kWarps ? s.warp_base[lane] : 0;
    int run = total;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int n = __shfl_up_sync(0xffffffffu, run, d);
      if (lane >= d) run += n;
    }
    if (lane < kWarps) s.warp_base[lane] = run - total;
  }
  __syncthreads();
  const int offset = s.warp_base[warp] + incl - count;
  if (int(threadIdx.x) < E) {
    s.offsets[threadIdx.x] = offset;
    if (int(threadIdx.x) == E - 1) {
      s.offsets[E] = offset + count;
      // From masks, a route outside [0, E) has no bit: the routes without a row are the dropped ones.
      if (kMasks) s.counters[1] = int(R - (offset + count));
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) LOOM_TRACE(kDqLayout);

  // Every CTA holds the whole layout: the dispatch outputs are written by the grid, each route once.
  const RowsFromMasks rows{s.masks, s.prefix, s.offsets, dp.topk_ids, E, words};
  const int64_t tid = int64_t(blockIdx.x) * kThreads + threadIdx.x, nth = int64_t(gridDim.x) * kThreads;
  for (int64_t i = tid; i < R; i += nth) {
    const int t = int(i / k), j = int(i - int64_t(t) * k);
    const float weight = dp.topk_weights[i];
    const int32_t row = rows(qp, uint32_t(t), j);
    dp.route_row[i] = row;
    if (row >= 0) {
      dp.row_token[row] = t;
      dp.row_weight[row] = weight;
    }
  }
  if (writer) {
    for (int e = threadIdx.x; e <= E; e += kThreads) dp.offsets[e] = s.offsets[e];
    if (threadIdx.x == 0) {
      LayerStatus st;
      st.nan_tokens = uint32_t(s.counters[0]);
      st.dropped_routes = uint32_t(s.counters[1]);
      *dp.status = st;
    }
  }
  if (threadIdx.x == 0) LOOM_TRACE(kDqScattered);
  quant_detail::quant_gather_body(qp_rest, uint64_t(tid) >> 5, uint64_t(nth) >> 5, tid, nth, rows,
                                  quantise_early ? &first_pass : nullptr);
  if (threadIdx.x == 0) LOOM_TRACE(kDqEnd);
}

}  // namespace

bool dispatch_quant_fits(int64_t tokens, int64_t topk, int64_t experts) {
  const int64_t words = (tokens + 31) / 32;
  return tokens > 0 && experts <= kGpuMaxExperts &&
         int64_t(Smem::bytes(int(experts), int(words))) <= int64_t(kMaxSmemBytes) && tokens * topk <= INT32_MAX;
}

void launch_dispatch_quant(const DispatchParams& dp, const QuantGatherParams& qp, int grid_ctas, cudaStream_t stream,
                           bool pdl, bool after_wait_only_kernel) {
  static const std::string who = "dispatch_quant: ";
  if (dp.tokens < 0 || dp.topk <= 0 || dp.experts <= 0) throw Error(who + "bad shape");
  if (dp.tokens == 0) return;
  if (!dispatch_quant_fits(dp.tokens, dp.topk, dp.experts))
    throw Error(who + "batch outside the kernel's range (E <= 512, E * ceil(T/32) masks in shared memory)");
  if (!dp.topk_ids || !dp.topk_weights || !dp.offsets || !dp.route_row || !dp.row_token || !dp.row_weight || !dp.status)
    throw Error(who + "null device pointer");
  check_quant_gather(qp);
  if (qp.tokens != dp.tokens || qp.topk != dp.topk || qp.route_row != dp.route_row ||
      qp.padded_rows < int64_t(dp.tokens) * dp.topk)
    throw Error(who + "the quantisation must gather into this dispatch's sorted rows");
  const int words = (dp.tokens + 31) / 32;
  const size_t smem = Smem::bytes(dp.experts, words);
  const bool wide = dp.tokens >= kWideMinTokens, masks = dp.token_masks != nullptr;
  using Kernel = void (*)(const DispatchParams, const QuantGatherParams, int);
  static constexpr Kernel kernels[2][2] = {
      {dispatch_quant_kernel<kNarrowThreads, false>, dispatch_quant_kernel<kNarrowThreads, true>},
      {dispatch_quant_kernel<kWideThreads, false>, dispatch_quant_kernel<kWideThreads, true>}};
  const Kernel kernel = kernels[wide][masks];
  const int threads = wide ? kWideThreads : kNarrowThreads;
  ensure_dynamic_smem(kernel, kMaxSmemBytes);
  // As many CTAs as the quantisation has work for, at most grid_ctas (each builds the layout once).
  const int64_t needed = (quant_gather_threads(qp) + threads - 1) / threads;
  const int grid = int(std::max<int64_t>(1, std::min<int64_t>(needed, grid_ctas)));
  launch_kernel(kernel, dim3(grid), dim3(threads), smem, stream, pdl, dp, qp, after_wait_only_kernel ? 1 : 0);
}

}  // namespace loom
