// Token source: an expert's token rows resident in shared memory over all of K. Producer warps 2
// and 3 gather the unit's rows by token (cp.async from the token-order quantised rows, 16 bytes a
// thread per row pass, into the 128-byte-swizzled layout) into one slot per K block, each slot
// once the consumers' last weight block has read it, while the weight tiles stream past them
// (weights on M): every weight block of the expert reuses the rows, so an expert's rows are read
// once per unit instead of once per 128 weight rows. The slots sit after the kernel's fixed shared
// storage: kblocks slots of capacity x 128 bytes, then kblocks x capacity activation scales.
#pragma once

#include <cstdint>

#include "gemm/ring_cursor.cuh"
#include "ptx/cp_async.cuh"
#include "ptx/mbarrier.cuh"

namespace loom::gemm::resident {

inline constexpr int kBlockK = 128;        // K per token slot: one scale block
inline constexpr int kGatherThreads = 64;  // producer warps 2 and 3
inline constexpr int kMaxChunkRows = 48;   // widest chunk (the MMA's N)
inline constexpr int kMaxKBlocks = 64;     // K <= 8192: one token slot (and its barriers) per K block
static_assert(kGatherThreads == 8 * 8, "8 threads per 128-byte row (16 bytes each), 8 rows per pass");
static_assert(kMaxChunkRows % 16 == 0 && kMaxChunkRows <= kGatherThreads, "widths in 16s; a scale per gather thread");

struct SlotBarriers {
  uint64_t full[kMaxKBlocks];   // the gather threads' cp.async of the slot have landed
  uint64_t empty[kMaxKBlocks];  // the consumers' last weight block has read the slot
};

template <class S>
__device__ __forceinline__ uint8_t* token_slots(S& s) {
  return reinterpret_cast<uint8_t*>(&s + 1);
}
template <class S, class A>
__device__ __forceinline__ float* slot_scales(S& s, const A& a) {
  return reinterpret_cast<float*>(token_slots(s) + size_t(a.kblocks) * a.capacity * kBlockK);
}

// The gather warps: thread t copies 16-byte piece t % 8 of rows t / 8 + 8 i and the scale of row t,
// slot by slot, each slot once the consumers are done with it. Records from the kernel's ring
// (m.rows < 0: the end; m.width, m.token).
template <class S, class A>
__device__ __forceinline__ void gather_resident_rows(S& s, const A& a) {
  const int t = threadIdx.x - 64, piece = t % 8, row_lo = t / 8;
  float* const scales = slot_scales(s, a);
  uint8_t* const slots = token_slots(s);
  PipelineState<S::kRecordSlots> mc;
  uint32_t unit_parity = 0;
  while (true) {
    ptx::mbar_wait(&s.meta.full[mc.stage], mc.phase);
    const auto& m = s.meta.rec[mc.stage];
    if (m.rows < 0) break;
    const int width = m.width;
    int src[kMaxChunkRows / 8];  // byte offset of this thread's piece in each of its rows' K block 0; -1: none
#pragma unroll
    for (int i = 0; i < kMaxChunkRows / 8; ++i) {
      const int r = row_lo + 8 * i, token = r < width ? m.token[r] : -1;
      src[i] = token >= 0 ? token * a.k + 16 * piece : -1;
    }
    const int scale_token = t < width ? m.token[t] : -1;
    release_slot(&s.meta.empty[mc.stage]);
    for (int kb = 0; kb < a.kblocks; ++kb) {
      ptx::mbar_wait(&s.slot.empty[kb], unit_parity ^ 1);
      uint8_t* slot = slots + size_t(kb) * a.capacity * kBlockK;
#pragma unroll
      for (int i = 0; i < kMaxChunkRows / 8; ++i) {
        const int r = row_lo + 8 * i;
        if (r < width) {
          const bool ok = src[i] >= 0;
          ptx::cp_async_16_zfill(ptx::smem_u32(slot + r * kBlockK + ((piece ^ (r % 8)) << 4)),
                                 ok ? a.x + src[i] + kb * kBlockK : a.x, ok ? 16u : 0u);
        }
      }
      if (t < width)
        ptx::cp_async_4_zfill(ptx::smem_u32(scales + kb * a.capacity + t),
                              scale_token >= 0 ? a.x_scales + int64_t(kb) * a.x_rows + scale_token : a.x_scales,
                              scale_token >= 0 ? 4u : 0u);
      ptx::cp_async_mbar_arrive_noinc(&s.slot.full[kb]);
    }
    unit_parity ^= 1;
    mc.advance();
  }
}

}  // namespace loom::gemm::resident
