// The BF16 grouped GEMM's host entry: checks, TMA descriptors, arguments, launch.
#include <cuda.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>

#include "common/cuda_check.hpp"
#include "gemm/gemm_bf16.hpp"
#include "gemm/gemm_bf16_launch.cuh"
#include "gemm/instances/instances.cuh"

namespace loom {

namespace {

// The pairs the current device holds at once, asked once per device (an SM group with an odd SM
// count leaves one SM out of the pairs).
template <class Kernel>
int resident_pairs() {
  static std::mutex m;
  static std::map<int, int> by_device;
  int dev = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(m);
  auto it = by_device.find(dev);
  if (it == by_device.end())
    it = by_device.emplace(dev, gemm::max_active_clusters<Kernel>(gemm::launch_smem_bytes<Kernel>)).first;
  return it->second;
}

}  // namespace

void launch_gemm_bf16(const GemmBf16Params& p, const DeviceInfo& device, cudaStream_t stream, bool pdl) {
  static const std::string who = "bf16 GEMM (tokens on M): ";
  const bool act = p.epilogue == Bf16Epilogue::act;
  if (p.n <= 0 || p.k <= 0 || p.n % 16 || p.k % 16)
    throw Error(who + "N and K must be positive multiples of 16, got N=" + std::to_string(p.n) +
                ", K=" + std::to_string(p.k));
  if (act && (p.inter <= 0 || p.n != 2 * p.inter))
    throw Error(who + "the SiLU*up epilogue runs w13: N = 2 inter, got N=" + std::to_string(p.n) + ", inter=" +
                std::to_string(p.inter));
  if (p.cluster != 1 && p.cluster != 2) throw Error(who + "cluster must be 1 or 2, got " + std::to_string(p.cluster));
  if (p.experts <= 0 || p.experts > kGpuMaxExperts)
    throw Error(who + "experts must be in [1, " + std::to_string(kGpuMaxExperts) + "]");
  if (!p.weights || !p.x || !p.offsets || !p.out) throw Error(who + "null device pointer");
  if (int64_t(p.experts) * p.n >= (int64_t(1) << 31) || p.x_rows <= 0 || p.x_rows >= (int64_t(1) << 31))
    throw Error(who + "sizes exceed the kernel's 32-bit coordinates");
  if (reinterpret_cast<uintptr_t>(p.weights) % 16 || reinterpret_cast<uintptr_t>(p.x) % 16 ||
      reinterpret_cast<uintptr_t>(p.out) % 16)
    throw Error(who + "weights, rows and the output must be 16-byte aligned");
  const bool tokens = p.row_token != nullptr;
  if (tokens && !act) throw Error(who + "A by token (row_token) is GEMM 1's (the act epilogue)");
  if (tokens && p.out_rows <= 0) throw Error(who + "A by token needs out_rows (the intermediate's rows)");
  // Persistent: one CTA per SM (pairs: as many as fit at once); the row tiles are known only on the
  // device.
  using namespace gemm;
  auto launch = [&]<class K>(int grid) { launch_bf16_instance<K>(p, grid, stream, pdl); };
  if (p.cluster == 1) {
    if (tokens)
      launch.operator()<Sm90Bf16TmActTokens>(device.sm_count);
    else if (act)
      launch.operator()<Sm90Bf16TmAct>(device.sm_count);
    else
      launch.operator()<Sm90Bf16TmRows>(device.sm_count);
    return;
  }
  // (Every pair instance has the same shared memory and registers: one count serves them all.)
  const int pairs = std::min(device.sm_count / 2, resident_pairs<Sm90Bf16TmRowsPair>());
  if (pairs < 1) throw Error(who + "no CTA pair fits on the device");
  if (tokens)
    launch.operator()<Sm90Bf16TmActPairTokens>(2 * pairs);
  else if (act)
    launch.operator()<Sm90Bf16TmActPair>(2 * pairs);
  else
    launch.operator()<Sm90Bf16TmRowsPair>(2 * pairs);
}

}  // namespace loom
