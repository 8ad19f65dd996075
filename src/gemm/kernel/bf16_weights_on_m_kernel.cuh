// The BF16 weights-on-M kernel (issue 47's decode): the weights-on-M mainloop
// (mainloop/bf16_weights_on_m.cuh), the expert's sorted rows by TMA on the MMA's N side, the
// expert-tile scheduler in 64-row chunks, and the act or route-row epilogue stored by token column
// (epilogue/bf16_token_columns.cuh), in the skeleton.
//
//   warp roles   warpgroup 0: one thread issues the A (weight) and B (rows) tiles by TMA;
//                warpgroup 1: the MMAs and the epilogue; warpgroup 2 has nothing to do (a decode
//                unit's MMAs are a fraction of its weight stream's time)
//   units        (expert, 64-row chunk, weight block), weight blocks innermost so that the CTAs
//                running together stream one expert's weights once for its chunk; round robin.
//                act: a block is 32 intermediate columns (their 32 gate rows and 32 up rows, 8
//                rows a TMA box, interleaved so each thread holds a column's gate and up);
//                rows: a block is 64 output columns (one 64-row box of w2)
#pragma once

#include <cuda.h>

#include <cstdint>

#include "gemm/epilogue/bf16_token_columns.cuh"
#include "gemm/gemm_bf16.hpp"
#include "gemm/kernel/grouped_gemm_sm90.cuh"
#include "gemm/mainloop/bf16_weights_on_m.cuh"
#include "gemm/scheduler/expert_tiles.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/pdl.cuh"
#include "ptx/tma.cuh"

namespace loom::gemm {

struct Bf16WeightsOnMMaps {
  CUtensorMap x;  // [x_rows, K] bf16, boxes of 64 rows x 64
  CUtensorMap w;  // [E * N, K] bf16, boxes of 8 rows x 64 (act) or 64 rows x 64 (rows)
};

struct Bf16WeightsOnMArgs {
  const int32_t* offsets;
  const int32_t* counts;  // always null: build_expert_tiles reads the offsets
  int stride;
  const float* row_weight;
  void* out;
  int experts, n, k, kblocks;
  int col_blocks;  // units per chunk: act ceil(I / 32), rows ceil(N / 64)
  int inter;       // act: I
  int store_bf16;
};

namespace bf16_weights_on_m {

struct alignas(1024) Storage {
  StageTiles ring;
  ExpertTiles tiles;
};

inline constexpr int kActColumns = 32;   // intermediate columns per act unit
inline constexpr int kActBoxRows = 8;    // gate or up rows per A box (one 1024-byte swizzle atom)
inline constexpr int kRowsBoxRows = 64;  // w2 rows per A box

struct Unit {
  int expert, row0, rows, nb;  // the chunk's first sorted row, its rows (at most 64), its weight block
};

}  // namespace bf16_weights_on_m

template <Bf16Epilogue kEpilogue>
struct Bf16WeightsOnMKernel {
  using Maps = Bf16WeightsOnMMaps;
  using Args = Bf16WeightsOnMArgs;
  using Params = ParamRefs<Maps, Args>;
  using SharedStorage = bf16_weights_on_m::Storage;
  using Unit = bf16_weights_on_m::Unit;
  static constexpr int kStages = bf16_weights_on_m::kStages;
  using StageCursor = PipelineState<kStages>;
  static constexpr uint32_t kProducerRegs = 0, kConsumerRegs = 0;  // 168 each: plenty for 32 accumulators
  static constexpr int kBlockK = bf16_weights_on_m::kBlockK, kChunk = bf16_weights_on_m::kChunk;
  static_assert(bf16_weights_on_m::kActColumns * 2 == bf16_weights_on_m::kWeightRows,
                "an act unit's gate and up rows fill the MMA's M");
  static_assert(bf16_weights_on_m::kRowsBoxRows == bf16_weights_on_m::kWeightRows, "one w2 box fills the MMA's M");
  static_assert(bf16_weights_on_m::kActBoxRows * 8 == bf16_weights_on_m::kWeightRows,
                "8-row boxes: a gate and an up box per consumer warp");

  struct Schedule {
    int units;
    int first, step;
  };

  static __device__ __forceinline__ Unit decode(const SharedStorage& s, const Args& a, int u) {
    const int tile = u / a.col_blocks;
    const int e = tile_expert(s.tiles, a.experts, tile);
    const int row0 = s.tiles.expert_row[e] + (tile - s.tiles.tile_start[e]) * kChunk;
    return Unit{e, row0, min(kChunk, s.tiles.expert_end[e] - row0), u - tile * a.col_blocks};
  }

  static __device__ __forceinline__ void init(SharedStorage& s, const Params&) {
    for (int i = 0; i < kStages; ++i) {
      ptx::mbar_init(&s.ring.full[i], 1);
      ptx::mbar_init(&s.ring.empty[i], 4 * kReleaseArrivalsPerWarp);  // the one consumer warpgroup
    }
  }
  static __device__ __forceinline__ void prefetch(const Params& p) {
    ptx::prefetch_tensormap(&p.maps.x);
    ptx::prefetch_tensormap(&p.maps.w);
  }

  // The offsets (and the sorted rows) are the kernels' before this one.
  static __device__ __forceinline__ Schedule prepare(SharedStorage& s, const Params& p) {
    ptx::pdl_wait();
    build_expert_tiles(s.tiles, p.a, kChunk);  // its barriers also publish the mbarrier initialisation
    return Schedule{s.tiles.tile_start[p.a.experts] * p.a.col_blocks, int(blockIdx.x), int(gridDim.x)};
  }

  static __device__ __forceinline__ void produce(SharedStorage& s, const Params& p, const Schedule& sched) {
    using namespace bf16_weights_on_m;
    if (threadIdx.x != 0) return;
    const Args& a = p.a;
    StageCursor st;
    for (int u = sched.first; u < sched.units; u += sched.step) {
      const Unit unit = decode(s, a, u);
      // Weight rows past the expert's N (or I) belong to the next expert or are out of bounds
      // (zeros): their outputs are never written.
      const int w_base = unit.expert * a.n;
      for (int kb = 0; kb < a.kblocks; ++kb) {
        ptx::mbar_wait(&s.ring.empty[st.stage], st.phase ^ 1);
        ptx::mbar_arrive_expect_tx(&s.ring.full[st.stage], kATileBytes + kBTileBytes);
        if constexpr (kEpilogue == Bf16Epilogue::act) {
          // Tile rows 16w..16w+7: gate rows of columns c0 + 8w..; 16w+8..16w+15: their up rows.
          const int c0 = unit.nb * kActColumns;
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            uint8_t* dst = s.ring.a[st.stage] + w * 2 * kActBoxRows * kBlockK * 2;
            ptx::tma_load_2d(dst, &p.maps.w, kb * kBlockK, w_base + c0 + kActBoxRows * w, &s.ring.full[st.stage]);
            ptx::tma_load_2d(dst + kActBoxRows * kBlockK * 2, &p.maps.w, kb * kBlockK,
                             w_base + a.inter + c0 + kActBoxRows * w, &s.ring.full[st.stage]);
          }
        } else {
          ptx::tma_load_2d(s.ring.a[st.stage], &p.maps.w, kb * kBlockK, w_base + unit.nb * kRowsBoxRows,
                           &s.ring.full[st.stage]);
        }
        // Chunk rows past the expert's are the next expert's (or zeros past the tensor): their
        // columns are never written.
        ptx::tma_load_2d(s.ring.b[st.stage], &p.maps.x, kb * kBlockK, unit.row0, &s.ring.full[st.stage]);
        st.advance();
      }
    }
  }

  static __device__ __forceinline__ void consume(SharedStorage& s, const Params& p, const Schedule& sched,
                                                 int consumer) {
    using namespace bf16_weights_on_m;
    if (consumer != 0) return;
    const Args& a = p.a;
    const int lane = threadIdx.x % 32, q = lane % 4, w = threadIdx.x / 32 % 4;
    const int r = 16 * w + lane / 4;  // the thread's first tile row (weight row)
    auto release = [&](int stage) { release_slot(&s.ring.empty[stage]); };
    StageCursor st;
    float acc[32];
    for (int u = sched.first; u < sched.units; u += sched.step) {
      const Unit unit = decode(s, a, u);
      k_loop(s.ring, acc, a.kblocks, st, release);
      if constexpr (kEpilogue == Bf16Epilogue::act)
        store_act_columns(a.out, a.inter, acc, unit.row0, unit.rows, unit.nb * kActColumns + 8 * w + lane / 4, q);
      else
        store_rows_columns(a.out, a.n, a.store_bf16, a.row_weight, acc, unit.row0, unit.rows,
                           unit.nb * kRowsBoxRows + r, q);
    }
  }
};

}  // namespace loom::gemm
