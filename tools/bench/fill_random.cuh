// Device-side random fill for benchmark operands (never zeros: zeros run faster than real data).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace loom::bench {

// Uniform values in [-1, 1) stored as e4m3 codes (never NaN) or bf16, from a counter hash of (seed, i).
void fill_random_e4m3(void* dst, int64_t count, uint64_t seed, cudaStream_t stream);
void fill_random_bf16(void* dst, int64_t count, uint64_t seed, cudaStream_t stream);

}  // namespace loom::bench
