// BF16 -> FP8 E4M3 quantisation of the hidden states with one fp32 scale per 1x128 group, fused
// with the gather into expert-sorted order: token t is quantised once and its codes and scales
// are written to each of its k sorted rows route_row[t*k + j] (dropped routes, -1, are skipped).
// Arithmetic is bit for bit quantize_1x128_ref (docs/numerics.md). The kernel also clears the
// fp32 output that the fast combine accumulates into (device_layout.hpp).
//
// Host-includable: plain declarations only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace loom {

struct QuantGatherParams {
  const uint16_t* hidden = nullptr;    // [T, H] bf16 bits, 16-byte aligned
  const int32_t* route_row = nullptr;  // [T*k] sorted row of each route, -1 = dropped (written by dispatch)
  int tokens = 0, hidden_dim = 0, topk = 0;  // H: a positive multiple of 16
  int64_t padded_rows = 0;             // R_pad: row count of a_scales' inner dimension (multiple of 4)
  uint8_t* a_sorted = nullptr;         // [R_pad, H] fp8 e4m3 codes; row route_row[t*k+j] gets token t's codes
  float* a_scales = nullptr;           // [ceil(H/128), R_pad] fp32, MN-major: a_scales[g * R_pad + row]
  float* zero_out = nullptr;           // optional [T, zero_cols] fp32 to clear (the fast combine accumulates into it)
  int64_t zero_cols = 0;
};

// Enqueues the kernel on `stream`; pdl: launch with the programmatic-dependent-launch attribute.
// T = 0 enqueues nothing. Throws loom::Error on a bad shape or misaligned pointer. Rows outside
// [0, R_pad) in route_row are treated as dropped (never written).
void launch_quant_gather(const QuantGatherParams& p, cudaStream_t stream, bool pdl);

}  // namespace loom
