// The BF16 grouped GEMM's host entry: checks, TMA descriptors, arguments, launch.
#include <cuda.h>

#include <string>

#include "common/cuda_check.hpp"
#include "gemm/gemm_bf16.hpp"
#include "gemm/gemm_bf16_launch.cuh"
#include "gemm/instances/instances.cuh"

namespace loom {

void check_gemm_bf16(const GemmBf16Params& p) {
  static const std::string who = "bf16 GEMM (tokens on M): ";
  const bool act = p.epilogue == Bf16Epilogue::act;
  if (p.n <= 0 || p.k <= 0 || p.n % 16 || p.k % 16)
    throw Error(who + "N and K must be positive multiples of 16, got N=" + std::to_string(p.n) +
                ", K=" + std::to_string(p.k));
  if (act && (p.inter <= 0 || p.n != 2 * p.inter))
    throw Error(who + "the SiLU*up epilogue runs w13: N = 2 inter, got N=" + std::to_string(p.n) + ", inter=" +
                std::to_string(p.inter));
  if (p.experts <= 0 || p.experts > kGpuMaxExperts)
    throw Error(who + "experts must be in [1, " + std::to_string(kGpuMaxExperts) + "]");
  if (!p.weights || !p.x || !p.offsets || !p.out) throw Error(who + "null device pointer");
  if (int64_t(p.experts) * p.n >= (int64_t(1) << 31) || p.x_rows <= 0 || p.x_rows >= (int64_t(1) << 31))
    throw Error(who + "sizes exceed the kernel's 32-bit coordinates");
  if (reinterpret_cast<uintptr_t>(p.weights) % 16 || reinterpret_cast<uintptr_t>(p.x) % 16 ||
      reinterpret_cast<uintptr_t>(p.out) % 16)
    throw Error(who + "weights, rows and the output must be 16-byte aligned");
}

void launch_gemm_bf16(const GemmBf16Params& p, const DeviceInfo& device, cudaStream_t stream, bool pdl) {
  check_gemm_bf16(p);
  const bool act = p.epilogue == Bf16Epilogue::act;
  // Persistent: one CTA per SM; the row tiles are known only on the device.
  if (p.weights_on_m) {
    if (act)
      gemm::launch_bf16_wm_instance<gemm::Sm90Bf16WmAct>(p, device.sm_count, stream, pdl);
    else
      gemm::launch_bf16_wm_instance<gemm::Sm90Bf16WmRows>(p, device.sm_count, stream, pdl);
    return;
  }
  if (act)
    gemm::launch_bf16_instance<gemm::Sm90Bf16TmAct>(p, device.sm_count, stream, pdl);
  else
    gemm::launch_bf16_instance<gemm::Sm90Bf16TmRows>(p, device.sm_count, stream, pdl);
}

}  // namespace loom
