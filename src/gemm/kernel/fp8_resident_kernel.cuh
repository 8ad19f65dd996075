// The resident-rows kernel: weights on M, an expert's token rows resident in shared memory over all
// of K (operand/resident_rows.cuh), the expert-tile scheduler (units: an expert's rows in chunks of
// at most `capacity`, split evenly), and the combine by bulk reductions from each consumer
// warpgroup's staging block, in the skeleton. For batches of a few dozen rows per expert reaching
// the GEMM in expert bins, where nearly every expert has rows.
//
//   warp roles   warp 0 lane 0 the weight tiles (every weight block of the unit's expert, K blocks
//                inner), warp 1 the unit records, warps 2-3 the gather into the token slots;
//                warpgroups 1 and 2 the MMAs over 64 weight rows each (no register reallocation:
//                the accumulators of a 48-wide chunk fit the launch's budget)
#pragma once

#include <cuda.h>

#include <cstdint>

#include "gemm/epilogue/stage_columns.cuh"
#include "gemm/kernel/grouped_gemm_sm90.cuh"
#include "gemm/operand/resident_rows.cuh"
#include "gemm/promote_rows.cuh"
#include "gemm/ring_cursor.cuh"
#include "gemm/scheduler/expert_tiles.cuh"
#include "gemm/scheduler/work_queue.cuh"
#include "ptx/barrier.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/pdl.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"

namespace loom::gemm {

struct ResidentArgs {
  const uint8_t* x;       // [x_rows, K] token-order codes (plain byte order)
  const float* x_scales;  // [K/128, x_rows]
  int64_t x_rows;
  const float* weight_scales;
  const int32_t* offsets;
  const int32_t* counts;  // expert bins or nullptr: offsets
  int stride;
  const int32_t* row_token;
  const float* row_weight;
  float* out;
  int experts, n, k, nblocks, kblocks;
  int capacity;           // rows per chunk (resident_rows_capacity)
  int weights_evict_first;
  int32_t* queue;         // dynamic walk: units past the first round from this counter; nullptr: round robin
};

namespace resident {

inline constexpr int kTileRows = 128;  // weight rows per tile: two consumer warpgroups of 64 (the MMA's M)
// Weight tiles in flight per SM: the token rows take most of the shared memory (48 rows over all of
// K=2048 beside 5 stages); 6 and 8 stages, with K split into ranges to make room, were no faster.
inline constexpr int kStages = 5;
inline constexpr int kMaxUnitScales = 512;  // a unit's weight scales (N/128 x K/128), in its record
inline constexpr int kWTileBytes = kTileRows * kBlockK;
inline constexpr int kStageStride = 64 + 4;  // floats per staged token: +4 spreads a warp's stores over the banks
inline constexpr int kRecordSlots = 2;       // unit records: the one in use and the next (the gather's)
static_assert(kWTileBytes % 1024 == 0, "128-byte-swizzled TMA tiles start on 1024-byte boundaries");
static_assert(kBlockK == 4 * 32, "four k32 MMAs per K block");
static_assert(kMaxChunkRows <= 128, "one bulk reduction per token by a thread of the consumer warpgroup");
static_assert(kStageStride * 4 % 16 == 0, "each staged token starts 16-byte aligned (bulk copies)");

struct UnitRecord {
  int32_t token[kMaxChunkRows];  // -1 past the chunk's rows
  float weight[kMaxChunkRows];
  float wscale[kMaxUnitScales];  // [weight block][K block]
  int32_t expert, rows, width;   // rows < 0: the end of the walk
};

struct alignas(1024) Storage {
  static constexpr int kStages = resident::kStages;
  static constexpr int kRecordSlots = resident::kRecordSlots;
  uint8_t w[kStages][kWTileBytes];
  float stage[2][kMaxChunkRows][kStageStride];  // per consumer warpgroup: top-k-weighted outputs by token
  RecordRing<UnitRecord, kRecordSlots> meta;
  uint64_t full[kStages], empty[kStages];
  SlotBarriers slot;
  ExpertTiles tiles;
};
// One sm_90 CTA's shared memory, less the 1 KiB the kernel's static shared memory shows (cuobjdump).
inline constexpr size_t kSmemLimit = 227 * 1024 - 1024;
// After Storage: kblocks token slots of capacity x 128 bytes, then kblocks x capacity activation scales.
inline constexpr size_t kSmemFixed = sizeof(Storage) + 1024;  // + alignment slack for the 1024-byte base

// Epilogue: out[token, n0 .. n0 + 63] += top-k weight * final, by one bulk reduction per token from
// the warpgroup's staging block (a thread holds weight rows r, r + 8 of token columns c, c + 1);
// red.v4 from registers after a transpose across lanes was slower. The block is rewritten only
// after the reductions issued from it have read it: each issuing thread waits for its own, then
// the warpgroup's barrier.
template <int W, class S, class A>
__device__ __forceinline__ void combine(S& s, const A& a, const UnitRecord& m, const float (&final_acc)[W / 2], int n0,
                                        int consumer) {
  const int wg_thread = threadIdx.x % 128, lane = threadIdx.x % 32, warp_in_wg = wg_thread / 32, g = lane / 4,
            q = lane % 4;
  const uint32_t barrier_id = 1 + consumer;  // 0 is __syncthreads
  float(*stage)[kStageStride] = s.stage[consumer];
  ptx::bulk_wait_read();
  ptx::named_barrier_sync(barrier_id, 128);
#pragma unroll
  for (int j = 0; j < W / 8; ++j) {
    const int c = 8 * j + 2 * q, r = 16 * warp_in_wg + g;
    const float w0 = m.weight[c], w1 = m.weight[c + 1];
    stage[c][r] = w0 * final_acc[4 * j + 0];
    stage[c + 1][r] = w1 * final_acc[4 * j + 1];
    stage[c][r + 8] = w0 * final_acc[4 * j + 2];
    stage[c + 1][r + 8] = w1 * final_acc[4 * j + 3];
  }
  ptx::fence_proxy_async_shared();  // this thread's stores, before the async proxy reads them
  ptx::named_barrier_sync(barrier_id, 128);
  if (wg_thread < m.rows && n0 < a.n) {
    ptx::bulk_reduce_add_f32(a.out + int64_t(m.token[wg_thread]) * a.n + n0, &stage[wg_thread][0],
                             uint32_t(min(64, a.n - n0)) * 4u);
    ptx::bulk_commit();
  }
}

// Mainloop: one unit's weight blocks on chunk width W (consumer warpgroup `consumer`): per weight
// block the K loop with one accumulator (MMAs, then the column promotion by the slot's scales), then
// the combine. The first weight block waits for each token slot.
template <int W, class S, class A>
__device__ __forceinline__ void consume_unit(S& s, const A& a, const UnitRecord& m, PipelineState<kStages>& st,
                                             uint32_t unit_parity, int consumer) {
  using Mma = ptx::WgmmaE4M3<W>;
  const int lane = threadIdx.x % 32, q = lane % 4;
  const uint8_t* slots = token_slots(s);
  const float* scales = slot_scales(s, a);
  for (int nb = 0; nb < a.nblocks; ++nb) {
    float final_acc[W / 2], acc[W / 2];
#pragma unroll
    for (int i = 0; i < W / 2; ++i) final_acc[i] = 0.0f;
    const bool last_block = nb == a.nblocks - 1;
    for (int kb = 0; kb < a.kblocks; ++kb) {
      const float sw = m.wscale[nb * a.kblocks + kb];
      if (nb == 0) {
        ptx::mbar_wait(&s.slot.full[kb], unit_parity);
        // The slot arrived through cp.async (generic proxy); wgmma reads it through the async proxy.
        ptx::fence_proxy_async_shared();
      }
      ptx::mbar_wait(&s.full[st.stage], st.phase);
      const uint64_t desc_a = ptx::smem_desc_k_major_sw128(&s.w[st.stage][consumer * 64 * kBlockK]);
      const uint64_t desc_b = ptx::smem_desc_k_major_sw128(slots + size_t(kb) * a.capacity * kBlockK);
#pragma unroll
      for (int i = 0; i < W / 2; ++i) ptx::fence_operand(acc[i]);
      ptx::wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kBlockK / 32; ++ks) Mma::mma(acc, desc_a + 2 * ks, desc_b + 2 * ks, ks > 0 ? 1 : 0);
      ptx::wgmma_commit_group();
      ptx::wgmma_wait_group<0>();
#pragma unroll
      for (int i = 0; i < W / 2; ++i) ptx::fence_operand(acc[i]);
      float sa[W / 4];
      column_scales<W>(sa, scales + kb * a.capacity, sw, q);
      // This thread's reads of the stage (and, after the last weight block, of the slot) are done.
      release_slot(&s.empty[st.stage]);
      if (last_block) release_slot(&s.slot.empty[kb]);
      st.advance();
      promote_columns<W>(final_acc, acc, sa);
    }
    combine<W>(s, a, m, final_acc, nb * kTileRows + consumer * 64, consumer);
  }
}

}  // namespace resident

struct ResidentKernel {
  using Maps = CUtensorMap;
  using Args = ResidentArgs;
  using Params = ParamRefs<Maps, Args>;
  using SharedStorage = resident::Storage;
  static constexpr uint32_t kProducerRegs = 0, kConsumerRegs = 0;  // no register reallocation
  using StageCursor = PipelineState<resident::kStages>;
  using MetaCursor = PipelineState<resident::kRecordSlots>;

  struct Schedule {
    int units;
  };

  static __device__ __forceinline__ void init(SharedStorage& s, const Params& p) {
    for (int i = 0; i < resident::kStages; ++i) {
      ptx::mbar_init(&s.full[i], 1);
      ptx::mbar_init(&s.empty[i], kConsumerWarps * kReleaseArrivalsPerWarp);
    }
    for (int kb = 0; kb < p.a.kblocks; ++kb) {
      ptx::mbar_init(&s.slot.full[kb], resident::kGatherThreads);
      ptx::mbar_init(&s.slot.empty[kb], kConsumerWarps * kReleaseArrivalsPerWarp);
    }
    // Every consumer warp and gather warp, and the weight thread.
    init_record_ring(s.meta, (kConsumerWarps + resident::kGatherThreads / 32) * kReleaseArrivalsPerWarp + 1);
  }
  static __device__ __forceinline__ void prefetch(const Params& p) { ptx::prefetch_tensormap(&p.maps); }

  // Everything below reads what the routing and quantisation kernels wrote.
  static __device__ __forceinline__ Schedule prepare(SharedStorage& s, const Params& p) {
    ptx::pdl_wait();
    build_expert_tiles(s.tiles, p.a, p.a.capacity);  // its barriers also publish the mbarrier initialisation
    return Schedule{s.tiles.tile_start[p.a.experts]};
  }

  static __device__ __forceinline__ void produce(SharedStorage& s, const Params& p, const Schedule& sched) {
    const Args& a = p.a;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (warp == 0) {
      if (lane == 0) produce_weights(s, p);
    } else if (warp == 1) {
      // Unit records, one unit ahead of the consumers; the queue's units fetched one unit ahead too.
      run_record_warp(
          s.meta, sched.units, a.queue != nullptr ? int(gridDim.x) : INT32_MAX, a.queue,
          [&](resident::UnitRecord& m, int u, int lane) {
            const int e = tile_expert(s.tiles, a.experts, u), chunk = u - s.tiles.tile_start[e];
            const int chunks = s.tiles.tile_start[e + 1] - s.tiles.tile_start[e];
            const int expert_rows = s.tiles.expert_end[e] - s.tiles.expert_row[e];
            const int per_chunk = (expert_rows + chunks - 1) / chunks;  // <= capacity
            const int row0 = chunk * per_chunk, rows = min(per_chunk, expert_rows - row0);
            const int width = (rows + 15) / 16 * 16;
            const int begin = s.tiles.expert_row[e] + row0;
            for (int i = lane; i < width; i += 32) {
              m.token[i] = i < rows ? __ldcg(a.row_token + begin + i) : -1;
              m.weight[i] = i >= rows ? 0.0f : a.row_weight ? __ldcg(a.row_weight + begin + i) : 1.0f;
            }
            const float* wscale = a.weight_scales + int64_t(e) * a.nblocks * a.kblocks;
            for (int i = lane; i < a.nblocks * a.kblocks; i += 32) m.wscale[i] = __ldg(wscale + i);
            if (lane == 0) {
              m.expert = e;
              m.rows = rows;
              m.width = width;
            }
          },
          [](resident::UnitRecord& m, int lane) {
            if (lane == 0) m.rows = -1;
          });
    } else {
      resident::gather_resident_rows(s, a);
    }
  }

  // The weight stream: each unit's N/128 x K/128 tiles in the consumers' order, the units as the
  // records name them (the walk may be dynamic).
  static __device__ __forceinline__ void produce_weights(SharedStorage& s, const Params& p) {
    const Args& a = p.a;
    StageCursor st;
    MetaCursor mc;
    const uint64_t evict_first = ptx::l2_policy_evict_first();
    while (true) {
      ptx::mbar_wait(&s.meta.full[mc.stage], mc.phase);
      const resident::UnitRecord& m = s.meta.rec[mc.stage];
      if (m.rows < 0) break;
      const int expert = m.expert;
      ptx::mbar_arrive(&s.meta.empty[mc.stage]);
      mc.advance();
      for (int nb = 0; nb < a.nblocks; ++nb)
        for (int kb = 0; kb < a.kblocks; ++kb) {
          ptx::mbar_wait(&s.empty[st.stage], st.phase ^ 1);
          ptx::mbar_arrive_expect_tx(&s.full[st.stage], resident::kWTileBytes);
          const int w_row = expert * a.n + nb * resident::kTileRows;
          if (a.weights_evict_first)
            ptx::tma_load_2d_hint(s.w[st.stage], &p.maps, kb * resident::kBlockK, w_row, &s.full[st.stage], evict_first);
          else
            ptx::tma_load_2d(s.w[st.stage], &p.maps, kb * resident::kBlockK, w_row, &s.full[st.stage]);
          st.advance();
        }
    }
  }

  static __device__ __forceinline__ void consume(SharedStorage& s, const Params& p, const Schedule&, int consumer) {
    const Args& a = p.a;
    MetaCursor mc;
    StageCursor st;
    uint32_t unit_parity = 0;
    while (true) {
      ptx::mbar_wait(&s.meta.full[mc.stage], mc.phase);
      const resident::UnitRecord& m = s.meta.rec[mc.stage];
      if (m.rows < 0) break;
      static_assert(resident::kMaxChunkRows == 48, "one consume_unit instantiation per width in 16s");
      switch (m.width) {
        case 16: resident::consume_unit<16>(s, a, m, st, unit_parity, consumer); break;
        case 32: resident::consume_unit<32>(s, a, m, st, unit_parity, consumer); break;
        default: resident::consume_unit<48>(s, a, m, st, unit_parity, consumer); break;
      }
      release_slot(&s.meta.empty[mc.stage]);
      unit_parity ^= 1;
      mc.advance();
    }
    ptx::bulk_wait();  // this thread's reductions have completed, before the CTA exits
  }
};

}  // namespace loom::gemm
