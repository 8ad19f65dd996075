// The deterministic combine's route rows (GemmFp8Params::combine == store): four consecutive
// weighted values of one route row, fp32 (16 bytes), or with GemmFp8Params::store_bf16 each rounded
// to bf16, nearest even (8 bytes; the ffn layer's deterministic GEMM 2, docs/numerics.md).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace loom::gemm {

// out: the GEMM's output, [rows, n_cols] fp32 or (bf16) [rows, n_cols] bf16; n a multiple of 4.
__device__ __forceinline__ void store_route_quad(float* out, int bf16, int64_t row, int n_cols, int n, float v0,
                                                 float v1, float v2, float v3) {
  if (bf16) {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v0, v1), hi = __floats2bfloat162_rn(v2, v3);
    *reinterpret_cast<uint2*>(reinterpret_cast<uint16_t*>(out) + row * n_cols + n) =
        make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
  } else {
    *reinterpret_cast<float4*>(out + row * n_cols + n) = make_float4(v0, v1, v2, v3);
  }
}

}  // namespace loom::gemm
