#include "dispatch/expert_bins_clear_sm90.cuh"

#include <string>

#include "common/launch.hpp"
#include "loom/types.hpp"
#include "contract/device_layout.hpp"
#include "ptx/pdl.cuh"

namespace loom {
namespace {

constexpr int kThreads = 512;
constexpr int kClearMaxExperts = 4096;

__global__ void __launch_bounds__(kThreads) expert_bins_clear_kernel(const ExpertBinsClearParams p) {
  // The routing launch after us waits for our completion before its first atomic, so it may start
  // its prologue (logit prefetches) now.
  ptx::pdl_launch_dependents();
  ptx::pdl_wait();  // the previous run's GEMM may still be reading the counters
  for (int e = int(threadIdx.x); e < p.experts; e += kThreads) p.bin_counts[e * kBinCountStride] = 0;
  if (threadIdx.x == 0) *p.status = LayerStatus{};
}

}  // namespace

void launch_expert_bins_clear(const ExpertBinsClearParams& p, cudaStream_t stream, bool pdl) {
  if (!p.bin_counts || !p.status) throw Error("expert_bins_clear: null device pointer");
  if (p.experts <= 0 || p.experts > kClearMaxExperts)
    throw Error("expert_bins_clear: experts = " + std::to_string(p.experts) + " outside [1, " +
                std::to_string(kClearMaxExperts) + "]");
  launch_kernel(expert_bins_clear_kernel, dim3(1), dim3(kThreads), 0, stream, pdl, p);
}

}  // namespace loom
