// The FP8 promotion of one K block, final += block * the element's scale, for wgmma accumulators
// whose scale varies by row (tokens on the MMA's M side) or by column (tokens on its N side). Thread
// layout as in ptx/wgmma.cuh: block[4j + 0..1] are row r's columns c, c + 1, block[4j + 2..3] row
// r + 8's.
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

// m64nW accumulator, scale by column: scale[2j], scale[2j + 1] are columns 8j + 2q and 8j + 2q + 1's.
template <int W>
__device__ __forceinline__ void promote_columns(float (&final_acc)[W / 2], const float (&block)[W / 2],
                                                const float (&scale)[W / 4]) {
#pragma unroll
  for (int j = 0; j < W / 8; ++j) {
    final_acc[4 * j + 0] += block[4 * j + 0] * scale[2 * j];
    final_acc[4 * j + 1] += block[4 * j + 1] * scale[2 * j + 1];
    final_acc[4 * j + 2] += block[4 * j + 2] * scale[2 * j];
    final_acc[4 * j + 3] += block[4 * j + 3] * scale[2 * j + 1];
  }
}

// The scales promote_columns takes for one K block: the block's activation scales by token column
// (xs[c], thread quad lane q's columns 8j + 2q and 8j + 2q + 1) times the weight block's scale.
template <int W>
__device__ __forceinline__ void column_scales(float (&scale)[W / 4], const float* xs, float weight_scale, int q) {
#pragma unroll
  for (int j = 0; j < W / 8; ++j) {
    const float2 v = *reinterpret_cast<const float2*>(xs + 8 * j + 2 * q);
    scale[2 * j] = v.x * weight_scale;
    scale[2 * j + 1] = v.y * weight_scale;
  }
}

}  // namespace loom
