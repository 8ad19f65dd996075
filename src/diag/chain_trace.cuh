// Chain tracer: where the time of one pipeline run goes between and inside its kernels.
//
// Built only with -DLOOM_CHAIN_TRACE=ON (CMake option); otherwise LOOM_TRACE(...) compiles to
// nothing and the kernels are exactly the production ones. Each traced point stamps %globaltimer
// (ns, one clock for every SM) as the first and the last time any CTA reached it, so one run gives
// e.g. "the GEMM's first CTA returned from its PDL wait 1.2 us after the routing CTA wrote the
// layout". `loom bench --trace-chain N` prints the medians over N cold-L2 graph replays. Each point
// also keeps the time each CTA (blockIdx.x < kMaxCtas) last reached it, and the GEMM's CTAs their
// SM, so the bench prints how the CTAs spread and which SMs end late.
//
// Each translation unit that includes this header gets its own set of device arrays (no
// relocatable device code needed) and registers them with the host-side registry at start-up.
#pragma once

#include <cstdint>
#include <vector>

namespace loom::trace {

// Traced points, in chain order. Names in chain_trace.cpp.
enum Event : int {
  kSmallStart, kSmallWaited, kSmallRouted, kSmallLayout, kSmallRouteEnd, kSmallQuantEnd,
  kRouteStart, kRouteWaited, kRouteEnd,
  kRankLoaded, kRankMax, kRankRanked, kRankWeighted,
  kDqStart, kDqEarlyDone, kDqWaited, kDqCounted, kDqLayout, kDqScattered, kDqEnd,
  kDispatchStart, kDispatchWaited, kDispatchCounted, kDispatchSlices, kDispatchScanned, kDispatchScattered,
  kDispatchEnd, kQuantStart, kQuantWaited, kQuantEnd,
  kGemmStart, kGemmWaited, kGemmUnits, kGemmProducerRole, kGemmFirstDecoded, kGemmFirstRows, kGemmFirstTma,
  kGemmStageFull, kGemmEpilogue, kGemmEnd, kGemmSm,
  kEventCount
};
const char* event_name(int event);

// Per CTA, the last time each of the first kMaxCtas CTAs (blockIdx.x) of a kernel reached a point
// (0: never), so the spread between the first and the last CTA can be read as a distribution.
inline constexpr int kMaxCtas = 1024;

struct Stamps {
  std::vector<uint64_t> first, last;  // [kEventCount]; first = UINT64_MAX / last = 0 when never reached
  std::vector<uint64_t> cta;          // [kEventCount][kMaxCtas]
};

bool enabled();              // built with LOOM_CHAIN_TRACE
void reset(void* stream);    // cudaStream_t; enqueues the reset of every unit's arrays
Stamps read();               // synchronous; merged over every unit

using ResetFn = void (*)(void*);
using ReadFn = void (*)(Stamps&);
int register_unit(ResetFn reset, ReadFn read);

}  // namespace loom::trace

#if defined(LOOM_CHAIN_TRACE) && defined(__CUDACC__)
#include <cuda_runtime.h>

#include "common/cuda_check.hpp"

namespace loom::trace {
namespace {
__device__ unsigned long long g_first[kEventCount];
__device__ unsigned long long g_last[kEventCount];
__device__ unsigned long long g_cta[kEventCount * kMaxCtas];

__device__ __forceinline__ void stamp(int event) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  atomicMin(&g_first[event], t);
  atomicMax(&g_last[event], t);
  if (blockIdx.x < kMaxCtas) atomicMax(&g_cta[event * kMaxCtas + blockIdx.x], t);
}
// The CTA's SM (%smid + 1) as its per-CTA value of `event` (no time).
__device__ __forceinline__ void stamp_sm(int event) {
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  if (blockIdx.x < kMaxCtas) g_cta[event * kMaxCtas + blockIdx.x] = sm + 1;
}

void reset_unit(void* stream) {
  static const std::vector<unsigned long long> first(kEventCount, ~0ull), last(kEventCount, 0ull);
  LOOM_CUDA_CHECK(cudaMemcpyToSymbolAsync(g_first, first.data(), sizeof(g_first), 0, cudaMemcpyHostToDevice,
                                          static_cast<cudaStream_t>(stream)));
  LOOM_CUDA_CHECK(cudaMemcpyToSymbolAsync(g_last, last.data(), sizeof(g_last), 0, cudaMemcpyHostToDevice,
                                          static_cast<cudaStream_t>(stream)));
  void* cta = nullptr;
  LOOM_CUDA_CHECK(cudaGetSymbolAddress(&cta, g_cta));
  LOOM_CUDA_CHECK(cudaMemsetAsync(cta, 0, sizeof(g_cta), static_cast<cudaStream_t>(stream)));
}
void read_unit(Stamps& s) {
  unsigned long long first[kEventCount], last[kEventCount];
  static std::vector<unsigned long long> cta(size_t(kEventCount) * kMaxCtas);
  LOOM_CUDA_CHECK(cudaMemcpyFromSymbol(first, g_first, sizeof(first)));
  LOOM_CUDA_CHECK(cudaMemcpyFromSymbol(last, g_last, sizeof(last)));
  LOOM_CUDA_CHECK(cudaMemcpyFromSymbol(cta.data(), g_cta, sizeof(g_cta)));
  for (int i = 0; i < kEventCount; ++i) {
    if (first[i] < s.first[size_t(i)]) s.first[size_t(i)] = first[i];
    if (last[i] > s.last[size_t(i)]) s.last[size_t(i)] = last[i];
  }
  for (size_t i = 0; i < cta.size(); ++i) s.cta[i] = cta[i] > s.cta[i] ? cta[i] : s.cta[i];
}
[[maybe_unused]] const int g_registered = register_unit(&reset_unit, &read_unit);
}  // namespace
}  // namespace loom::trace

// One thread per CTA should call it (the atomics are per call).
#define LOOM_TRACE(event) ::loom::trace::stamp(::loom::trace::event)
#define LOOM_TRACE_SM(event) ::loom::trace::stamp_sm(::loom::trace::event)
#else
#define LOOM_TRACE(event) ((void)0)
#define LOOM_TRACE_SM(event) ((void)0)
#endif
