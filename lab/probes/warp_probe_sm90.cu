#include "probes/warp_probe_sm90.cuh"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <vector>

#include "probes/probe_launch.hpp"
#include "common/cuda_check.hpp"
#include "route/route_topk_device.cuh"

namespace loom::bench {
namespace {

constexpr int kPasses = 8;         // passes per launch: the first fetches uncached code, the rest run warm
constexpr int kChainSteps = 256;   // dependent steps per pass of a collective's chain
constexpr int kRankSlots = 8;      // V of E = 256
constexpr int kRankTopk = 8;

enum class Step { add, redux_max, ballot, shfl_idx, match_any, argmax_round, routing_ranking, two_best_ranking };

// One dependent step of `kStep` on v (the rankers are timed per round, not here).
template <Step kStep>
__device__ __forceinline__ uint32_t step(uint32_t v, int lane) {
  constexpr unsigned kAll = 0xffffffffu;
  if constexpr (kStep == Step::add) {
    return v * 3u + uint32_t(lane);  // one IMAD: the ALU's dependent latency, for scale
  } else if constexpr (kStep == Step::redux_max) {
    return __reduce_max_sync(kAll, v) + uint32_t(lane);
  } else if constexpr (kStep == Step::ballot) {
    return __ballot_sync(kAll, v & 1u) + uint32_t(lane);
  } else if constexpr (kStep == Step::shfl_idx) {
    return __shfl_sync(kAll, v, int(v + 1u) & 31) + 1u;
  } else if constexpr (kStep == Step::match_any) {
    return __match_any_sync(kAll, v) + uint32_t(lane);
  } else {  // argmax_round: the reduction, the ballot and the lowest-lane test of take_best
    const uint32_t top = __reduce_max_sync(kAll, v);
    const unsigned tied = __ballot_sync(kAll, v == top);
    const bool won = v == top && (tied & ((1u << lane) - 1u)) == 0u;
    return won ? v >> 1 : v;
  }
}

// cycles[p]: pass p's cycles per step (per round for the rankers).
template <Step kStep>
__global__ void __launch_bounds__(32) warp_probe_kernel(const uint32_t* keys, float* cycles, uint32_t* sink) {
  const int lane = int(threadIdx.x);
  uint32_t acc = 0;
  for (int p = 0; p < kPasses; ++p) {
    if constexpr (kStep == Step::routing_ranking || kStep == Step::two_best_ranking) {
      uint32_t key[kRankSlots];
      float val[kRankSlots];
#pragma unroll
      for (int s = 0; s < kRankSlots; ++s) {
        key[s] = keys[(p * 32 + lane) * kRankSlots + s];
        val[s] = float(s);
      }
      __syncwarp();
      const long long t0 = clock64();
      [[maybe_unused]] route_detail::WarpRanker<kRankSlots> ranker;
      for (int r = 0; r < kRankTopk; ++r) {
        float v;
        if constexpr (kStep == Step::routing_ranking)
          acc += route_detail::take_best<kRankSlots>(key, val, lane, v);
        else
          acc += ranker.take(key, val, lane, v);
      }
      __syncwarp();
      const long long t1 = clock64();
      if (lane == 0) cycles[p] = float(t1 - t0) / kRankTopk;
    } else {
      uint32_t v = keys[p * 32 + lane];
      __syncwarp();
      const long long t0 = clock64();
#pragma unroll 16
      for (int i = 0; i < kChainSteps; ++i) v = step<kStep>(v, lane);
      __syncwarp();
      const long long t1 = clock64();
      acc += v;
      if (lane == 0) cycles[p] = float(t1 - t0) / kChainSteps;
    }
  }
  if (acc == 0x9e3779b9u) sink[lane] = acc;  // keeps the chains; (almost) never stores
}

struct Variant {
  const char* name;
  void (*kernel)(const uint32_t*, float*, uint32_t*);
};

}  // namespace

std::string run_warp_probe(const WarpProbeOptions& opt, std::ostream& log) {
  probe_device("warp-probe");
  // Distinct random keys (no ties: the ranking's rounds then each remove one slot), as the
  // routing's order-preserving keys of random logits would be.
  const int n = kPasses * 32 * kRankSlots;
  std::vector<uint32_t> host(size_t(n), 0u);
  uint32_t x = 0x12345678u;
  for (int i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    host[size_t(i)] = (x & ~0xffu) | uint32_t(i % 256) | 0x80000000u;
  }
  uint32_t *keys = nullptr, *sink = nullptr;
  float* cycles = nullptr;
  LOOM_CUDA_CHECK(cudaMalloc(&keys, size_t(n) * 4));
  LOOM_CUDA_CHECK(cudaMalloc(&sink, 32 * 4));
  LOOM_CUDA_CHECK(cudaMalloc(&cycles, kPasses * 4));
  LOOM_CUDA_CHECK(cudaMemcpy(keys, host.data(), size_t(n) * 4, cudaMemcpyHostToDevice));

  const Variant variants[] = {
      {"integer multiply-add (IMAD)", warp_probe_kernel<Step::add>},
      {"redux.sync.max + add", warp_probe_kernel<Step::redux_max>},
      {"ballot + add", warp_probe_kernel<Step::ballot>},
      {"shfl.idx + add", warp_probe_kernel<Step::shfl_idx>},
      {"match.any + add", warp_probe_kernel<Step::match_any>},
      {"arg-max round: redux, ballot, lowest-lane test", warp_probe_kernel<Step::argmax_round>},
      {"routing round (take_best, V=8), per round of k=8", warp_probe_kernel<Step::routing_ranking>},
      {"large-batch round (WarpRanker, V=8), per round", warp_probe_kernel<Step::two_best_ranking>},
  };
  std::ostringstream out;
  char line[200];
  std::snprintf(line, sizeof line, "%-50s %12s %12s\n", "warp step (one warp, dependent chain)", "pass 1",
                "passes 2-8");
  out << line;
  std::snprintf(line, sizeof line, "%-50s %12s %12s\n", "", "cycles", "cycles");
  out << line;
  for (const Variant& v : variants) {
    std::vector<float> first, warm;
    for (int r = 0; r < opt.repeats; ++r) {
      time_launch_us([&] { v.kernel<<<1, 32>>>(keys, cycles, sink); });
      float c[kPasses];
      LOOM_CUDA_CHECK(cudaMemcpy(c, cycles, sizeof c, cudaMemcpyDeviceToHost));
      first.push_back(c[0]);
      std::vector<float> rest(c + 1, c + kPasses);
      std::sort(rest.begin(), rest.end());
      warm.push_back(rest[rest.size() / 2]);
    }
    std::sort(first.begin(), first.end());
    std::sort(warm.begin(), warm.end());
    std::snprintf(line, sizeof line, "%-50s %12.1f %12.1f\n", v.name, first[first.size() / 2],
                  warm[warm.size() / 2]);
    out << line;
    log << "warp-probe: " << v.name << " done\n";
  }
  LOOM_CUDA_CHECK(cudaFree(keys));
  LOOM_CUDA_CHECK(cudaFree(sink));
  LOOM_CUDA_CHECK(cudaFree(cycles));
  return out.str();
}

}  // namespace loom::bench
