// Deterministic combine: out[t, n] = sum over slots j = 0..k-1, in slot order, of
// y[route_row[t*k + j], n] (dropped routes, -1, add nothing), in fp32 without atomics, so the result
// is bitwise identical run to run. y rows already carry their top-k weight (the GEMM's
// deterministic epilogue, device_layout.hpp).
//
// Exact arithmetic, per element: acc = 0.0f; then for j = 0..k-1 with route_row[t*k+j] >= 0,
// acc = acc + y[row, n] (one fp32 add each, round to nearest, no reassociation). A token whose routes
// are all dropped gets +0. With y_bf16 (the ffn layer's weighted rows, rounded to bf16 by GEMM 2),
// y[row, n] is that bf16 value widened exactly to fp32. With out_bf16 (the ffn layer's output), acc
// is then rounded to bf16 (nearest even), as gemm/to_bf16_sm90 rounds the fast combine's
// accumulator.
//
// Host-includable: plain declarations only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace loom {

struct CombineRowsParams {
  const float* y = nullptr;            // [R, N] weighted rows, 16-byte aligned; or
  const uint16_t* y_bf16 = nullptr;    // [R, N] bf16 weighted rows, 16-byte aligned (exactly one of the two)
  const int32_t* route_row = nullptr;  // [T*k]
  int tokens = 0, topk = 0, cols = 0;  // cols = N, a positive multiple of 4, of 8 with y_bf16 (16 in loom)
  float* out = nullptr;                // [T, N] fp32, 16-byte aligned; or
  uint16_t* out_bf16 = nullptr;        // [T, N] bf16, 8-byte aligned (exactly one of the two)
};

// Enqueues the kernel on `stream`; pdl: launch with the programmatic-dependent-launch attribute.
// T = 0 enqueues nothing. Throws loom::Error on a bad shape or misaligned pointer.
void launch_combine_rows(const CombineRowsParams& p, cudaStream_t stream, bool pdl);

}  // namespace loom
