// The BF16 tokens-on-M kernel (issue 47): the BF16 mainloop (mainloop/bf16_tokens_on_m.cuh), A by
// TMA from the expert-sorted rows, the expert-tile scheduler, and the act or route-row epilogue
// (epilogue/bf16_rows.cuh), in the skeleton.
//
//   warp roles   warpgroup 0: one thread issues the A and B tiles of the CTA's units by TMA;
//                warpgroups 1 and 2: rows 0..63 and 64..127 of every tile, the MMAs and the
//                epilogue (kStaged: through shared memory and TMA stores)
//   units        (expert, 128-row tile, 256-wide weight block), weight blocks innermost so that the
//                CTAs running together read one expert's weights and a few row tiles; round robin
//                (over clusters: a 2-CTA cluster takes 256 rows, sharing B by multicast)
// The product instantiates one CTA, 3 stages, staged (gemm/instances/instances.cuh); CTA pairs,
// A by token and the unstaged epilogue are the lab's (lab/bf16_variants/), measured no faster.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "gemm/epilogue/bf16_rows.cuh"
#include "gemm/gemm_bf16.hpp"
#include "gemm/kernel/grouped_gemm_sm90.cuh"
#include "gemm/mainloop/bf16_tokens_on_m.cuh"
#include "gemm/scheduler/expert_tiles.cuh"
#include "ptx/barrier.cuh"
#include "ptx/cluster.cuh"
#include "ptx/cp_async.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/pdl.cuh"
#include "ptx/red.cuh"
#include "ptx/tma.cuh"

namespace loom::gemm {

struct Bf16TokensOnMMaps {
  CUtensorMap x;  // [x_rows, K] bf16, boxes of 128 rows x 64 (unused with kTokenRows)
  CUtensorMap w;  // [E * N, K] bf16, boxes of 128 rows x 64
  CUtensorMap out;  // kStaged: the bf16 output [x_rows, I or N], boxes of 64 rows x 64 (unused otherwise)
};

struct Bf16TokensOnMArgs {
  const int32_t* offsets;
  const int32_t* counts;  // always null: build_expert_tiles reads the offsets
  int stride;
  const float* row_weight;
  void* out;
  int experts, n, k, kblocks;
  int col_blocks;  // units per row tile: act ceil(I / 128), rows ceil(N / 256)
  int inter;       // act: I
  int store_bf16;
  const int32_t* row_token;  // kTokenRows: each sorted row's token (the row of x its A row is)
  const uint16_t* x;         // kTokenRows: the token-order rows [T, K] bf16
};

namespace bf16_tokens_on_m {

// kOutBytes: each consumer warpgroup's staging of its rows' output (0: stored from registers).
template <int kStages, int kOutBytes>
struct alignas(1024) Storage {
  uint8_t out[2][kOutBytes];  // first: 1024-aligned boxes, and the ring's tiles after them too
  StageTiles<kStages> ring;
  ExpertTiles tiles;
  int32_t row_token[kTileRows];  // by token: the tokens of the unit's rows (-1 past its rows)
};
template <int kStages>
struct alignas(1024) Storage<kStages, 0> {
  StageTiles<kStages> ring;
  ExpertTiles tiles;
  int32_t row_token[kTileRows];
};

inline constexpr uint32_t kGatherBarrier = 3;  // the producer warpgroup's (1 and 2: the consumers' staging)

struct Unit {
  int expert, row0, rows, nb;  // the tile's first sorted row, its rows (at most 128), its weight block
};

}  // namespace bf16_tokens_on_m

// kCluster = 2: two CTAs of a cluster take the same unit's two halves of 256 expert rows (tiles of
// 128 each) and share B: each loads one 128-row box of it and multicasts it to both, so a CTA reads
// 16 KiB of A and 16 KiB of B from L2 per K block instead of 16 + 32. A stage is refilled only once
// the consumers of both CTAs have freed it (each peer consumer warp arrives here too).
//
// kStaged: a consumer warpgroup's 64 rows, when all are the expert's, leave as bf16 through shared
// memory by TMA stores (epilogue/bf16_rows.cuh) instead of from registers, so the MMAs of the next
// unit start while they drain; a warpgroup with rows past its expert's end (they are the next
// expert's) stores from registers.
//
// kTokenRows: A comes by token instead of from a sorted copy, so no gather kernel runs: the producer
// warpgroup's 128 threads copy the stage's 128 rows x 128 bytes from the tokens' rows by cp.async,
// 16 bytes each (8 threads a row, 16 rows a pass), into the 128-byte-swizzled layout a TMA box has
// (16-byte piece c of row r at r * 128 + (c ^ (r % 8)) * 16); rows past the unit are zero-filled.
// Each thread's copies arrive on the stage's full barrier (noinc) beside thread 0's expect_tx for B;
// the consumers fence the async proxy before their MMAs read them.
template <Bf16Epilogue kEpilogue, int kCluster = 1, bool kTokenRows = false, int kStages = 4, bool kStaged = false>
struct Bf16TokensOnMKernel {
  static_assert(kCluster == 1 || kCluster == 2, "one CTA, or a pair sharing B");
  static_assert(!kTokenRows || kEpilogue == Bf16Epilogue::act, "A by token: ffn GEMM 1 (GEMM 2 reads the intermediate)");
  static_assert(kProducerThreads == bf16_tokens_on_m::kTileRows, "a producer thread per tile row");
  using Maps = Bf16TokensOnMMaps;
  using Args = Bf16TokensOnMArgs;
  using Params = ParamRefs<Maps, Args>;
  static constexpr int kOutBytes =
      kStaged ? (kEpilogue == Bf16Epilogue::act ? 2 : 4) * bf16_tokens_on_m::kOutBoxBytes : 0;
  using SharedStorage = bf16_tokens_on_m::Storage<kStages, kOutBytes>;
  using Unit = bf16_tokens_on_m::Unit;
  using StageCursor = PipelineState<kStages>;
  // By token every producer thread gathers: it takes registers from the consumers.
  static constexpr uint32_t kProducerRegs = kTokenRows ? 56 : 40, kConsumerRegs = kTokenRows ? 224 : 232;
  static constexpr unsigned kClusterX = kCluster;
  static constexpr int kTileRows = bf16_tokens_on_m::kTileRows, kBlockK = bf16_tokens_on_m::kBlockK;
  static constexpr int kUnitRows = kTileRows * kCluster;  // expert rows per unit (over the cluster)

  struct Schedule {
    int units;
    int first, step;  // this CTA's (cluster's) first unit and the stride between its units
    uint32_t rank;    // the CTA's rank in its cluster (its 128 rows of the unit, its half of B)
  };

  static __device__ __forceinline__ Unit decode(const SharedStorage& s, const Args& a, int u, uint32_t rank) {
    const int tile = u / a.col_blocks;
    const int e = tile_expert(s.tiles, a.experts, tile);
    const int row0 = s.tiles.expert_row[e] + (tile - s.tiles.tile_start[e]) * kUnitRows + int(rank) * kTileRows;
    // rows <= 0: the second CTA of an expert's last unit, past its rows (it computes and stores nothing).
    return Unit{e, row0, min(kTileRows, s.tiles.expert_end[e] - row0), u - tile * a.col_blocks};
  }

  static __device__ __forceinline__ void init(SharedStorage& s, const Params&) {
    for (int i = 0; i < kStages; ++i) {
      ptx::mbar_init(&s.ring.full[i], kTokenRows ? 1 + kProducerThreads : 1);
      ptx::mbar_init(&s.ring.empty[i], kConsumerWarps * kReleaseArrivalsPerWarp + (kCluster - 1) * kConsumerWarps);
    }
  }
  static __device__ __forceinline__ void prefetch(const Params& p) {
    if constexpr (!kTokenRows) ptx::prefetch_tensormap(&p.maps.x);
    ptx::prefetch_tensormap(&p.maps.w);
    if constexpr (kStaged) ptx::prefetch_tensormap(&p.maps.out);
  }

  // The offsets (and the sorted rows) are the kernels' before this one.
  static __device__ __forceinline__ Schedule prepare(SharedStorage& s, const Params& p) {
    ptx::pdl_wait();
    build_expert_tiles(s.tiles, p.a, kUnitRows);  // its barriers also publish the mbarrier initialisation
    // ... to the peer as well, before its first multicast or remote arrival reaches this CTA.
    if constexpr (kCluster > 1) ptx::cluster_sync();
    const uint32_t rank = kCluster > 1 ? ptx::cluster_rank() : 0u;
    return Schedule{s.tiles.tile_start[p.a.experts] * p.a.col_blocks, int(blockIdx.x) / kCluster,
                    int(gridDim.x) / kCluster, rank};
  }

  static __device__ __forceinline__ void produce(SharedStorage& s, const Params& p, const Schedule& sched) {
    using namespace bf16_tokens_on_m;
    const int t = threadIdx.x;  // 0..127
    if (t == 0 || kTokenRows) {
      const Args& a = p.a;
      StageCursor st;
      for (int u = sched.first; u < sched.units; u += sched.step) {
        const Unit unit = decode(s, a, u, sched.rank);
        // B's two boxes: act, gate block nb and up block nb (w13's up rows start at row inter);
        // rows, weight rows 256 nb .. 256 nb + 255. Rows past the expert's N belong to the next
        // expert or are out of bounds (zeros): their columns are never written.
        const int w_row0 =
            unit.expert * a.n + (kEpilogue == Bf16Epilogue::act ? unit.nb * kBoxRows : unit.nb * kTileCols);
        const int w_row1 = kEpilogue == Bf16Epilogue::act ? w_row0 + a.inter : w_row0 + kBoxRows;
        if constexpr (kTokenRows) {
          // Every thread has issued the previous unit's copies (their addresses are taken at issue).
          ptx::named_barrier_sync(kGatherBarrier, kProducerThreads);
          s.row_token[t] = t < unit.rows ? __ldcg(a.row_token + unit.row0 + t) : -1;
          ptx::named_barrier_sync(kGatherBarrier, kProducerThreads);
        }
        for (int kb = 0; kb < a.kblocks; ++kb) {
          if constexpr (kCluster > 1)
            ptx::mbar_wait_cluster(&s.ring.empty[st.stage], st.phase ^ 1);  // the peer's consumers too
          else
            ptx::mbar_wait(&s.ring.empty[st.stage], st.phase ^ 1);
          if (t == 0) {
            // Both B boxes land here either way (one of them from the peer's multicast).
            ptx::mbar_arrive_expect_tx(&s.ring.full[st.stage], kTokenRows ? kBTileBytes : kATileBytes + kBTileBytes);
            if constexpr (!kTokenRows)
              ptx::tma_load_2d(s.ring.a[st.stage], &p.maps.x, kb * kBlockK, unit.row0, &s.ring.full[st.stage]);
            if constexpr (kCluster > 1) {
              const int half = int(sched.rank);
              ptx::tma_load_2d_multicast(s.ring.b[st.stage] + half * kBoxBytes, &p.maps.w, kb * kBlockK,
                                         half == 0 ? w_row0 : w_row1, &s.ring.full[st.stage], uint16_t(0x3));
            } else {
              ptx::tma_load_2d(s.ring.b[st.stage], &p.maps.w, kb * kBlockK, w_row0, &s.ring.full[st.stage]);
              ptx::tma_load_2d(s.ring.b[st.stage] + kBoxBytes, &p.maps.w, kb * kBlockK, w_row1,
                               &s.ring.full[st.stage]);
            }
          }
          if constexpr (kTokenRows) {
            constexpr int kPieces = kBlockK * 2 / 16;  // 16-byte pieces of a row's stage
            const int piece = t % kPieces, kcol = kb * kBlockK + piece * 8;
            uint8_t* tile = s.ring.a[st.stage];
#pragma unroll
            for (int r = t / kPieces; r < kTileRows; r += kProducerThreads / kPieces) {
              const int token = s.row_token[r];
              const bool ok = token >= 0 && kcol < a.k;
              const uint16_t* src = ok ? a.x + int64_t(token) * a.k + kcol : a.x;
              ptx::cp_async_16_zfill(ptx::smem_u32(tile + r * kBlockK * 2 + ((piece ^ (r % 8)) << 4)), src,
                                     ok ? 16u : 0u);
            }
            ptx::cp_async_mbar_arrive_noinc(&s.ring.full[st.stage]);
          }
          st.advance();
        }
      }
    }
    // No CTA of a pair leaves while the other may still arrive on its barriers.
    if constexpr (kCluster > 1) ptx::cluster_sync();
  }

  static __device__ __forceinline__ void consume(SharedStorage& s, const Params& p, const Schedule& sched,
                                                 int consumer) {
    using namespace bf16_tokens_on_m;
    const Args& a = p.a;
    const int lane = threadIdx.x % 32, q = lane % 4;
    const int r = 64 * consumer + 16 * (threadIdx.x / 32 % 4) + lane / 4;  // the thread's first row in the tile
    [[maybe_unused]] const uint32_t peer = sched.rank ^ 1u;
    auto release = [&](int stage) {
      release_slot(&s.ring.empty[stage]);
      if constexpr (kCluster > 1) {
        // The peer's multicast writes this stage too: its producer waits for this warp as well.
        __syncwarp();
        if (lane == 0) ptx::mbar_arrive_remote(&s.ring.empty[stage], peer);
      }
    };
    StageCursor st;
    float acc[128];
    // kStaged: the warpgroup's first thread issues its stores and waits for them (bulk groups are
    // per thread); named barrier 1 + consumer keeps the staging between them.
    [[maybe_unused]] const bool leader = threadIdx.x % 128 == 0;
    [[maybe_unused]] const int rw = r - 64 * consumer;  // the thread's first row of the warpgroup's 64
    for (int u = sched.first; u < sched.units; u += sched.step) {
      const Unit unit = decode(s, a, u, sched.rank);
      k_loop<kTokenRows>(s.ring, acc, a.kblocks, consumer, st, release);
      const int64_t row = unit.row0 + r, row8 = row + 8;
      const bool ok = r < unit.rows, ok8 = r + 8 < unit.rows;
      if constexpr (kStaged) {
        if (64 * consumer + 64 <= unit.rows && (kEpilogue == Bf16Epilogue::act || a.store_bf16)) {
          uint8_t* staging = s.out[consumer];
          if (leader) ptx::bulk_wait_read();  // the previous unit's stores have read the staging
          ptx::named_barrier_sync(1 + consumer, 128);
          int col0, cols;
          if constexpr (kEpilogue == Bf16Epilogue::act) {
            stage_act(staging, acc, rw, q);
            col0 = unit.nb * kBoxRows, cols = a.inter;
          } else {
            stage_rows(staging, acc, rw, a.row_weight ? __ldcg(a.row_weight + row) : 1.0f,
                       a.row_weight ? __ldcg(a.row_weight + row8) : 1.0f, q);
            col0 = unit.nb * kTileCols, cols = a.n;
          }
          ptx::fence_proxy_async_shared();  // the generic writes, before the async proxy reads them
          ptx::named_barrier_sync(1 + consumer, 128);
          if (leader) {
#pragma unroll
            for (int b = 0; b < kOutBytes / kOutBoxBytes; ++b)
              if (col0 + b * kOutBoxCols < cols)  // (a box's columns past I or N are not written)
                ptx::tma_store_2d(&p.maps.out, staging + b * kOutBoxBytes, col0 + b * kOutBoxCols,
                                  unit.row0 + 64 * consumer);
            ptx::bulk_commit();
          }
          continue;
        }
      }
      if constexpr (kEpilogue == Bf16Epilogue::act) {
        store_act(a.out, a.inter, acc, row, ok, row8, ok8, unit.nb, q);
      } else {
        const float w = ok && a.row_weight ? __ldcg(a.row_weight + row) : 1.0f;
        const float w8 = ok8 && a.row_weight ? __ldcg(a.row_weight + row8) : 1.0f;
        store_rows(a.out, a.n, a.store_bf16, acc, row, ok, w, row8, ok8, w8, unit.nb * kTileCols, q);
      }
    }
    if constexpr (kStaged)
      if (leader) ptx::bulk_wait();  // the stores have read the staging (and written) before the CTA exits
    if constexpr (kCluster > 1) ptx::cluster_sync();
  }
};

}  // namespace loom::gemm
