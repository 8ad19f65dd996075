// Scheduler of the GEMMs with weight rows on the MMA's M side (fp8_weights_on_m_kernel.cuh): a work
// unit is one expert's block of 128 weight rows over a K range, for all of the expert's rows (or,
// from expert bins, for one chunk of them). The parts:
//   experts   which experts have rows and where: dense (all E, known before the routing exists),
//             compact (the experts with rows, from the offsets, from the hit list the kernel before
//             wrote, or from the routes' early expert ids), or the chunk walk over expert bins;
//   walk      which units this CTA takes: round robin, balanced shares of (unit, K block), split K
//             (WorkCursor); and the dynamic tail (sorted rows: the producer takes the last round
//             from the work queue and announces each unit to the consumers through UnitRing).
// The parameters are the kernel's (duck-typed A: experts, nblocks, kblocks, offsets, counts,
// stride, dense, split_k, kblocks_per_split, balanced, hit_list, early_ids, early_routes and the
// FastDivisors); the storage is WalkStorage, part of the kernel's shared storage.

#pragma once

#include <cuda/atomic>

#include <cstdint>

#include "contract/device_layout.hpp"
#include "gemm/gemm_fp8.hpp"
#include "gemm/kernel/grouped_gemm_sm90.cuh"
#include "gemm/ring_cursor.cuh"
#include "loom/types.hpp"
#include "ptx/barrier.cuh"
#include "ptx/mbarrier.cuh"

namespace loom::gemm {

// A work unit: one expert's 128 weight rows over one K range, for all of the expert's rows; or,
// from expert bins (the chunk walk), for one chunk of at most kWalkChunk of its rows.
struct Unit {
  int expert, nb, kb_begin, kb_end;
  int slot;   // compact mode: the expert's index in the hit list
  int chunk;  // chunk walk: the unit's chunk of the expert's rows
};

// Where the walk learns the experts with rows.
enum class ExpertsFrom {
  offsets,    // the dispatch's offsets (dense walk, or compact from the offsets or a hit list)
  early_ids,  // the routes' early expert ids, before the PDL wait (one routing CTA, a few routes)
  bins,       // the chunk walk over expert bins (no dispatch)
};

inline constexpr int kWalkChunk = kGatherMaxTokens;  // the chunk walk's chunks: the gathering kernels' widest
inline constexpr int kUnitSlots = 2;                 // dynamic tail: units announced ahead of the consumers

// The threads that build the walk's tables: the whole CTA, or (gathering kernels under the
// warm-up, whose producer reaches this from its loop while the consumers wait for walk_ready) the
// producer warpgroup alone, so that every thread of a barrier meets at the same instruction.
struct CtaGroup {
  static __device__ __forceinline__ int rank() { return int(threadIdx.x); }
  static __device__ __forceinline__ int size() { return int(blockDim.x); }
  static __device__ __forceinline__ void sync() { __syncthreads(); }
};
struct ProducerGroup {
  static constexpr uint32_t kBarrier = 4;  // named barrier (0: __syncthreads, 1-2: consumers, 3: the gather)
  static __device__ __forceinline__ int rank() { return int(threadIdx.x); }
  static __device__ __forceinline__ int size() { return kProducerThreads; }
  static __device__ __forceinline__ void sync() { ptx::named_barrier_sync(kBarrier, kProducerThreads); }
};

struct WalkStorage {
  // Dynamic tail: the producer announces each unit with rows as (index, expert's first row, rows)
  // as it starts loading it (index -1: no more units), so the consumers know their next unit before
  // its data arrives.
  int4 unit_ring[kUnitSlots];
  uint64_t unit_full[kUnitSlots];
  uint64_t unit_empty[kUnitSlots];
  int32_t hit_experts[kGpuMaxExperts];  // compact mode: experts with rows, ascending
  int2 hit_range[kGpuMaxExperts];       // ... and their (first row, rows), when read from a hit list
  int32_t hit_count;
  int32_t chunk_hits[kGpuMaxExperts / 32];
  alignas(16) int32_t early_key[kEarlyIdWords];  // read_early_ids
  uint64_t walk_ready;  // the producer warpgroup built the tables (ProducerGroup): every producer thread
};

// The chunk walk (gathered rows from expert bins): every unit is one (expert with rows, weight
// block, chunk of at most kWalkChunk rows), so an expert with many rows spreads over as many CTAs
// as it has chunks instead of lengthening one unit (skewed routes). Units [0, hits * nblocks) are
// the first chunks of the experts with rows, in expert order (decoded without a search), then the
// further chunks. Per hit-list slot: hit_experts the expert (its first row: expert * stride),
// hit_range (the further-chunk units of the slots up to it, an inclusive scan; its rows).
template <class Group, class S, class A>
__device__ __forceinline__ void build_chunk_walk(S& s, const A& a) {
  // Every expert's rows by expert into hit_range[e].y: one load per thread, one L2 round trip.
#pragma unroll 1
  for (int e = Group::rank(); e < a.experts; e += Group::size())
    s.hit_range[e].y = min(__ldcg(a.counts + e * kBinCountStride), a.stride);
  Group::sync();
  if (threadIdx.x < 32) {
    // 32 experts a round, in a rolled loop (unrolled, the kernel's code grew by 1700 instructions
    // and ran slower). A round writes slots below its first expert, so never what a later round reads.
    const int lane = threadIdx.x;
    int slots = 0, further_before = 0;
#pragma unroll 1
    for (int e0 = 0; e0 < a.experts; e0 += 32) {
      const int e = e0 + lane;
      const int rows = e < a.experts ? s.hit_range[e].y : 0;
      __syncwarp();  // the round's reads before any of its writes (a slot can be another lane's expert)
      const unsigned hit_mask = __ballot_sync(0xffffffffu, rows > 0);
      int further = max(0, (rows + kWalkChunk - 1) / kWalkChunk - 1) * a.nblocks;
#pragma unroll
      for (int off = 1; off < 32; off *= 2) {
        const int f = __shfl_up_sync(0xffffffffu, further, off);
        if (lane >= off) further += f;
      }
      if (rows > 0) {
        const int slot = slots + __popc(hit_mask & ((1u << lane) - 1u));
        s.hit_experts[slot] = e;
        s.hit_range[slot] = make_int2(further_before + further, rows);
      }
      slots += __popc(hit_mask);
      further_before += __shfl_sync(0xffffffffu, further, 31);
    }
    if (lane == 0) s.hit_count = slots;
  }
  Group::sync();
}

template <ExpertsFrom kFrom, class S, class A>
__device__ __forceinline__ int unit_count(const S& s, const A& a) {
  if constexpr (kFrom == ExpertsFrom::bins)
    return s.hit_count > 0 ? s.hit_count * a.nblocks + s.hit_range[s.hit_count - 1].x : 0;
  return (a.dense ? a.experts : s.hit_count) * a.nblocks * a.split_k;
}

// Consecutive units share an expert (then its 128-row blocks, then K ranges), so CTAs running at
// the same time read the same activation rows.
template <ExpertsFrom kFrom, class S, class A>
__device__ __forceinline__ Unit decode_unit(const S& s, const A& a, int u) {
  if constexpr (kFrom == ExpertsFrom::bins) {
    // Clamped so that the warm-up's dry walk, which decodes before the walk is built (stale shared
    // memory), stays in bounds; a built walk never needs the clamps.
    const int hits = min(max(s.hit_count, 1), int(kGpuMaxExperts));
    Unit unit;
    unit.kb_begin = 0;
    unit.kb_end = a.kblocks;
    if (u < hits * a.nblocks) {  // the first chunks, no search
      unit.slot = int(a.nblocks_div.div(uint32_t(u)));
      unit.nb = u - unit.slot * a.nblocks;
      unit.chunk = 0;
    } else {
      // The further chunks: the first slot whose further units end after u; its units are (weight
      // block, chunk), chunks fastest, so CTAs running together read the same weight tile.
      u -= hits * a.nblocks;
      int lo = 0, hi = hits - 1;
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (s.hit_range[mid].x > u) hi = mid; else lo = mid + 1;
      }
      const int local = u - (lo > 0 ? s.hit_range[lo - 1].x : 0);
      const int further = max(1, (s.hit_range[lo].y + kWalkChunk - 1) / kWalkChunk - 1);
      unit.slot = lo;
      unit.nb = local / further;
      unit.chunk = 1 + local - unit.nb * further;
    }
    unit.expert = s.hit_experts[unit.slot];
    return unit;
  }
  const int per_expert = a.nblocks * a.split_k;
  const int slot = int(a.per_expert_div.div(uint32_t(u))), rem = u - slot * per_expert;
  Unit unit;
  unit.expert = a.dense ? slot : s.hit_experts[slot];
  unit.slot = slot;
  unit.nb = int(a.split_k_div.div(uint32_t(rem)));
  const int ks = rem - unit.nb * a.split_k;
  unit.kb_begin = ks * a.kblocks_per_split;
  unit.kb_end = min(a.kblocks, unit.kb_begin + a.kblocks_per_split);
  unit.chunk = 0;
  return unit;
}

// The units of this CTA, one K range at a time. Round robin: whole units blockIdx.x, + gridDim.x, ...
// Balanced: the (unit, K block) pairs in unit-major order are cut into gridDim.x equal shares and
// this CTA walks share blockIdx.x, so a unit may be split at any K block between two CTAs (their
// partial sums meet in the atomic combine). Every role of the CTA walks the same sequence.
struct WorkCursor {
  // Balanced: flattened (unit, K block) index (E * nblocks * kblocks < 2^31: 512 x 512 x 512 at
  // most); round robin: unit index.
  int pos, end;

  template <class A>
  __device__ WorkCursor(const A& a, int units) {
    if (a.balanced) {
      // Share b: total / grid pairs, one more for the first total % grid shares.
      const int total = units * a.kblocks, grid = int(gridDim.x), b = int(blockIdx.x);
      const int share = int(a.grid_div.div(uint32_t(total))), extra = total - share * grid;
      pos = b * share + min(b, extra);
      end = pos + share + (b < extra ? 1 : 0);
    } else {
      pos = int(blockIdx.x);
      end = units;
    }
  }
  template <ExpertsFrom kFrom, class S, class A>
  __device__ bool next(const S& s, const A& a, Unit& unit) {
    if (pos >= end) return false;
    if (!a.balanced) {
      unit = decode_unit<kFrom>(s, a, pos);
      pos += int(gridDim.x);
      return true;
    }
    const int u = int(a.kblocks_div.div(uint32_t(pos))), kb = pos - u * a.kblocks;
    unit = decode_unit<kFrom>(s, a, u);  // split_k is 1 here: the unit spans every K block
    unit.kb_begin = kb;
    unit.kb_end = min(a.kblocks, kb + (end - pos));
    pos += unit.kb_end - unit.kb_begin;
    return true;
  }
};

// Compact mode: the experts with at least one row, in ascending order (ballot per 32 experts,
// then a prefix over the per-32 counts). Every CTA builds the same list.
template <class Group, class S, class A>
__device__ __forceinline__ void build_hit_list(S& s, const A& a) {
  const int warp = Group::rank() / 32, lane = Group::rank() % 32, warps = Group::size() / 32;
  const int chunks = (a.experts + 31) / 32;
#pragma unroll 1
  for (int c = warp; c < chunks; c += warps) {
    const int e = c * 32 + lane;
    const bool hit = e < a.experts && __ldcg(a.offsets + e + 1) > __ldcg(a.offsets + e);
    const unsigned mask = __ballot_sync(0xffffffffu, hit);
    if (lane == 0) s.chunk_hits[c] = __popc(mask);
  }
  Group::sync();
#pragma unroll 1
  for (int c = warp; c < chunks; c += warps) {
    int base = 0;
    for (int i = 0; i < c; ++i) base += s.chunk_hits[i];
    const int e = c * 32 + lane;
    const bool hit = e < a.experts && __ldcg(a.offsets + e + 1) > __ldcg(a.offsets + e);
    const unsigned mask = __ballot_sync(0xffffffffu, hit);
    if (hit) s.hit_experts[base + __popc(mask & ((1u << lane) - 1))] = e;
    if (c == chunks - 1 && lane == 0) s.hit_count = base + __popc(mask);
  }
  Group::sync();
}

// Compact mode from a hit list the kernel before wrote: its count and entries, in one round trip
// (entries past the count are stale and never read).
template <class Group, class S, class A>
__device__ __forceinline__ void load_hit_list(S& s, const A& a) {
#pragma unroll 1
  for (int i = Group::rank(); i <= a.experts; i += Group::size()) {
    const int4 h = __ldcg(a.hit_list + i);
    if (i == 0) {
      s.hit_count = h.x;
    } else {
      s.hit_experts[i - 1] = h.x;
      s.hit_range[i - 1] = make_int2(h.y, h.z);
    }
  }
  Group::sync();
}

// Compact mode from the early expert ids (GemmFp8Params::early_ids): warp 0 spins until every
// route's word is this run's, then lists the distinct experts in ascending order with their first
// sorted row (the routes to lower experts: the dispatch's offsets) and their rows, as the hit list
// would. Before the PDL wait: nothing else the kernel before writes is read here. Short code on
// purpose: it is inlined beside the producer's loop (the warm-up's end), where unrolled shuffles
// slowed the gathering GEMM.
template <class Group, class S, class A>
__device__ __forceinline__ void read_early_ids(S& s, const A& a) {
  static_assert(kEarlyIdWords <= 32 && kEarlyIdWords % 4 == 0, "a lane per route; keys read four at a time");
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x, routes = a.early_routes;
    uint32_t word = 0;
    if (lane < routes) {
      cuda::atomic_ref<uint32_t, cuda::thread_scope_device> ref(*const_cast<uint32_t*>(a.early_ids + lane));
      // One warp load per try: every lane's word at once.
      do {
        word = ref.load(cuda::std::memory_order_relaxed);
      } while (!__all_sync(routes >= 32 ? 0xffffffffu : (1u << routes) - 1u, (word & kEarlyIdValid) != 0));
    }
    __syncwarp();
    const int id = int(word & kEarlyIdMask) - 1;  // -1: no expert (or past the routes)
    const bool valid = lane < routes && id >= 0 && id < a.experts;
    const unsigned same = __match_any_sync(0xffffffffu, valid ? id : -1 - lane);
    const bool first = valid && (same & ((1u << lane) - 1u)) == 0;
    // Key 2 id + (not the expert's first route); none: past every id. Then key < 2x counts the
    // routes to experts below x, and those of them with an even key the experts below x.
    if (lane < kEarlyIdWords) s.early_key[lane] = valid ? 2 * id + (first ? 0 : 1) : 4 * kEarlyIdMask;
    __syncwarp();
    int rows_below = 0, slots_below = 0;
#pragma unroll 1
    for (int j = 0; j < routes; j += 4) {  // keys past the routes (to a multiple of 4): none
      const int4 q = *reinterpret_cast<const int4*>(&s.early_key[j]);
      rows_below += (q.x < 2 * id) + (q.y < 2 * id) + (q.z < 2 * id) + (q.w < 2 * id);
      slots_below += (q.x < 2 * id && !(q.x & 1)) + (q.y < 2 * id && !(q.y & 1)) + (q.z < 2 * id && !(q.z & 1)) +
                     (q.w < 2 * id && !(q.w & 1));
    }
    if (first) {
      s.hit_experts[slots_below] = id;
      s.hit_range[slots_below] = make_int2(rows_below, __popc(same));
    }
    const unsigned firsts = __ballot_sync(0xffffffffu, first);
    if (lane == 0) s.hit_count = __popc(firsts);
  }
  Group::sync();
}

// After the PDL wait (or, from early ids, before it): whatever the walk's units are derived from,
// then the number of units.
template <ExpertsFrom kFrom, class Group, class S, class A>
__device__ __forceinline__ int prepare_walk(S& s, const A& a) {
  if constexpr (kFrom == ExpertsFrom::bins) {
    build_chunk_walk<Group>(s, a);
  } else if constexpr (kFrom == ExpertsFrom::early_ids) {
    read_early_ids<Group>(s, a);
  } else if (!a.dense) {
    if (a.hit_list != nullptr)
      load_hit_list<Group>(s, a);
    else
      build_hit_list<Group>(s, a);
  }
  return unit_count<kFrom>(s, a);
}

// A unit's expert rows: from the hit list in shared memory when there is one (no global round
// trip before the unit's first load), else from the offsets.
template <ExpertsFrom kFrom, class S, class A>
__device__ __forceinline__ void unit_rows(const S& s, const A& a, const Unit& unit, int& row_begin, int& rows) {
  if constexpr (kFrom == ExpertsFrom::bins) {
    row_begin = unit.expert * a.stride + unit.chunk * kWalkChunk;
    rows = min(kWalkChunk, s.hit_range[unit.slot].y - unit.chunk * kWalkChunk);
  } else if (!a.dense && a.hit_list != nullptr) {
    const int2 r = s.hit_range[unit.slot];
    row_begin = r.x;
    rows = r.y;
  } else {
    row_begin = __ldcg(a.offsets + unit.expert);
    rows = __ldcg(a.offsets + unit.expert + 1) - row_begin;
  }
}

// The dynamic tail's announcements: the producer thread publishes each unit it starts (its index
// and rows; index -1 ends the walk), every consumer thread takes them in order.
struct UnitRing {
  static __device__ __forceinline__ void init(WalkStorage& s, uint32_t consumer_threads) {
    for (int i = 0; i < kUnitSlots; ++i) {
      ptx::mbar_init(&s.unit_full[i], 1);
      ptx::mbar_init(&s.unit_empty[i], consumer_threads);  // every consumer thread, after its read
    }
  }
  static __device__ __forceinline__ void announce(WalkStorage& s, PipelineState<kUnitSlots>& ring, int index,
                                                  int row_begin, int rows) {
    ptx::mbar_wait(&s.unit_empty[ring.stage], ring.phase ^ 1);
    s.unit_ring[ring.stage] = make_int4(index, row_begin, rows, 0);
    ptx::mbar_arrive(&s.unit_full[ring.stage]);  // release: publishes the slot
    ring.advance();
  }
  static __device__ __forceinline__ int4 take(WalkStorage& s, PipelineState<kUnitSlots>& ring) {
    ptx::mbar_wait(&s.unit_full[ring.stage], ring.phase);
    const int4 tag = s.unit_ring[ring.stage];
    // Each thread's arrival releases its own read of the slot (once a unit: cheap).
    ptx::mbar_arrive(&s.unit_empty[ring.stage]);
    ring.advance();
    return tag;
  }
};

}  // namespace loom::gemm
