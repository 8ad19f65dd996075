// BF16 -> FP8 E4M3 quantisation of the hidden states with one fp32 scale per 1x128 group, in one
// of two layouts:
//  - token order (route_row = nullptr): row t holds token t. What the pipeline uses: it does not
//    depend on the routing, so it runs beside it, and the GEMM gathers rows by token itself.
//  - gathered into expert-sorted order: token t is quantised once and its codes and scales are
//    written to each of its k sorted rows route_row[t*k + j] (dropped routes, -1, are skipped).
// Arithmetic is bit for bit quantize_1x128_ref (docs/numerics.md). The kernel also clears the
// fp32 output that the fast combine accumulates into (device_layout.hpp).
//
// Host-includable: plain declarations only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "contract/device_layout.hpp"

namespace loom {

struct QuantGatherParams {
  const uint16_t* hidden = nullptr;    // [T, H] bf16 bits, 16-byte aligned
  const int32_t* route_row = nullptr;  // [T*k] sorted row of each route, -1 = dropped; nullptr = token order
  int tokens = 0, hidden_dim = 0, topk = 0;  // H: a positive multiple of 16
  int64_t padded_rows = 0;             // rows of a_sorted and of a_scales' inner dimension (multiple of 4; >= T in token order)
  uint8_t* a_sorted = nullptr;         // [rows, H] fp8 e4m3 codes; row route_row[t*k+j] (or t) gets token t's codes
  float* a_scales = nullptr;           // scale_floats(ceil(H/128), R_pad) fp32, laid out as scale_layout says
  ScaleLayout scale_layout = ScaleLayout::group_major;  // row_quads: what the hand-off and register-loaded GEMMs read
  // Token order only, H a multiple of 128: each group's codes in the wgmma A-fragment order of
  // fragment_word (device_layout.hpp), for the GEMM that loads rows into registers.
  bool fragment_order = false;
  // Pre-quantised rows (expert parallelism's FP8 rows on the wire): [T, H] codes and [T, ceil(H/128)]
  // fp32 scales, token-major, the quantisation of the bf16 rows they came from. Given, the stage
  // copies them into its layout (the bytes it would have computed) and hidden is unused.
  const uint8_t* codes = nullptr;
  const float* code_scales = nullptr;
  float* zero_out = nullptr;           // optional [T, zero_cols] fp32 to clear (the fast combine accumulates into it)
  int64_t zero_cols = 0;
  // Optional words to zero (the GEMM's dynamic work queue: it must start each run at zero, and the
  // GEMM reads it only after this kernel has completed).
  int32_t* zero_words = nullptr;
  int zero_word_count = 0;
};

// Throws loom::Error on a bad shape or misaligned pointer (what launch_quant_gather checks; also for
// the kernels that run the stage in extra CTAs).
void check_quant_gather(const QuantGatherParams& p);

// Threads a grid needs so that quant_gather_body gives every (token, 128-group) its 8 lanes and
// clears the output at most 8 float4 per thread (fewer work too: the body strides).
int64_t quant_gather_threads(const QuantGatherParams& p);

// Enqueues the kernel on `stream`; pdl: launch with the programmatic-dependent-launch attribute.
// T = 0 enqueues nothing. Throws loom::Error on a bad shape or misaligned pointer. Rows outside
// [0, R_pad) in route_row are treated as dropped (never written).
void launch_quant_gather(const QuantGatherParams& p, cudaStream_t stream, bool pdl);

}  // namespace loom
