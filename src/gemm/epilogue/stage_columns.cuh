// Staging of an m64nW accumulator (weight rows on M, token columns on N) in shared memory as token
// columns of 64 weight rows, so each thread can then read 4 consecutive outputs of one token row
// (one 16-byte vector reduction or store). Shared by the weights-on-M epilogues.
#pragma once

namespace loom::gemm {

inline constexpr int kEpilogueStride = 64 + 4;  // floats per staged column: +4 makes the quad writes conflict-free
static_assert(kEpilogueStride % 4 == 0, "staged columns start on 16 bytes (float4 reads)");

// Stores the accumulator fragment's token columns 8 j0 .. 8 j0 + kCols - 1 as staged columns
// 0 .. kCols - 1 of 64 weight rows (m64nWk32 layout: a thread holds rows r and r + 8, columns c and
// c + 1 of each 8-column group). With the stride of 68 floats, a warp's stores hit 32 banks.
template <int kCols, int W>
__device__ __forceinline__ void stage_fragment(float (*cols)[kEpilogueStride], const float (&final_acc)[W / 2],
                                               int j0) {
  const int lane = threadIdx.x % 32, warp_in_wg = (threadIdx.x / 32) % 4, g = lane / 4, q = lane % 4;
#pragma unroll
  for (int jj = 0; jj < kCols / 8; ++jj) {
    const int j = j0 + jj, c = 8 * jj + 2 * q, r = 16 * warp_in_wg + g;
    cols[c][r] = final_acc[4 * j + 0];
    cols[c + 1][r] = final_acc[4 * j + 1];
    cols[c][r + 8] = final_acc[4 * j + 2];
    cols[c + 1][r + 8] = final_acc[4 * j + 3];
  }
}

}  // namespace loom::gemm
