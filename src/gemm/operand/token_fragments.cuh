// Token source of the tokens-on-M kernel: token-order quantised rows whose codes the quantiser laid
// out in wgmma A-fragment order (fragment_word, contract/device_layout.hpp), so no sorted copy is
// written. Each consumer thread copies its own rows' fragment bytes of the next K blocks into its
// chunks of a shared-memory ring (one cp.async group per block), and regroups a block into
// A-fragment registers when its MMAs issue (mainloop/fp8_tokens_on_m.cuh). The activation scales
// come by stage: producer warp 2 loads the tile's rows' scales of each K block into the stage and
// arrives on its full barrier, in step with the weight tiles.
#pragma once

#include <cstdint>

#include "gemm/mainloop/fp8_tokens_on_m.cuh"
#include "gemm/ring_cursor.cuh"
#include "ptx/cp_async.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/tma.cuh"

namespace loom::gemm::tokens_on_m {

struct FragmentStorage {
  // The activation ring: slot, consumer warpgroup, 16-byte chunk (RowBlock order), thread; each
  // thread copies and reads only its own chunks, and a warp's 32 chunks are 512 contiguous bytes.
  uint4 xring[kRing][2][4][128];
  float xs[kStages][kTileRows];  // the stage's activation scales of the tile's rows (producer warp 2)
};

// Copies this thread's chunks of K block kb into its ring slot `slot` (the caller commits the
// group). Row t's group kb at t K + 128 kb; quad lane q's lo bytes at + 16 q (the quad covers
// 0-63), hi at + 64 + 16 q. int32 offsets: the launcher keeps x_rows * K below 2^31. A token < 0
// is a padding row: zero-filled, nothing read (cp.async does not merge the lanes' copies of one
// address, and padding rows read as token 0 made one hot set of L2 lines).
template <class S, class A>
__device__ __forceinline__ void copy_block(S& s, int slot, int consumer, int wg_thread, const A& a, int tok_a,
                                           int tok_b, int q, int kb) {
  const uint4* pa = reinterpret_cast<const uint4*>(a.x + (max(tok_a, 0) * a.k + kb * kBlockK + 16 * q));
  const uint4* pb = reinterpret_cast<const uint4*>(a.x + (max(tok_b, 0) * a.k + kb * kBlockK + 16 * q));
  const uint4* src[4] = {pa, pa + 4, pb, pb + 4};
  const uint32_t bytes[4] = {tok_a >= 0 ? 16u : 0u, tok_a >= 0 ? 16u : 0u, tok_b >= 0 ? 16u : 0u, tok_b >= 0 ? 16u : 0u};
  if (a.x_evict_last) {
    const uint64_t policy = ptx::l2_policy_evict_last();
#pragma unroll
    for (int c = 0; c < 4; ++c)
      ptx::cp_async_16_zfill_hint(ptx::smem_u32(&s.src.xring[slot][consumer][c][wg_thread]), src[c], bytes[c], policy);
  } else {
#pragma unroll
    for (int c = 0; c < 4; ++c)
      ptx::cp_async_16_zfill(ptx::smem_u32(&s.src.xring[slot][consumer][c][wg_thread]), src[c], bytes[c]);
  }
}

// Producer warp 2: each stage's activation scales of the tile's rows, each lane then arriving on
// the stage's full barrier (kSortedRows: rows by sorted index, m.row0 + i, instead of by token;
// padding rows read row 0's). A row's scale of block kb: group-major at kb x_rows + token; in row
// quads at (kb / 4 x_rows + token) 4 + kb % 4, where the quad's other three blocks share its
// sector, which the L1-cached loads keep for the next three stages (the tile's tokens are
// scattered: group-major, every stage's scale is a sector of its own from L2).
template <bool kWide, bool kSortedRows, class S, class A>
__device__ __forceinline__ void produce_scales(S& s, const A& a) {
  using Sh = TileShape<kWide>;
  const int lane = threadIdx.x % 32;
  PipelineState<S::kRecordSlots> mc;
  StageCursor st;
  while (true) {
    ptx::mbar_wait(&s.meta.full[mc.stage], mc.phase);
    const auto& m = s.meta.rec[mc.stage];
    if (m.rows < 0) break;
    const int tok_stride = a.scales_in_quads ? 4 : 1;
    int tok[Sh::kRows / 32];
#pragma unroll
    for (int i = 0; i < Sh::kRows / 32; ++i) {
      const int r = lane + 32 * i;
      if constexpr (kSortedRows)
        tok[i] = (r < m.rows ? m.row0 + r : 0) * tok_stride;
      else
        tok[i] = m.token[r] * tok_stride;
    }
    ptx::mbar_arrive(&s.meta.empty[mc.stage]);
    for (int kb = 0; kb < a.kblocks; ++kb) {
      const float* src = a.scales_in_quads ? a.x_scales + int64_t(kb / 4) * a.x_rows * 4 + kb % 4
                                           : a.x_scales + int64_t(kb) * a.x_rows;
#pragma unroll
      for (int j = 0; j < Sh::kBlocks; ++j) {  // a wide unit's two stages of a K block: the same scales
        ptx::mbar_wait(&s.empty[st.stage], st.phase ^ 1);
        // Loads (L1-cached), stores, then the lane's arrival, which releases its stores to the
        // consumers' wait (faster than cp.async with an mbarrier arrival beside the ring's copies).
        float v[Sh::kRows / 32];
#pragma unroll
        for (int i = 0; i < Sh::kRows / 32; ++i) v[i] = __ldca(src + tok[i]);
#pragma unroll
        for (int i = 0; i < Sh::kRows / 32; ++i) s.src.xs[st.stage][lane + 32 * i] = v[i];
        ptx::mbar_arrive(&s.full[st.stage]);
        st.advance();
      }
    }
    mc.advance();
  }
}

}  // namespace loom::gemm::tokens_on_m
