#include "gemm/to_bf16_sm90.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <string>

#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "loom/types.hpp"
#include "ptx/pdl.cuh"

namespace loom {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) to_bf16_kernel(const ToBf16Params p) {
  ptx::pdl_launch_dependents();
  // Before any global access: the accumulator comes from the kernel before this one.
  ptx::pdl_wait();
  const int64_t n4 = p.count / 4;
  const float4* in = reinterpret_cast<const float4*>(p.in);
  uint2* out = reinterpret_cast<uint2*>(p.out);
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n4; i += int64_t(gridDim.x) * kThreads) {
    const float4 v = __ldcs(in + i);  // read once
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
    out[i] = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
  }
}

}  // namespace

void launch_to_bf16(const ToBf16Params& p, int sm_count, cudaStream_t stream, bool pdl) {
  static const std::string who = "to_bf16: ";
  if (p.count < 0 || p.count % 4 != 0) throw Error(who + "count must be a multiple of 4, got " + std::to_string(p.count));
  if (p.count == 0) return;
  if (!p.in || !p.out) throw Error(who + "null buffer");
  if ((reinterpret_cast<uintptr_t>(p.in) & 15u) != 0 || (reinterpret_cast<uintptr_t>(p.out) & 7u) != 0)
    throw Error(who + "in must be 16-byte and out 8-byte aligned");
  if (sm_count <= 0) throw Error(who + "sm_count must be positive, got " + std::to_string(sm_count));
  const int64_t blocks = std::min<int64_t>((p.count / 4 + kThreads - 1) / kThreads, int64_t(8) * sm_count);
  launch_kernel(to_bf16_kernel, dim3(unsigned(blocks)), dim3(kThreads), 0, stream, pdl, p);
}

}  // namespace loom
