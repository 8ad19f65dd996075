// Epilogue of the tokens-on-M kernel. Fast combine: a consumer warpgroup's finished 64 x 128 block
// of top-k-weighted outputs goes to a shared-memory staging block, and the combine warp (producer
// warp 3) adds each row into its token's output row by one bulk reduction
// (cp.reduce.async.bulk.add.f32) while the warpgroup starts its next unit; faster than
// red.global.add.v4.f32 from the consumers' registers, which both warpgroups issued at once with
// the tensor pipe idle. Deterministic combine: each thread stores its rows' outputs as the routes'
// rows (lanes swap halves so that each stores 16 consecutive bytes); the combine kernel sums them.
#pragma once

#include <cstdint>

#include "gemm/epilogue/route_rows.cuh"
#include "gemm/mainloop/fp8_tokens_on_m.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/red.cuh"
#include "ptx/tma.cuh"

namespace loom::gemm::tokens_on_m {

// Floats per staged row: 16 bytes of padding spread a warp's 8 rows over the banks.
inline constexpr int kOutStride = kTileCols + 4;
static_assert(kOutStride * 4 % 16 == 0, "each staged row starts 16-byte aligned (bulk copies)");

struct alignas(16) OutStage {
  float v[64][kOutStride];
  int32_t token[64];    // the row's token; -1: no row
  int32_t col0, bytes;  // first output column, bytes per row (0: nothing to add; < 0: the walk's end)
};

struct StagedCombineStorage {
  OutStage out[2];     // per consumer warpgroup
  uint64_t full[2];    // the warpgroup's 128 threads, after their stores and proxy fences
  uint64_t empty[2];   // the combine warp, once its bulk reductions have read the block
};

__device__ __forceinline__ void init_staged_combine(StagedCombineStorage& e) {
  for (int c = 0; c < 2; ++c) {
    ptx::mbar_init(&e.full[c], 128);
    ptx::mbar_init(&e.empty[c], kReleaseArrivalsPerWarp);
  }
}

// The combine warp: units in the consumers' order; per unit, each warpgroup's block, until both
// warpgroups stage the end of the walk (bytes < 0).
template <class Probe, class A>
__device__ __forceinline__ void drain_staged_blocks(StagedCombineStorage& e, const A& a) {
  const int lane = threadIdx.x % 32;
  [[maybe_unused]] typename Probe::Sums ph = {};
  uint32_t phase = 0;
  for (bool end = false; !end;) {
    for (int c = 0; c < 2; ++c) {
      const OutStage& o = e.out[c];
      [[maybe_unused]] const uint32_t ph_wait = Probe::clock();
      ptx::mbar_wait(&e.full[c], phase);
      Probe::add(ph, kPhCombineWait, Probe::clock() - ph_wait);
      Probe::add(ph, kPhBlocks, 1u);
      const int bytes = o.bytes, col0 = o.col0;
      end = bytes < 0;
      if (bytes > 0)
        for (int i = lane; i < 64; i += 32) {
          const int token = o.token[i];
          if (token >= 0) ptx::bulk_reduce_add_f32(a.out + int64_t(token) * a.n + col0, &o.v[i][0], uint32_t(bytes));
        }
      ptx::bulk_commit();
      [[maybe_unused]] const uint32_t ph_read = Probe::clock();
      ptx::bulk_wait_read();  // this lane's reductions have read the block
      Probe::add(ph, kPhCombineRead, Probe::clock() - ph_read);
      release_slot(&e.empty[c]);
    }
    phase ^= 1;
  }
  ptx::bulk_wait();  // and have completed, before the CTA exits
  if (lane == 0) Probe::flush(3, ph);
}

// Consumer side, a unit without rows for this warpgroup: the combine warp takes a block per unit and
// warpgroup, so an empty one.
__device__ __forceinline__ void stage_nothing(StagedCombineStorage& e, int consumer, uint32_t& phase) {
  ptx::mbar_wait(&e.empty[consumer], phase ^ 1);
  if (threadIdx.x % 128 == 0) e.out[consumer].bytes = 0;
  ptx::mbar_arrive(&e.full[consumer]);
  phase ^= 1;
}

// Consumer side, after the last unit: the end of the walk, for the combine warp.
__device__ __forceinline__ void stage_end(StagedCombineStorage& e, int consumer, uint32_t phase) {
  ptx::mbar_wait(&e.empty[consumer], phase ^ 1);
  if (threadIdx.x % 128 == 0) e.out[consumer].bytes = -1;
  ptx::mbar_arrive(&e.full[consumer]);
}

// Consumer side, fast combine: the weighted outputs of this warpgroup's block into its staging
// block (the record is read, then released by release_record, before the wait for the block).
template <class Probe, class Record, class A, class Release>
__device__ __forceinline__ void stage_block(StagedCombineStorage& e, const Record& m, const A& a,
                                            const float (&final_acc)[64], int consumer, int row_base, int row_a,
                                            int row_b, int wg_rows, int nb, uint32_t& phase, const Release& release_record,
                                            [[maybe_unused]] typename Probe::Sums& ph) {
  const int wg_thread = threadIdx.x % 128, q = threadIdx.x % 4;
  OutStage& o = e.out[consumer];
  const float wt_a = m.weight[row_base + row_a], wt_b = m.weight[row_base + row_b];
  const int token = wg_thread < 64 && wg_thread < wg_rows ? m.token[row_base + wg_thread] : -1;
  release_record();
  [[maybe_unused]] const uint32_t ph_wait = Probe::clock();
  ptx::mbar_wait(&e.empty[consumer], phase ^ 1);  // its previous block has been read
  Probe::add(ph, kPhOutWait, Probe::clock() - ph_wait);
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    *reinterpret_cast<float2*>(&o.v[row_a][8 * j + 2 * q]) =
        make_float2(wt_a * final_acc[4 * j + 0], wt_a * final_acc[4 * j + 1]);
    *reinterpret_cast<float2*>(&o.v[row_b][8 * j + 2 * q]) =
        make_float2(wt_b * final_acc[4 * j + 2], wt_b * final_acc[4 * j + 3]);
  }
  if (wg_thread < 64) o.token[wg_thread] = token;
  if (wg_thread == 0) {
    o.col0 = a.seg.first_row(nb);
    o.bytes = nb < a.nblocks ? min(kTileCols, a.seg.end_row(nb) - o.col0) * 4 : 0;
  }
  ptx::fence_proxy_async_shared();  // this thread's stores, before the async proxy reads them
  ptx::mbar_arrive(&e.full[consumer]);
  phase ^= 1;
}

// Consumer side, deterministic combine: lanes q and q ^ 1 swap halves so that each holds four
// consecutive outputs of one row (even q: row r, odd q: row r + 8), one 16-byte store each.
template <class Record, class A, class Release>
__device__ __forceinline__ void store_rows(const Record& m, const A& a, const float (&final_acc)[64], int row_base,
                                           int row_a, int row_b, int wg_rows, int nb, const Release& release_record) {
  const int q = threadIdx.x % 4;
  const bool even = q % 2 == 0;
  const int my_row = row_base + (even ? row_a : row_b);  // in the tile
  const bool ok = my_row - row_base < wg_rows;
  const float wt = m.weight[my_row];
  const int64_t dst_row = int64_t(m.row0 + my_row);
  // The block's output columns (its segment's rows; a wide unit's block past the last: none).
  const int n_first = a.seg.first_row(nb), n_end = nb < a.nblocks ? a.seg.end_row(nb) : 0;
  release_record();  // every read of the unit's record is done
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const float give0 = even ? final_acc[4 * j + 2] : final_acc[4 * j + 0];
    const float give1 = even ? final_acc[4 * j + 3] : final_acc[4 * j + 1];
    const float got0 = __shfl_xor_sync(0xffffffffu, give0, 1);
    const float got1 = __shfl_xor_sync(0xffffffffu, give1, 1);
    const float v0 = even ? final_acc[4 * j + 0] : got0, v1 = even ? final_acc[4 * j + 1] : got1;
    const float v2 = even ? got0 : final_acc[4 * j + 2], v3 = even ? got1 : final_acc[4 * j + 3];
    const int n = n_first + 8 * j + 4 * (q / 2);
    if (ok && n < n_end) store_route_quad(a.out, a.store_bf16, dst_row, a.n, n, wt * v0, wt * v1, wt * v2, wt * v3);
  }
}

}  // namespace loom::gemm::tokens_on_m
