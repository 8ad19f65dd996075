// The ffn intermediate: act = SiLU(gate) * up from GEMM 1's fp32 rows (expert-sorted, unweighted),
// re-quantised to FP8 E4M3 with one fp32 scale per 1x128 group along I, in the sorted-row layout
// GEMM 2 reads (codes [rows, I], scales as scale_layout says). Arithmetic: act in fp32
// (silu(g) = g / (1 + e^-g)), then bit for bit quantize_1x128_ref of those fp32 values
// (docs/numerics.md). Optionally clears GEMM 2's fast-combine accumulator and work queue.
//
// Host-includable: plain declarations only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "contract/device_layout.hpp"

namespace loom {

struct SiluMulQuantParams {
  const float* h = nullptr;          // [padded_rows, 2 * inter] fp32: gate columns 0..I-1, up I..2I-1; 16-byte aligned
  const int32_t* offsets = nullptr;  // [experts + 1]: rows [0, offsets[experts]) are valid (read on the device)
  int experts = 0;
  int inter = 0;                     // I: a positive multiple of 16
  int64_t padded_rows = 0;           // rows the buffers hold (a positive multiple of 4); more valid rows are not read
  uint8_t* codes = nullptr;          // [padded_rows, I] e4m3; 16-byte aligned
  float* scales = nullptr;           // scale_floats(ceil(I/128), padded_rows) fp32, laid out as scale_layout says
  ScaleLayout scale_layout = ScaleLayout::group_major;
  // Each 128-byte group's words in wgmma A-fragment order (fragment_word), for the tokens-on-M GEMM
  // reading sorted rows; inter a multiple of 128.
  bool fragment_order = false;
  float* act = nullptr;              // optional [padded_rows, I] fp32: the values quantised (for tests)
  float* zero_out = nullptr;         // optional fp32 words to clear (GEMM 2's fast-combine accumulator)
  int64_t zero_count = 0;
  int32_t* zero_words = nullptr;     // optional words to clear (GEMM 2's work queue)
  int zero_word_count = 0;
};

// Throws loom::Error on a bad shape or misaligned pointer.
void check_silu_mul_quant(const SiluMulQuantParams& p);

// Enqueues the kernel on `stream` (at most 8 CTAs of 256 threads per SM of `sm_count`; the body
// strides); pdl: launch with the programmatic-dependent-launch attribute. padded_rows = 0 and
// nothing to clear enqueues nothing.
void launch_silu_mul_quant(const SiluMulQuantParams& p, int sm_count, cudaStream_t stream, bool pdl);

}  // namespace loom
