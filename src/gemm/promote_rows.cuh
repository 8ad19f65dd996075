// The FP8 promotion of one K block for an m64n128 wgmma accumulator whose scale varies by row
// (tokens on the MMA's M side): final += block * scale of the element's row. Thread layout as in
// ptx/wgmma.cuh: block[4j + 0..1] are row r's, block[4j + 2..3] row r + 8's.
#pragma once

namespace loom {

__device__ __forceinline__ void promote_rows(float (&final_acc)[64], const float (&block)[64], float scale_r,
                                             float scale_r8) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    final_acc[4 * j + 0] += block[4 * j + 0] * scale_r;
    final_acc[4 * j + 1] += block[4 * j + 1] * scale_r;
    final_acc[4 * j + 2] += block[4 * j + 2] * scale_r8;
    final_acc[4 * j + 3] += block[4 * j + 3] * scale_r8;
  }
}

}  // namespace loom
