// Token source: an expert-sorted copy of the quantised activation rows (the quantiser wrote each
// route's row at its sorted position), loaded by TMA boxes of the chunk's width with every stage.
// cp.async from the producer threads cannot keep the bytes of 64- and 128-wide chunks in flight;
// TMA can, at the price of the sorted copy.
//
// Activation scales, two layouts (ScaleLayout, contract/device_layout.hpp):
//   group-major (kQuads = false): with every stage one TMA box of the chunk's rows' scales of that
//     K block, from the chunk's first row rounded down to 4 (a box's inner start must fall on 16
//     bytes), so a column's scale sits at scale_shift + column;
//   row quads (kQuads = true): a ring of its own, one slot per quad of K blocks holding each chunk
//     row's 4 groups, loaded by one bulk copy at each quad's first block, so each scale is read
//     once (a 4-group box with every stage would read 4x the bytes). For the hand-off epilogue,
//     whose staging leaves the producer at most one quad ahead.
//
// The producer is thread 0 of warpgroup 0; with the dynamic tail (a work queue) it also announces
// each unit to the consumers (UnitRing).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <type_traits>

#include "gemm/mainloop/fp8_weights_on_m.cuh"
#include "gemm/scheduler/expert_walk.cuh"
#include "gemm/scheduler/work_queue.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/tma.cuh"

namespace loom::gemm {

// Sorted rows come by TMA, whose global start address must be 16-byte aligned: an activation-scale
// box therefore starts at the row rounded down to a multiple of 4 and carries 4 extra floats.
inline constexpr int kScaleAlign = 4;
inline constexpr int kXsStride = 160;  // floats per stage: >= kMaxChunk + kScaleAlign, 128-byte multiple
static_assert(kXsStride >= kMaxChunk + kScaleAlign && (kXsStride * 4) % 128 == 0, "scale stage holds a shifted box");

// The TMA descriptors of a weights-on-M kernel: the weights, and (sorted rows) the activation rows
// and their group-major scales in one box per chunk width.
struct TensorMaps {
  CUtensorMap w;               // [E*N, K] u8, box 128 x 128, 128-byte swizzle
  CUtensorMap x[kWidthCount];  // sorted rows only: [R_pad, K] u8, box width x 128, 128-byte swizzle
  // Sorted rows, group-major scales only: [KB, R_pad] f32, box 1 x (width + 4), its start row
  // aligned down to 4.
  CUtensorMap xs[kWidthCount];
};

// Activation scales by stage: per stage, one group of the chunk's rows.
template <int kStages>
struct StageScales {
  float xs[kStages][kXsStride];
};

// Activation scales by quad of K blocks (row quads): a ring of its own.
struct QuadScales {
  static constexpr int kSlots = 2;  // the producer runs at most one quad ahead of the consumers (stages <= 4)
  float quad[kSlots][kMaxChunk * 4];
  uint64_t full[kSlots];   // the producer's arrive.expect_tx, then the bulk copy's bytes
  // Every consumer thread, after its reads of the quad's last block: each its own arrival, so the
  // order is explicit to the race checker.
  uint64_t empty[kSlots];
};

struct NoConsumerState {};

template <bool kQuadsT>
struct SortedRows {
  static constexpr bool kGathered = false;
  static constexpr bool kQuads = kQuadsT;
  static constexpr int kXRows = kMaxChunk;  // activation rows per stage: the widest chunk
  static constexpr int kChunk = kMaxChunk;
  static constexpr int kFullArrivals = 1;   // the producer's arrive.expect_tx (TMA loads)

  template <int kStages>
  struct Storage {
    std::conditional_t<kQuads, QuadScales, StageScales<kStages>> scales;
  };
  using ConsumerState = std::conditional_t<kQuads, PipelineState<QuadScales::kSlots>, NoConsumerState>;

  template <class S>
  static __device__ __forceinline__ void init(S& s) {
    if constexpr (kQuads) {
      for (int i = 0; i < QuadScales::kSlots; ++i) {
        ptx::mbar_init(&s.src.scales.full[i], 1);
        ptx::mbar_init(&s.src.scales.empty[i], 32 * kConsumerWarps);
      }
    }
  }

  static __device__ __forceinline__ int scale_shift(int row0) { return row0 % kScaleAlign; }

  // Block kb's scales. The quads start at a chunk's first block and at every kb % 4 == 0, as the
  // producer loads them.
  static __device__ __forceinline__ ScaleRead scale_read(const ConsumerState& quad, uint32_t stage, int kb,
                                                         const Unit& unit) {
    if constexpr (kQuads)
      return ScaleRead{quad.stage, quad.phase, kb == unit.kb_begin || kb % 4 == 0};
    else
      return ScaleRead{stage, 0, false};
  }
  template <class S>
  static __device__ __forceinline__ void wait_scales(S& s, const ScaleRead& sr) {
    if constexpr (kQuads)
      if (sr.wait) ptx::mbar_wait(&s.src.scales.full[sr.buf], sr.phase);
  }
  // Chunk column `col`'s activation scale for K block kb: the row's quad in slot buf at kb % 4 (the
  // quad lanes' columns 2q, 2q + 1 fall 8 floats apart: no bank conflicts), or the stage's group
  // from scale_shift.
  template <class S>
  static __device__ __forceinline__ float block_scale(const S& s, uint32_t buf, int col, int kb, int scale_shift) {
    if constexpr (kQuads)
      return s.src.scales.quad[buf][col * 4 + kb % 4];
    else
      return s.src.scales.xs[buf][scale_shift + col];
  }
  // After the promotion of block kb (which read this thread's scales): frees the quad slot after
  // the quad's last block, once per quad (arriving inside the promotion made the consumer spill).
  template <class S>
  static __device__ __forceinline__ void scale_done(S& s, ConsumerState& quad, int kb, const Unit& unit) {
    if constexpr (kQuads) {
      if (kb % 4 == 3 || kb + 1 == unit.kb_end) {
        ptx::mbar_arrive(&s.src.scales.empty[quad.stage]);
        quad.advance();
      }
    }
  }

  // Producer thread 0: every tile of the CTA's units by TMA, the weight tile, the activation tile
  // and the scales with each stage. Dynamic tail: units below the queue's start round robin, then
  // the queue's next index, fetched one unit ahead so the atomic's round trip hides behind the
  // current unit's loads; units without rows load nothing and are not announced.
  template <ExpertsFrom kFrom, class S, class P>
  static __device__ __forceinline__ void produce(S& s, const P& p, int units, WorkCursor& work) {
    const auto& a = p.a;
    WeightTiles weights(p.maps.w, a.weights_evict_first);
    PipelineState<S::kStages> ps;
    PipelineState<kUnitSlots> ring;          // unit_ring slot and phase
    PipelineState<QuadScales::kSlots> quad;  // the scale-quad ring
    auto load_unit = [&](const Unit& unit, int index, bool dynamic) {
      const int e = unit.expert, nb = unit.nb;
      const int w_row = e * a.n + a.seg.first_row(nb);  // the unit's first weight row
      int row_begin, rows;
      unit_rows<kFrom>(s.walk, a, unit, row_begin, rows);
#ifdef LOOM_CHAIN_TRACE
      if (weights.first) LOOM_TRACE(kGemmFirstRows);
#endif
      if (dynamic && rows > 0) UnitRing::announce(s.walk, ring, index, row_begin, rows);
      for (int chunk = 0; chunk < rows; chunk += kMaxChunk) {
        const int chunk_rows = min(kMaxChunk, rows - chunk);
        const int wi = width_index(chunk_rows), width = 16 << wi;
        const uint32_t bytes = kWTileBytes + width * kBlockK + (kQuads ? 0 : (width + kScaleAlign) * 4);
        const int scale_row = (row_begin + chunk) / kScaleAlign * kScaleAlign;
        for (int kb = unit.kb_begin; kb < unit.kb_end; ++kb) {
          if constexpr (kQuads) {
            if (kb == unit.kb_begin || kb % 4 == 0) {
              // The chunk rows' quads are contiguous: one bulk copy. Columns past the buffer's rows
              // keep stale values; no row of the chunk is among them.
              const int row0 = row_begin + chunk, quad_rows = min(width, int(a.x_rows) - row0);
              ptx::mbar_wait(&s.src.scales.empty[quad.stage], quad.phase ^ 1);
              ptx::mbar_arrive_expect_tx(&s.src.scales.full[quad.stage], uint32_t(quad_rows) * 16u);
              ptx::bulk_load(s.src.scales.quad[quad.stage], a.x_scales + (int64_t(kb / 4) * a.x_rows + row0) * 4,
                             uint32_t(quad_rows) * 16u, &s.src.scales.full[quad.stage]);
              quad.advance();
            }
          }
          ptx::mbar_wait(&s.empty[ps.stage], ps.phase ^ 1);
          ptx::mbar_arrive_expect_tx(&s.full[ps.stage], bytes);
          weights.load(s.w[ps.stage], kb, w_row, &s.full[ps.stage]);
          if (a.x_evict_first)
            ptx::tma_load_2d_hint(s.x[ps.stage], &p.maps.x[wi], kb * kBlockK, row_begin + chunk, &s.full[ps.stage],
                                  ptx::l2_policy_evict_first());
          else
            ptx::tma_load_2d(s.x[ps.stage], &p.maps.x[wi], kb * kBlockK, row_begin + chunk, &s.full[ps.stage]);
          if constexpr (!kQuads)
            ptx::tma_load_2d(s.src.scales.xs[ps.stage], &p.maps.xs[wi], scale_row, kb, &s.full[ps.stage]);
          ps.advance();
        }
      }
    };
    const int pt = threadIdx.x;
    if (pt == 0 && a.work_queue != nullptr) {
      const int grid = int(gridDim.x);
      const int static_end = dynamic_static_end(units, grid);
      for (int u = int(blockIdx.x); u < units;) {
        const int fetched = u + grid < static_end ? u + grid : static_end + atomicAdd(a.work_queue, 1);
        load_unit(decode_unit<kFrom>(s.walk, a, u), u, true);
        u = fetched;
      }
      UnitRing::announce(s.walk, ring, -1, 0, 0);  // the end of the walk
      leave_work_queue(a.work_queue);
    } else {
      Unit unit;
      while (pt == 0 && work.template next<kFrom>(s.walk, a, unit)) load_unit(unit, 0, false);
    }
  }
};

}  // namespace loom::gemm
