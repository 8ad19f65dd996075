#include "bench/fill_random.cuh"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "common/cuda_check.hpp"

namespace loom::bench {

namespace {
__device__ __forceinline__ float hash_uniform(uint64_t seed, uint64_t i) {
  uint64_t x = seed ^ (i * 0x9e3779b97f4a7c15ull);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return float(x >> 40) * 0x1.0p-23f - 1.0f;  // [-1, 1)
}

// One kernel, two element types: the output format is the only difference.
template <bool kFp8>
__global__ void fill_random_kernel(void* dst, int64_t count, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = hash_uniform(seed, uint64_t(i));
    if constexpr (kFp8) {
      static_cast<uint8_t*>(dst)[i] = __nv_cvt_float_to_fp8(v * 4.0f, __NV_SATFINITE, __NV_E4M3);
    } else {
      static_cast<__nv_bfloat16*>(dst)[i] = __float2bfloat16_rn(v);
    }
  }
}
}  // namespace

void fill_random_e4m3(void* dst, int64_t count, uint64_t seed, cudaStream_t stream) {
  fill_random_kernel<true><<<1024, 256, 0, stream>>>(dst, count, seed);
  LOOM_CUDA_CHECK_LAUNCH();
}

void fill_random_bf16(void* dst, int64_t count, uint64_t seed, cudaStream_t stream) {
  fill_random_kernel<false><<<1024, 256, 0, stream>>>(dst, count, seed);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::bench
