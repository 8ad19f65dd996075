// Scheduler of the kernels whose units cut each expert's rows into tiles (the tokens-on-M kernel:
// 64- or 128-row tiles; the resident-rows kernel: chunks of up to its capacity): after the PDL
// wait, every CTA scans the experts' tile counts into tile_start (units are numbered expert by
// expert, so CTAs running together share an expert's weights); then one producer warp, the record
// warp, walks the CTA's units (round robin, the last round from the work queue) and writes each
// unit's record (its rows' tokens and top-k weights, its weight scales: whatever the kernel's
// record holds) into a ring the other roles read, so no consumer load waits on global memory.
#pragma once

#include <cstdint>

#include "contract/device_layout.hpp"
#include "gemm/expert_scan.cuh"
#include "gemm/ring_cursor.cuh"
#include "gemm/scheduler/work_queue.cuh"
#include "loom/types.hpp"
#include "ptx/mbarrier.cuh"

namespace loom::gemm {

struct ExpertTiles {
  int32_t tile_start[kGpuMaxExperts + 1];  // tiles of the experts before e (tile_start[E]: all)
  int32_t expert_row[kGpuMaxExperts];      // expert e's rows are [expert_row[e], expert_end[e])
  int32_t expert_end[kGpuMaxExperts];
};

// tile_start from the offsets or the bin counts (A: experts, offsets, counts, stride):
// ceil(rows / rows_per_tile) tiles per expert, an exclusive scan by warp 0. Every thread of the CTA.
template <class A>
__device__ __forceinline__ void build_expert_tiles(ExpertTiles& s, const A& a, int rows_per_tile) {
  for (int e = threadIdx.x; e < a.experts; e += blockDim.x) {
    const int begin = a.counts ? e * a.stride : __ldcg(a.offsets + e);
    const int rows = a.counts ? min(__ldcg(a.counts + e * kBinCountStride), a.stride) : __ldcg(a.offsets + e + 1) - begin;
    s.tile_start[e + 1] = (rows + rows_per_tile - 1) / rows_per_tile;
    s.expert_row[e] = begin;
    s.expert_end[e] = begin + rows;
  }
  __syncthreads();
  if (threadIdx.x < 32) scan_expert_counts(s.tile_start, a.experts, threadIdx.x);
  __syncthreads();
}

// The expert of tile t: the last whose first tile is at or before t (experts without rows share
// their start with the next one, so the last of them is the one with rows).
__device__ __forceinline__ int tile_expert(const ExpertTiles& s, int experts, int tile) {
  int lo = 0, hi = experts - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (s.tile_start[mid] <= tile) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// A ring of unit records written by the record warp (full: its 32 lanes, after their stores) and
// released by every role that reads them (empty: as many arrivals as the kernel counts).
template <class Record, int kSlotsT>
struct RecordRing {
  static constexpr int kSlots = kSlotsT;
  Record rec[kSlots];
  uint64_t full[kSlots];
  uint64_t empty[kSlots];
};

template <class Ring>
__device__ __forceinline__ void init_record_ring(Ring& r, uint32_t readers) {
  for (int i = 0; i < Ring::kSlots; ++i) {
    ptx::mbar_init(&r.full[i], 32);
    ptx::mbar_init(&r.empty[i], readers);
  }
}

// The record warp: for each of this CTA's units, in order, waits for a free slot and fills it
// (fill(record, u, lane): every lane its share; end(record, lane): the walk's end marker), then
// the next unit: round robin below static_end, then from the work queue, fetched one unit ahead so
// the atomic's round trip hides behind the current unit. All 32 lanes of the warp.
template <class Ring, class Fill, class End>
__device__ __forceinline__ void run_record_warp(Ring& ring, int units, int static_end, int32_t* queue, const Fill& fill,
                                                const End& end) {
  const int lane = threadIdx.x % 32;
  PipelineState<Ring::kSlots> mc;
  for (int u = blockIdx.x;;) {
    ptx::mbar_wait(&ring.empty[mc.stage], mc.phase ^ 1);
    auto& m = ring.rec[mc.stage];
    if (u >= units)
      end(m, lane);
    else
      fill(m, u, lane);
    ptx::mbar_arrive(&ring.full[mc.stage]);  // release: this lane's stores
    mc.advance();
    if (u >= units) break;
    if (u + int(gridDim.x) < static_end) {
      u += gridDim.x;
    } else {
      u = fetch_work_unit(queue, static_end, lane);
    }
  }
  if (queue != nullptr && lane == 0) leave_work_queue(queue);  // lane 0 made every fetch
}

}  // namespace loom::gemm
