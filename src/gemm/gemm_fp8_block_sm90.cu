#include "gemm/gemm_fp8_block_sm90.cuh"

#include <cuda.h>
#include <cuda/atomic>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "common/chain_trace.cuh"
#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "common/tensor_map.hpp"
#include "gemm/fast_divisor.hpp"
#include "gemm/gemm_fp8_regs_sm90.cuh"
#include "gemm/gemm_fp8_resident_sm90.cuh"
#include "gemm/promote_rows.cuh"
#include "gemm/ring_cursor.cuh"
#include "gemm/work_queue.cuh"
#include "contract/device_layout.hpp"
#include "ptx/barrier.cuh"
#include "ptx/cp_async.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/pdl.cuh"
#include "ptx/red.cuh"
#include "ptx/setmaxnreg.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"

namespace loom {

namespace {

constexpr int kBlockK = 128;       // K per pipeline stage: exactly one scale block
constexpr int kBlockM = 128;       // weight rows per unit: two consumer warpgroups of 64
constexpr int kMaxChunk = 128;     // widest token chunk (the MMA's N)
constexpr int kWidthCount = 4;     // chunk widths 16, 32, 64, 128
// Pipeline depth per epilogue mode: the hand-off epilogue's staging (a whole 128 x 128 fp32 chunk
// result) takes the shared memory of two stages. The gathering kernels' stages hold activation
// tiles of their at most 32 rows (4 KiB, not 16), so 8 stages take less shared memory than the
// inline kernel's 6. Measured e2e, 8 stages of 32-row tiles vs 6 of 128-row tiles (two builds,
// x3): T=8 24.4-24.6 vs 24.5-24.8, T=32 48.7-49.1 vs 49.5-49.8, T=128 73.8-73.9 vs 74.4-74.7,
// T=256 74.2-74.3 vs 74.6-74.8 us, T=1 and T=512 within 0.3 (6 stages of 32-row tiles: as the
// 128-row ones; 9: as 8; docs/perf.md, twenty-third session).
constexpr int kStagesInline = 6, kStagesHandoff = 4, kStagesGathered = 8;
constexpr int kThreads = 384;      // warpgroup 0: producer (TMA + cp.async gather); 1 and 2: MMA consumers
constexpr int kProducerThreads = 128;
constexpr int kConsumerWarps = 8;
constexpr int kEpilogueCols = 32;  // token columns staged per epilogue pass
constexpr int kEpilogueStride = 64 + 4;  // floats per staged column: +4 makes the quad writes conflict-free
constexpr int kGatherBarrier = 3;  // named barrier of the producer warpgroup (0: __syncthreads, 1-2: consumers)
constexpr int kEpilogueWarps = 3;  // hand-off epilogue: producer warps 1-3 (warp 0 issues the TMA loads)
// Sorted rows come by TMA, whose global start address must be 16-byte aligned: an activation-scale
// box therefore starts at the row rounded down to a multiple of 4 and carries 4 extra floats.
constexpr int kScaleAlign = 4;
constexpr int kXsStride = 160;  // floats per stage: >= kMaxChunk + kScaleAlign, 128-byte multiple
constexpr int kUnitSlots = 2;        // dynamic tail: units announced ahead of the consumers
// Dynamic tail: units go round robin except the last kDynamicRounds rounds' worth, which CTAs take
// from a global queue as they finish (one round measured best: taking every unit from the queue
// lost the round robin's L2 locality at T=8192, 362 vs 345 us e2e).
constexpr int kDynamicRounds = 1;
constexpr int kWTileBytes = kBlockM * kBlockK;
constexpr int kXTileBytes = kMaxChunk * kBlockK;
// Which activation source a kernel instantiation serves. The
// gathered batches (T <= 32) have a kernel of their own, whose chunks are at most kGatherMaxTokens
// rows: without the sorted-rows, dynamic-tail and wide-chunk code its code is 55 KB instead of
// 128, and at small T the GEMM waits on instruction fetch (docs/perf.md, ninth and tenth sessions).
// Gathered rows read from expert bins (the chunk walk) have one too: with the walk's code in the
// T <= 32 kernel, T=1 took 13.9-14.2 us instead of 12.4-12.7 (docs/perf.md, twentieth session).
enum class Rows { gathered, binned, sorted };
__host__ __device__ constexpr bool gathers(Rows rows) { return rows == Rows::gathered || rows == Rows::binned; }
__host__ __device__ constexpr int chunk_limit(Rows rows) { return gathers(rows) ? kGatherMaxTokens : kMaxChunk; }
constexpr int kWalkChunk = chunk_limit(Rows::binned);  // the chunk walk's chunks: the gathered kernels' widest

static_assert(kWTileBytes % 1024 == 0 && kXTileBytes % 1024 == 0,
              "128-byte-swizzled TMA tiles must start on 1024-byte boundaries");
static_assert(kBlockK == 128, "one pipeline stage must be exactly one 128-wide scale block");
static_assert((16 << (kWidthCount - 1)) == kMaxChunk, "widths 16..kMaxChunk double each step");
static_assert(chunk_limit(Rows::sorted) == kMaxChunk && kGatherMaxTokens == 32,
              "gathered-batch chunks are the widths 16 and 32 only");
static_assert(kThreads == 128 * 3 && kConsumerWarps == 8, "one producer and two consumer warpgroups");
// setmaxnreg moves registers within what the CTA was launched with: 384 threads at the 168 that
// __launch_bounds__(384, 1) gives each. The producer's gather needs more than 40 (it spilled).
constexpr uint32_t kLaunchRegs = 168, kProducerRegs = 56, kConsumerRegs = 224;
static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= kThreads * kLaunchRegs, "the CTA's register pool");
static_assert(kMaxChunk % kEpilogueCols == 0, "epilogue passes tile the widest chunk");
// The gather: 8 producer threads per 128-byte activation row (one 16-byte piece each), so the
// warpgroup covers 16 rows per pass and every chunk width is a whole number of passes.
static_assert(kProducerThreads == 16 * (kBlockK / 16) && kMaxChunk <= kProducerThreads,
              "16 rows per gather pass; one scale per producer thread");
static_assert(kXsStride >= kMaxChunk + kScaleAlign && (kXsStride * 4) % 128 == 0, "scale stage holds a shifted box");

struct TensorMaps {
  CUtensorMap w;                 // [E*N, K] u8, box 128 x 128, 128-byte swizzle
  CUtensorMap x[kWidthCount];    // sorted rows only: [R_pad, K] u8, box width x 128, 128-byte swizzle
  // Sorted rows, group-major scales only: [KB, R_pad] f32, box 1 x (width + 4), its start row
  // aligned down to 4.
  CUtensorMap xs[kWidthCount];
};

struct KernelArgs {
  const uint8_t* weights;
  const float* weight_scales;
  const uint8_t* x;       // [x_rows, K] e4m3: token order (gather) or expert-sorted rows
  const float* x_scales;  // [KB, x_rows]
  int64_t x_rows;
  const int32_t* offsets;
  const int32_t* counts;  // expert bins (GemmFp8Params::expert_counts) or nullptr: offsets
  int stride;             // GemmFp8Params::expert_stride
  const int32_t* row_token;
  const float* row_weight;
  float* out;
  int experts, n, k, nblocks, kblocks;
  int atomic;
  int dense;
  int split_k, kblocks_per_split;
  int balanced;  // CTAs take equal shares of the (unit, K block) space (GemmFp8Config::balanced)
  // L2 eviction priority of the TMA loads: 1 = evict_first (read once, let it go first), 0 = normal.
  int weights_evict_first, x_evict_first;
  // Dynamic tail (sorted rows): [0] units taken from the queue, [1] CTAs done taking; nullptr =
  // static walk.
  int32_t* work_queue;
  // Compact mode: the experts with rows and their row ranges, written by the kernel before
  // (DispatchParams::hit_list); nullptr = built here from the offsets.
  const int4* hit_list;
  // Gathered batches under PDL, with a hit list or a dense walk: the producer walks to its first
  // unit's rows once, dry, before the PDL wait (GemmFp8Config::warm_up).
  int warm_up;
  // The unit walk's divisors (kblocks, nblocks, nblocks * split_k, split_k, gridDim.x), their
  // divisions on the path from the PDL wait to the first unit a high multiply each.
  FastDivisor kblocks_div, nblocks_div, per_expert_div, split_k_div, grid_div;
  // GemmFp8Params::early_ids (gathering compact walks only; nullptr: none) and early_routes.
  const uint32_t* early_ids;
  int early_routes;
};

// Epilogue in the consumers: each consumer warpgroup stages 32 token columns of its 64 weight rows
// at a time, then reduces them into the output itself.
struct InlineEpilogue {
  float cols[2][kEpilogueCols][kEpilogueStride];
  float chunk_weight[2][kMaxChunk];  // top-k weight and token of each of the chunk's rows
  int32_t chunk_token[2][kMaxChunk];
};

// Hand-off epilogue (sorted rows): the consumers stage the whole chunk result once and go on to
// the next chunk's MMAs; the producer warpgroup's spare warps weight it and reduce it into the
// output meanwhile, so the tensor cores do not idle through the epilogue.
struct HandoffEpilogue {
  float cols[2][kMaxChunk][kEpilogueStride];  // [consumer][token column][weight row]
  float row_weight[kMaxChunk];                // top-k weight and token of each of the chunk's rows
  int32_t row_token[kMaxChunk];
  int4 chunk;  // (first sorted row, rows, 128-row block, 0); rows < 0: the consumers are done
  uint64_t full;   // every consumer thread, after its stores
  uint64_t empty;  // every epilogue thread, after its reads
};

// Activation scales, inline kernels: per stage, one group of the chunk's rows (kXsStride: see
// block_scale).
template <int kStages>
struct StageScales {
  float xs[kStages][kXsStride];
};
// Hand-off kernel (scales in row quads, ScaleLayout::row_quads): a ring of its own, one slot per
// quad of K blocks holding each chunk row's 4 groups, so each scale is read once (a 4-group box
// with every stage would read 4x the bytes).
struct QuadScales {
  static constexpr int kSlots = 2;  // the producer runs at most one quad ahead of the consumers (stages <= 4)
  float quad[kSlots][kMaxChunk * 4];
  uint64_t full[kSlots];   // the producer's arrive.expect_tx, then the bulk copy's bytes
  // Every consumer thread, after its reads of the quad's last block: each its own arrival, so the
  // order is explicit (racecheck does not see a lane-0 arrival after __syncwarp as ordered).
  uint64_t empty[kSlots];
};

template <int kStagesT, bool kHandoffT, int kXRowsT = kMaxChunk>
struct alignas(1024) SharedStorage {
  static constexpr int kStages = kStagesT;
  static constexpr bool kHandoff = kHandoffT;
  static constexpr int kXRows = kXRowsT;  // activation rows per stage: the kernel's widest chunk
  static_assert(kXRows % 8 == 0 && kXRows * kBlockK % 1024 == 0, "whole 1024-byte swizzle atoms per tile");
  uint8_t w[kStages][kWTileBytes];
  uint8_t x[kStages][kXRows * kBlockK];
  std::conditional_t<kHandoff, QuadScales, StageScales<kStages>> scales;
  std::conditional_t<kHandoff, HandoffEpilogue, InlineEpilogue> epi;
  int32_t gather_token[kMaxChunk];    // producer: token of each row of the chunk being loaded, -1 past its end
  uint64_t full[kStages];
  uint64_t empty[kStages];
  // Dynamic tail: the producer announces each unit with rows as (index, expert's first row, rows)
  // as it starts loading it (index -1: no more units), so the consumers know their next unit before
  // its data arrives.
  int4 unit_ring[kUnitSlots];
  uint64_t unit_full[kUnitSlots];
  uint64_t unit_empty[kUnitSlots];
  int32_t hit_experts[kGpuMaxExperts];  // compact mode: experts with rows, ascending
  int2 hit_range[kGpuMaxExperts];       // ... and their (first row, rows), when read from a.hit_list
  int32_t hit_count;
  int32_t chunk_hits[kGpuMaxExperts / 32];
  alignas(16) int32_t early_key[kEarlyIdWords];  // read_early_ids
};
using InlineStorage = SharedStorage<kStagesInline, false>;
using HandoffStorage = SharedStorage<kStagesHandoff, true>;
using GatheredStorage = SharedStorage<kStagesGathered, false, kGatherMaxTokens>;
static_assert(sizeof(GatheredStorage) + 1024 <= 227 * 1024, "shared memory budget of one sm_90 CTA");
static_assert(sizeof(InlineStorage) + 1024 <= 227 * 1024, "shared memory budget of one sm_90 CTA");
static_assert(sizeof(HandoffStorage) + 1024 <= 227 * 1024, "shared memory budget of one sm_90 CTA");
static_assert(kEpilogueStride % 4 == 0, "staged columns start on 16 bytes (float4 reads, bulk reductions)");
static_assert(kBlockM == 32 * 4, "hand-off epilogue: one lane per 4 output columns of a 128-row block");

__host__ __device__ constexpr int width_index(int rows) { return rows <= 16 ? 0 : rows <= 32 ? 1 : rows <= 64 ? 2 : 3; }

// A work unit: one expert's 128 weight rows over one K range, for all of the expert's rows; or,
// from expert bins (the chunk walk), for one chunk of at most kGatherMaxTokens of its rows.
struct Unit {
  int expert, nb, kb_begin, kb_end;
  int slot;   // compact mode: the expert's index in the hit list
  int chunk;  // chunk walk: the unit's chunk of the expert's rows
};

// The chunk walk (gathered rows from expert bins): every unit is one (expert with rows, weight
// block, chunk of at most kWalkChunk rows), so an expert with many rows spreads over as many CTAs
// as it has chunks instead of lengthening one unit (skew: T=512 hot:0.9 83.6 vs 184 us with whole
// experts per unit, docs/perf.md). Units [0, hits * nblocks) are the first chunks of the experts
// with rows, in expert order (decoded without a search), then the further chunks. Per hit-list
// slot: hit_experts the expert (its first row: expert * stride), hit_range (the further-chunk units
// of the slots up to it, an inclusive scan; its rows). Only the Rows::binned kernel has this code.
template <class S>
__device__ __forceinline__ void build_chunk_walk(S& s, const KernelArgs& a) {
  // Every expert's rows by expert into hit_range[e].y: one load per thread, one L2 round trip.
  for (int e = threadIdx.x; e < a.experts; e += blockDim.x)
    s.hit_range[e].y = min(__ldcg(a.counts + e * kBinCountStride), a.stride);
  __syncthreads();
  if (threadIdx.x < 32) {
    // 32 experts a round, in a rolled loop: unrolled, this kernel had 1700 more instructions and
    // its GEMM alone took 73.7 instead of 70.4 us at T=128. (One warp per group of 32 experts, in
    // parallel, was no faster: e2e T=128 74.5 vs 74.8, T=512 81.5 vs 79.2 us.) A round writes
    // slots below its first expert, so never what a later round reads.
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
  __syncthreads();
}

template <bool kBins, class S>
__device__ __forceinline__ int unit_count(const S& s, const KernelArgs& a) {
  if constexpr (kBins) return s.hit_count > 0 ? s.hit_count * a.nblocks + s.hit_range[s.hit_count - 1].x : 0;
  return (a.dense ? a.experts : s.hit_count) * a.nblocks * a.split_k;
}

// Consecutive units share an expert (then its 128-row blocks, then K ranges), so CTAs running at
// the same time read the same activation rows.
template <bool kBins, class S>
__device__ __forceinline__ Unit decode_unit(const S& s, const KernelArgs& a, int u) {
  if constexpr (kBins) {
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

  __device__ WorkCursor(const KernelArgs& a, int units) {
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
  template <bool kBins, class S>
  __device__ bool next(const S& s, const KernelArgs& a, Unit& unit) {
    if (pos >= end) return false;
    if (!a.balanced) {
      unit = decode_unit<kBins>(s, a, pos);
      pos += int(gridDim.x);
      return true;
    }
    const int u = int(a.kblocks_div.div(uint32_t(pos))), kb = pos - u * a.kblocks;
    unit = decode_unit<kBins>(s, a, u);  // split_k is 1 here: the unit spans every K block
    unit.kb_begin = kb;
    unit.kb_end = min(a.kblocks, kb + (end - pos));
    pos += unit.kb_end - unit.kb_begin;
    return true;
  }
};

// Compact mode: the experts with at least one row, in ascending order (ballot per 32 experts,
// then a prefix over the per-32 counts). Every CTA builds the same list.
template <class S>
__device__ __forceinline__ void build_hit_list(S& s, const KernelArgs& a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int chunks = (a.experts + 31) / 32;
  for (int c = warp; c < chunks; c += warps) {
    const int e = c * 32 + lane;
    const bool hit = e < a.experts && __ldcg(a.offsets + e + 1) > __ldcg(a.offsets + e);
    const unsigned mask = __ballot_sync(0xffffffffu, hit);
    if (lane == 0) s.chunk_hits[c] = __popc(mask);
  }
  __syncthreads();
  for (int c = warp; c < chunks; c += warps) {
    int base = 0;
    for (int i = 0; i < c; ++i) base += s.chunk_hits[i];
    const int e = c * 32 + lane;
    const bool hit = e < a.experts && __ldcg(a.offsets + e + 1) > __ldcg(a.offsets + e);
    const unsigned mask = __ballot_sync(0xffffffffu, hit);
    if (hit) s.hit_experts[base + __popc(mask & ((1u << lane) - 1))] = e;
    if (c == chunks - 1 && lane == 0) s.hit_count = base + __popc(mask);
  }
  __syncthreads();
}

// Compact mode from a hit list the kernel before wrote: its count and entries, in one round trip
// (entries past the count are stale and never read). Measured e2e with vs without (same binary,
// x3): T=1 13.6 / 13.7 / 14.0 vs 14.2 / 14.2 / 14.1, T=8 25.3 / 25.1 / 25.2 vs 25.5 / 25.9 / 25.9,
// T=32 49.4 / 49.6 / 49.5 vs 50.1 / 50.0 / 49.9 us (the trace's "units known" 0.4 us earlier).
template <class S>
__device__ __forceinline__ void load_hit_list(S& s, const KernelArgs& a) {
  for (int i = threadIdx.x; i <= a.experts; i += blockDim.x) {
    const int4 h = __ldcg(a.hit_list + i);
    if (i == 0) {
      s.hit_count = h.x;
    } else {
      s.hit_experts[i - 1] = h.x;
      s.hit_range[i - 1] = make_int2(h.y, h.z);
    }
  }
  __syncthreads();
}

// Compact mode from the early expert ids (GemmFp8Params::early_ids): warp 0 spins until every
// route's word is this run's, then lists the distinct experts in ascending order with their first
// sorted row (the routes to lower experts: the dispatch's offsets) and their rows, as the hit list
// would. Before the PDL wait: nothing else the kernel before writes is read here. Short code on
// purpose: it is inlined beside the producer's loop (the warm-up's end); 400 instructions of
// unrolled shuffles there slowed the gathering GEMM (T=32 GEMM alone 45.3 vs 43.0 us, measured
// when one kernel served both walks).
template <class S>
__device__ __forceinline__ void read_early_ids(S& s, const KernelArgs& a) {
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
  __syncthreads();
}

// A unit's expert rows: from the hit list in shared memory when there is one (no global round
// trip before the unit's first load), else from the offsets.
template <bool kBins, class S>
__device__ __forceinline__ void unit_rows(const S& s, const KernelArgs& a, const Unit& unit, int& row_begin,
                                          int& rows) {
  if constexpr (kBins) {
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

// Waits for a stage and issues its four k32 MMAs into `acc` (overwriting it: scale-d = 0 first).
template <int W, class S>
__device__ __forceinline__ void issue_block(S& s, float (&acc)[W / 2], uint32_t stage, uint32_t phase,
                                            int consumer, bool gather) {
  ptx::mbar_wait(&s.full[stage], phase);
  if (threadIdx.x == 128) LOOM_TRACE(kGemmStageFull);
  // A gathered activation tile arrived through cp.async (generic proxy); wgmma reads it through
  // the async proxy.
  if (gather) ptx::fence_proxy_async_shared();
  const uint64_t desc_a = ptx::smem_desc_k_major_sw128(&s.w[stage][consumer * 64 * kBlockK]);
  const uint64_t desc_b = ptx::smem_desc_k_major_sw128(&s.x[stage][0]);
#pragma unroll
  for (int i = 0; i < W / 2; ++i) ptx::fence_operand(acc[i]);
  ptx::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kBlockK / 32; ++ks) {
    // +32 bytes along K per k32 step = +2 in the descriptor's 16-byte address units.
    ptx::WgmmaE4M3<W>::mma(acc, desc_a + 2 * ks, desc_b + 2 * ks, ks > 0 ? 1 : 0);
  }
  ptx::wgmma_commit_group();
}

// Where a block's activation scales are. Inline kernels: in the block's stage (buf = stage).
// Hand-off: in quad slot buf, which the block waits for (parity `phase`) if it is its quad's first
// in the chunk (quad_done frees it after the last).
struct ScaleRead {
  uint32_t buf, phase;
  bool wait;
};

// Block kb's scales. The hand-off's quads start at a chunk's first block and at every kb % 4 == 0,
// as the producer loads them.
template <class S>
__device__ __forceinline__ ScaleRead scale_read(const PipelineState<QuadScales::kSlots>& quad, uint32_t stage, int kb,
                                                const Unit& unit) {
  if constexpr (S::kHandoff)
    return ScaleRead{quad.stage, quad.phase, kb == unit.kb_begin || kb % 4 == 0};
  else
    return ScaleRead{stage, 0, false};
}
// After promote_block of block kb (which read this thread's scales): frees the quad slot after the
// quad's last block, once per quad (arriving inside promote_block made the consumer spill).
template <class S>
__device__ __forceinline__ void quad_done(S& s, PipelineState<QuadScales::kSlots>& quad, int kb, const Unit& unit) {
  if (kb % 4 == 3 || kb + 1 == unit.kb_end) {
    ptx::mbar_arrive(&s.scales.empty[quad.stage]);
    quad.advance();
  }
}

// Chunk column `col`'s activation scale for K block kb. Hand-off: the row's quad in slot buf, the
// block's group at kb % 4 (the quad lanes' columns 2q, 2q + 1 fall 8 floats apart: no bank
// conflicts). Otherwise one group in stage buf: gathered rows from 0, sorted rows from scale_shift
// (their box began at the chunk's row rounded down to 4).
template <class S>
__device__ __forceinline__ float block_scale(const S& s, uint32_t buf, int col, int kb, int scale_shift) {
  if constexpr (S::kHandoff)
    return s.scales.quad[buf][col * 4 + kb % 4];
  else
    return s.scales.xs[buf][scale_shift + col];
}

// Once `acc`'s group is done (kPending newer groups may stay in flight): read the block's
// activation scales, release the stage, promote
// final += acc * weight_scale * activation_scale.
template <int W, int kPending, class S>
__device__ __forceinline__ void promote_block(S& s, float (&acc)[W / 2], float (&final_acc)[W / 2],
                                              uint32_t stage, const ScaleRead& sr, int kb, int scale_shift, float sw) {
  const int lane = threadIdx.x % 32, q = lane % 4;
  ptx::wgmma_wait_group<kPending>();
#pragma unroll
  for (int i = 0; i < W / 2; ++i) ptx::fence_operand(acc[i]);
  if constexpr (S::kHandoff)
    if (sr.wait) ptx::mbar_wait(&s.scales.full[sr.buf], sr.phase);
  float sa[W / 4];
#pragma unroll
  for (int j = 0; j < W / 8; ++j) {
    sa[2 * j] = block_scale(s, sr.buf, 8 * j + 2 * q, kb, scale_shift) * sw;
    sa[2 * j + 1] = block_scale(s, sr.buf, 8 * j + 2 * q + 1, kb, scale_shift) * sw;
  }
  // Every lane's shared-memory reads of this stage (wgmma operands, scales) are done: free it.
  __syncwarp();
  if (lane == 0) ptx::mbar_arrive(&s.empty[stage]);
  promote_columns<W>(final_acc, acc, sa);
}

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

// Epilogue in the consumers: stage 32 token columns x 64 weight rows through shared memory so each
// thread then owns 4 consecutive outputs of one token row (one 16-byte vector reduction or store).
template <int W, class S>
__device__ __forceinline__ void epilogue_in_consumers(S& s, const KernelArgs& a, const float (&final_acc)[W / 2],
                                                      int row0, int chunk_rows, int nb, int consumer, float row_w,
                                                      int32_t row_t) {
  if (threadIdx.x == 128) LOOM_TRACE(kGemmEpilogue);
  const int wg_row = threadIdx.x % 128;
  const uint32_t barrier_id = 1 + consumer, wg_thread = threadIdx.x % 128;
  float(*stage_cols)[kEpilogueStride] = s.epi.cols[consumer];
  // Published by the first barrier below; overwritten only after the chunk's last barrier.
  s.epi.chunk_weight[consumer][wg_row] = row_w;
  s.epi.chunk_token[consumer][wg_row] = row_t;
#pragma unroll
  for (int cg = 0; cg < (W + kEpilogueCols - 1) / kEpilogueCols; ++cg) {
    constexpr int kGroupCols = W < kEpilogueCols ? W : kEpilogueCols;
    stage_fragment<kGroupCols, W>(stage_cols, final_acc, cg * (kEpilogueCols / 8));
    ptx::named_barrier_sync(barrier_id, 128);
    for (int item = wg_thread; item < kGroupCols * 16; item += 128) {
      const int col = item / 16, quad = item % 16;
      const int chunk_col = cg * kEpilogueCols + col;
      const int n = nb * kBlockM + consumer * 64 + 4 * quad;
      if (chunk_col < chunk_rows && n < a.n) {
        const int row = row0 + chunk_col;
        const float w = s.epi.chunk_weight[consumer][chunk_col];
        const float4 v = *reinterpret_cast<const float4*>(&stage_cols[col][4 * quad]);
        if (a.atomic) {
          const int token = s.epi.chunk_token[consumer][chunk_col];
          ptx::red_add_v4_f32(a.out + int64_t(token) * a.n + n, w * v.x, w * v.y, w * v.z, w * v.w);
        } else {
          *reinterpret_cast<float4*>(a.out + int64_t(row) * a.n + n) = make_float4(w * v.x, w * v.y, w * v.z, w * v.w);
        }
      }
    }
    // The next pass (or chunk) overwrites the staging area.
    ptx::named_barrier_sync(barrier_id, 128);
  }
}

// Hand-off epilogue, consumer side: once the epilogue warps have read the previous chunk's staging,
// store this chunk's result there (with its rows' weights and tokens), publish it, and go on.
template <int W, class S>
__device__ __forceinline__ void stage_for_epilogue_warps(S& s, const float (&final_acc)[W / 2], uint32_t& phase,
                                                         int row0, int chunk_rows, int nb, int consumer, float row_w,
                                                         int32_t row_t) {
  ptx::mbar_wait(&s.epi.empty, phase ^ 1);
  stage_fragment<W, W>(s.epi.cols[consumer], final_acc, 0);
  if (consumer == 0) {
    const int wg_row = threadIdx.x % 128;
    s.epi.row_weight[wg_row] = row_w;
    s.epi.row_token[wg_row] = row_t;
    if (wg_row == 0) s.epi.chunk = make_int4(row0, chunk_rows, nb, 0);
  }
  ptx::mbar_arrive(&s.epi.full);  // release: publishes this thread's stores
  phase ^= 1;
}

// Hand-off epilogue, consumer side, after the last chunk: tell the epilogue warps to stop.
template <class S>
__device__ __forceinline__ void end_epilogue_warps(S& s, uint32_t phase) {
  ptx::mbar_wait(&s.epi.empty, phase ^ 1);
  if (threadIdx.x % 256 == 128) s.epi.chunk = make_int4(0, -1, 0, 0);
  ptx::mbar_arrive(&s.epi.full);
}

// Hand-off epilogue, epilogue-warp side: for each chunk the consumers publish, weight its staged
// token columns and add them into the output rows (store them, in store mode). Warp w takes the
// columns w, w + 3, ...; lane l the output columns 4l..4l+3 of the 128-row block, so each warp
// instruction covers a 512-byte segment of one output row.
template <class S>
__device__ __forceinline__ void drain_staged_chunks(S& s, const KernelArgs& a, int epilogue_warp) {
  const int lane = threadIdx.x % 32, half = lane / 16, quad = lane % 16;
  uint32_t phase = 0;
  while (true) {
    ptx::mbar_wait(&s.epi.full, phase);
    const int4 chunk = s.epi.chunk;
    if (chunk.y < 0) break;
    const int n = chunk.z * kBlockM + 4 * lane;
    for (int col = epilogue_warp; col < chunk.y; col += kEpilogueWarps) {
      const float w = s.epi.row_weight[col];
      const float4 v = *reinterpret_cast<const float4*>(&s.epi.cols[half][col][4 * quad]);
      if (n >= a.n) continue;
      if (a.atomic)
        ptx::red_add_v4_f32(a.out + int64_t(s.epi.row_token[col]) * a.n + n, w * v.x, w * v.y, w * v.z, w * v.w);
      else
        *reinterpret_cast<float4*>(a.out + int64_t(chunk.x + col) * a.n + n) =
            make_float4(w * v.x, w * v.y, w * v.z, w * v.w);
    }
    ptx::mbar_arrive(&s.epi.empty);  // every epilogue thread, after its own reads
    phase ^= 1;
  }
}

// One chunk (up to W of an expert's rows against 128 weight rows) on one consumer warpgroup:
// the K loop with per-block promotion, then the weighted epilogue (in this warpgroup, or handed to
// the epilogue warps).
// quad: the hand-off kernel's scale-quad slot and phase (runs on across chunks, as ps does).
template <int W, class S>
__device__ __forceinline__ void consume_chunk(S& s, PipelineState<S::kStages>& ps, uint32_t& handoff_phase,
                                              PipelineState<QuadScales::kSlots>& quad, const KernelArgs& a,
                                              const Unit& unit, int row0, int chunk_rows, int consumer, bool gather) {
  const int e = unit.expert, nb = unit.nb;
  using Mma = ptx::WgmmaE4M3<W>;
  constexpr int kRegs = Mma::kRegs;
  const int lane = threadIdx.x % 32;
  // This thread's row of the chunk: its weight and token, loaded now so the latency hides behind
  // the K loop (loading them in the epilogue put a round trip on every chunk).
  const int wg_row = threadIdx.x % 128;
  const float row_w = wg_row < chunk_rows ? __ldcg(a.row_weight + row0 + wg_row) : 0.0f;
  const int32_t row_t = wg_row < chunk_rows && a.atomic ? __ldcg(a.row_token + row0 + wg_row) : 0;
  const int scale_shift = gather ? 0 : row0 % kScaleAlign;
  float final_acc[kRegs];
  const float* wscale = a.weight_scales + (int64_t(e) * a.nblocks + nb) * a.kblocks;
  // The unit's weight scales, 32 K blocks at a time, one per lane: a global load per stage would
  // put its latency on every stage's critical path.
  float sw_lane = unit.kb_begin + lane < unit.kb_end ? __ldg(wscale + unit.kb_begin + lane) : 0.0f;
  auto weight_scale = [&](int kb) {
    const int i = kb - unit.kb_begin;
    if (i > 0 && i % 32 == 0) sw_lane = kb + lane < unit.kb_end ? __ldg(wscale + kb + lane) : 0.0f;
    return __shfl_sync(0xffffffffu, sw_lane, i % 32);
  };

#pragma unroll
  for (int i = 0; i < kRegs; ++i) final_acc[i] = 0.0f;
  // Two block accumulators: the MMAs of K block kb+1 run while block kb is promoted. Unrolled by
  // two so each accumulator is a compile-time choice (register arrays stay registers). At W=128
  // the three accumulators take 192 of the consumer's 224 registers; they fit (no spills) since
  // shared memory is addressed as such (see align_pad in the kernel).
  float acc0[kRegs], acc1[kRegs];
#pragma unroll
  for (int i = 0; i < kRegs; ++i) acc0[i] = 0.0f, acc1[i] = 0.0f;
  int kb = unit.kb_begin;
  PipelineState<S::kStages> cur = ps;
  issue_block<W>(s, acc0, cur.stage, cur.phase, consumer, gather);
  while (true) {
    PipelineState<S::kStages> next = cur;
    next.advance();
    if (kb + 1 < unit.kb_end) {
      issue_block<W>(s, acc1, next.stage, next.phase, consumer, gather);
      promote_block<W, 1>(s, acc0, final_acc, cur.stage, scale_read<S>(quad, cur.stage, kb, unit), kb,
                          scale_shift, weight_scale(kb));
      if constexpr (S::kHandoff) quad_done(s, quad, kb, unit);
    } else {
      promote_block<W, 0>(s, acc0, final_acc, cur.stage, scale_read<S>(quad, cur.stage, kb, unit), kb,
                          scale_shift, weight_scale(kb));
      if constexpr (S::kHandoff) quad_done(s, quad, kb, unit);
      cur = next;
      break;
    }
    ++kb;
    cur = next;
    next.advance();
    if (kb + 1 < unit.kb_end) {
      issue_block<W>(s, acc0, next.stage, next.phase, consumer, gather);
      promote_block<W, 1>(s, acc1, final_acc, cur.stage, scale_read<S>(quad, cur.stage, kb, unit), kb,
                          scale_shift, weight_scale(kb));
      if constexpr (S::kHandoff) quad_done(s, quad, kb, unit);
    } else {
      promote_block<W, 0>(s, acc1, final_acc, cur.stage, scale_read<S>(quad, cur.stage, kb, unit), kb,
                          scale_shift, weight_scale(kb));
      if constexpr (S::kHandoff) quad_done(s, quad, kb, unit);
      cur = next;
      break;
    }
    ++kb;
    cur = next;
  }
  ps = cur;

  if constexpr (S::kHandoff)
    stage_for_epilogue_warps<W>(s, final_acc, handoff_phase, row0, chunk_rows, nb, consumer, row_w, row_t);
  else
    epilogue_in_consumers<W>(s, a, final_acc, row0, chunk_rows, nb, consumer, row_w, row_t);
}

// kHandoff: the hand-off epilogue (sorted rows only). kRows: the activation source it serves.
// kEarly: the compact gathering walk from early expert ids (KernelArgs::early_ids), a kernel of
// its own: the ids' code beside the producer's loop slowed the other gathering batches' GEMM
// (T=4 / 32 e2e +0.3-0.5 us).
template <bool kHandoff, Rows kRows, bool kEarly = false>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_fp8_block_kernel(const __grid_constant__ TensorMaps maps, const KernelArgs a) {
  static_assert(!kEarly || kRows == Rows::gathered, "early ids serve the gathering compact walk");
  static_assert(!kHandoff || kRows == Rows::sorted, "the hand-off epilogue takes the producer threads a gather needs");
  static_assert(!kHandoff || kStagesHandoff <= 4,
                "the producer runs at most one scale quad ahead (QuadScales::kSlots)");
  // The gathering kernels' chunks are at most kGatherMaxTokens rows: their stages hold no more.
  using S = std::conditional_t<gathers(kRows), GatheredStorage,
                               SharedStorage<kHandoff ? kStagesHandoff : kStagesInline, kHandoff>>;
  static_assert(S::kXRows >= chunk_limit(kRows), "a stage holds the kernel's widest chunk");
  constexpr bool gather = gathers(kRows);
  constexpr int kChunk = chunk_limit(kRows);
  constexpr bool kBins = kRows == Rows::binned;  // the chunk walk over expert bins
  extern __shared__ uint8_t smem_raw[];
  // Aligned by pointer arithmetic on smem_raw, not through an integer: the compiler then still knows
  // every access is to shared memory (LDS/STS; through uintptr_t it emitted generic LD/ST with
  // 64-bit address arithmetic on the promotion's critical path).
  const uint32_t align_pad = (1024u - uint32_t(reinterpret_cast<uintptr_t>(smem_raw) % 1024u)) % 1024u;
  S& s = *reinterpret_cast<S*>(smem_raw + align_pad);
  if (threadIdx.x == 0) LOOM_TRACE(kGemmStart);
  if (threadIdx.x == 0) LOOM_TRACE_SM(kGemmSm);
  if (threadIdx.x == 0) {
    for (int i = 0; i < S::kStages; ++i) {
      // One arrive.expect_tx (the TMA loads), plus one cp.async arrival per producer thread when
      // gathering.
      ptx::mbar_init(&s.full[i], gather ? 1 + kProducerThreads : 1);
      ptx::mbar_init(&s.empty[i], kConsumerWarps);
    }
    for (int i = 0; i < kUnitSlots; ++i) {
      ptx::mbar_init(&s.unit_full[i], 1);
      ptx::mbar_init(&s.unit_empty[i], 32 * kConsumerWarps);  // every consumer thread, after its read
    }
    if constexpr (kHandoff) {
      ptx::mbar_init(&s.epi.full, 32 * kConsumerWarps);
      ptx::mbar_init(&s.epi.empty, 32 * kEpilogueWarps);
      for (int i = 0; i < QuadScales::kSlots; ++i) {
        ptx::mbar_init(&s.scales.full[i], 1);
        ptx::mbar_init(&s.scales.empty[i], 32 * kConsumerWarps);
      }
    }
    ptx::fence_mbar_init();
    ptx::prefetch_tensormap(&maps.w);
  }
  __syncthreads();
  // Everything after the PDL wait reads what the dispatch and quantisation kernels wrote. Every
  // thread runs this once: here, or after the producer's dry walk.
  // Early ids: the hit list comes from them before the PDL wait, which each thread then runs before
  // its first read of the layout or the activations (the producer threads after their first weight
  // load, the consumers at once).
  constexpr bool early = kEarly;
  auto wait_for_inputs = [&]() -> int {
    if (!early) ptx::pdl_wait();
    if (threadIdx.x == 0) LOOM_TRACE(kGemmWaited);
    if constexpr (kBins) {
      build_chunk_walk(s, a);
    } else if (early) {
      read_early_ids(s, a);
    } else if (!a.dense) {
      if (a.hit_list != nullptr)
        load_hit_list(s, a);
      else
        build_hit_list(s, a);
    }
    const int units = unit_count<kBins>(s, a);
    if (threadIdx.x == 0) LOOM_TRACE(kGemmUnits);
    return units;
  };
  const bool warm_up = gathers(kRows) && a.warm_up != 0;
  const int units = warm_up ? 0 : wait_for_inputs();
  // The whole CTA meets here once the producer's dry walk is done, then waits for its inputs.
  auto end_warm_up = [&]() {
    __syncthreads();
    return wait_for_inputs();
  };

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    ptx::setmaxnreg_dec<kProducerRegs>();
    if constexpr (kHandoff) {
      // Warps 1-3: the hand-off epilogue. Thread 0 alone issues the sorted rows' loads, so they then
      // pass through the producer code below with nothing to do.
      if (threadIdx.x >= 32) drain_staged_chunks(s, a, int(threadIdx.x) / 32 - 1);
    }
    // Weights: thread 0 issues one TMA tile per stage. Activations: with sorted rows, thread 0 also
    // loads their tile and scales by TMA. Gathering, the chunk's rows are copied by token straight
    // from the token-order quantised rows, 16 bytes per thread per row pass, into the
    // 128-byte-swizzled layout the TMA would have produced (16-byte piece c of row r at
    // r * 128 + (c ^ (r % 8)) * 16 in a 1024-byte-aligned tile); rows past the chunk and K past the
    // end are zero-filled.
    const int pt = threadIdx.x, piece = pt % (kBlockK / 16), pass_row = pt / (kBlockK / 16);
    const uint64_t weights_policy = ptx::l2_policy_evict_first();
    [[maybe_unused]] bool first_tile = true;
    auto load_weight_tile = [&](uint8_t* dst, int kb, int row, uint64_t* bar) {
#ifdef LOOM_CHAIN_TRACE
      if (first_tile) LOOM_TRACE(kGemmFirstTma);
      first_tile = false;
#endif
      if (a.weights_evict_first)
        ptx::tma_load_2d_hint(dst, &maps.w, kb * kBlockK, row, bar, weights_policy);
      else
        ptx::tma_load_2d(dst, &maps.w, kb * kBlockK, row, bar);
    };
    PipelineState<S::kStages> ps;
    // Warm-up: the dry walk takes the first unit of a walk whose indices are valid before the wait:
    // dense, the real one (its count needs no inputs); compact, a grid-sized one (hit-list slots
    // below gridDim.x / ceil(N/128), within kGpuMaxExperts); the chunk walk, a grid-sized one
    // (its decode clamps what it reads).
    WorkCursor work(a, warm_up ? (a.dense && !kBins ? unit_count<kBins>(s, a) : int(gridDim.x)) : units);
    Unit unit;
    // Sorted rows: thread 0 loads every tile by TMA (and, with the dynamic tail, first announces the
    // unit to the consumers).
    PipelineState<kUnitSlots> ring;  // unit_ring slot and phase
    PipelineState<QuadScales::kSlots> quad;  // hand-off: the scale-quad ring
    auto announce = [&](int index, int row_begin, int rows) {
      ptx::mbar_wait(&s.unit_empty[ring.stage], ring.phase ^ 1);
      s.unit_ring[ring.stage] = make_int4(index, row_begin, rows, 0);
      ptx::mbar_arrive(&s.unit_full[ring.stage]);  // release: publishes the slot
      ring.advance();
    };
    auto load_sorted_unit = [&](const Unit& unit, int index, bool dynamic) {
      const int e = unit.expert, nb = unit.nb;
      int row_begin, rows;
      unit_rows<kBins>(s, a, unit, row_begin, rows);
#ifdef LOOM_CHAIN_TRACE
      if (first_tile) LOOM_TRACE(kGemmFirstRows);
#endif
      if (dynamic && rows > 0) announce(index, row_begin, rows);
      for (int chunk = 0; chunk < rows; chunk += kMaxChunk) {
        const int chunk_rows = min(kMaxChunk, rows - chunk);
        const int wi = width_index(chunk_rows), width = 16 << wi;
        // Scales: the width rows' quads of groups into the quad ring at each quad's first block
        // (hand-off), or with every stage one group of width + 4 rows from the chunk's row rounded
        // down to 4 (the inner start of a box must fall on 16 bytes).
        constexpr bool kQuads = S::kHandoff;
        const uint32_t bytes = kWTileBytes + width * kBlockK + (kQuads ? 0 : (width + kScaleAlign) * 4);
        const int scale_row = (row_begin + chunk) / kScaleAlign * kScaleAlign;
        for (int kb = unit.kb_begin; kb < unit.kb_end; ++kb) {
          if constexpr (kQuads) {
            if (kb == unit.kb_begin || kb % 4 == 0) {
              // The chunk rows' quads are contiguous: one bulk copy. Columns past the buffer's rows
              // keep stale values; no row of the chunk is among them.
              const int row0 = row_begin + chunk, quad_rows = min(width, int(a.x_rows) - row0);
              ptx::mbar_wait(&s.scales.empty[quad.stage], quad.phase ^ 1);
              ptx::mbar_arrive_expect_tx(&s.scales.full[quad.stage], uint32_t(quad_rows) * 16u);
              ptx::bulk_load(s.scales.quad[quad.stage], a.x_scales + (int64_t(kb / 4) * a.x_rows + row0) * 4,
                             uint32_t(quad_rows) * 16u, &s.scales.full[quad.stage]);
              quad.advance();
            }
          }
          ptx::mbar_wait(&s.empty[ps.stage], ps.phase ^ 1);
          ptx::mbar_arrive_expect_tx(&s.full[ps.stage], bytes);
          load_weight_tile(s.w[ps.stage], kb, e * a.n + nb * kBlockM, &s.full[ps.stage]);
          if (a.x_evict_first)
            ptx::tma_load_2d_hint(s.x[ps.stage], &maps.x[wi], kb * kBlockK, row_begin + chunk, &s.full[ps.stage],
                                  ptx::l2_policy_evict_first());
          else
            ptx::tma_load_2d(s.x[ps.stage], &maps.x[wi], kb * kBlockK, row_begin + chunk, &s.full[ps.stage]);
          if constexpr (!kQuads)
            ptx::tma_load_2d(s.scales.xs[ps.stage], &maps.xs[wi], scale_row, kb, &s.full[ps.stage]);
          ps.advance();
        }
      }
    };
    if (!gather && pt == 0 && a.work_queue != nullptr) {
      // Dynamic tail: units below static_end round robin (the first is blockIdx.x, whose weights
      // were prefetched), then the queue's next index, fetched one unit ahead so the atomic's round
      // trip hides behind the current unit's loads. Units without rows load nothing and are not
      // announced.
      const int grid = int(gridDim.x);
      const int static_end = max(1, units / grid - kDynamicRounds) * grid;
      for (int u = int(blockIdx.x); u < units;) {
        const int fetched = u + grid < static_end ? u + grid : static_end + atomicAdd(a.work_queue, 1);
        load_sorted_unit(decode_unit<kBins>(s, a, u), u, true);
        u = fetched;
      }
      announce(-1, 0, 0);  // the end of the walk
      leave_work_queue(a.work_queue);
    } else if (!gather) {
      while (pt == 0 && work.template next<kBins>(s, a, unit)) load_sorted_unit(unit, 0, false);
    }
    // Gathered rows (no code of it in the sorted-rows kernels).
    if constexpr (kRows != Rows::sorted) {
      bool dry = warm_up;
      // The chunk walk (many short units per CTA): the walk's next unit, and the row token of this
      // thread for its first chunk, taken one unit ahead. The token's load is then in flight while
      // this unit streams, so the next unit's first stages do not wait for an L2 round trip before
      // their activation gather (each unit start did, with its weight requests held back meanwhile).
      // Measured e2e (two builds, one call, x3): T=128 72.3-72.5 vs 73.9-74.0, T=512 76.6-76.8 vs
      // 78.5-78.6 us; in the T <= 32 kernel (2-3 units per CTA) T=1 / 8 / 16 / 32 12.0-12.4 /
      // 24.6-24.7 / 36.1-36.4 / 48.7-49.1 vs 12.3-12.5 / 24.4-24.6 / 35.6-35.8 / 48.8-49.2: not
      // there (docs/perf.md, twenty-fourth session).
      constexpr bool kLookAhead = kBins;
      bool ahead = false, next_has = false;
      Unit next_unit;
      int next_begin = 0, next_rows = 0, next_token = -1;
      while (gather) {
        bool has_unit;
        int row_begin = 0, rows = 0, first_token = -1;
        if (kLookAhead && ahead) {
          has_unit = next_has, unit = next_unit, row_begin = next_begin, rows = next_rows, first_token = next_token;
        } else {
          has_unit = work.template next<kBins>(s, a, unit);
          if (has_unit) unit_rows<kBins>(s, a, unit, row_begin, rows);
        }
        if (dry) {
          // Warm-up: the code from the walk to here is now in the instruction caches. The unit and
          // its rows (stale shared memory, or offsets still being written) are not used. A CTA the
          // dry walk gives no unit ends it here too, so the CTA always meets in end_warm_up.
          dry = false;
          work = WorkCursor(a, end_warm_up());
          continue;
        }
        if (!has_unit) break;
        if constexpr (kLookAhead) {
          if (!ahead) first_token = pt < min(kChunk, rows) ? __ldcg(a.row_token + row_begin + pt) : -1;
          next_has = work.template next<kBins>(s, a, next_unit);
          next_begin = next_rows = 0;
          if (next_has) unit_rows<kBins>(s, a, next_unit, next_begin, next_rows);
          next_token = next_has && pt < min(kChunk, next_rows) ? __ldcg(a.row_token + next_begin + pt) : -1;
          ahead = true;
        }
        const int e = unit.expert, nb = unit.nb;
#ifdef LOOM_CHAIN_TRACE
        if (pt == 0 && first_tile) LOOM_TRACE(kGemmFirstRows);
#endif
        for (int chunk = 0; chunk < rows; chunk += kChunk) {
          const int chunk_rows = min(kChunk, rows - chunk);
          const int wi = width_index(chunk_rows), width = 16 << wi;
          // The chunk's first weight tile does not need the row tokens: start it before their lookup.
          if (pt == 0) {
            ptx::mbar_wait(&s.empty[ps.stage], ps.phase ^ 1);
            ptx::mbar_arrive_expect_tx(&s.full[ps.stage], kWTileBytes);
            load_weight_tile(s.w[ps.stage], unit.kb_begin, e * a.n + nb * kBlockM, &s.full[ps.stage]);
          }
          if (early) ptx::pdl_wait();  // the row tokens and activations below (once per thread suffices)
          // Every thread has issued the previous chunk's copies (their addresses are taken at issue).
          ptx::named_barrier_sync(kGatherBarrier, kProducerThreads);
          s.gather_token[pt] = kLookAhead && chunk == 0 ? first_token
                               : pt < chunk_rows            ? __ldcg(a.row_token + row_begin + chunk + pt)
                                                            : -1;
          ptx::named_barrier_sync(kGatherBarrier, kProducerThreads);
          const int scale_token = s.gather_token[pt];
          for (int kb = unit.kb_begin; kb < unit.kb_end; ++kb) {
            ptx::mbar_wait(&s.empty[ps.stage], ps.phase ^ 1);
            if (pt == 0 && kb != unit.kb_begin) {
              ptx::mbar_arrive_expect_tx(&s.full[ps.stage], kWTileBytes);
              load_weight_tile(s.w[ps.stage], kb, e * a.n + nb * kBlockM, &s.full[ps.stage]);
            }
            const int kcol = kb * kBlockK + piece * 16;
            uint8_t* tile = s.x[ps.stage];
            for (int r = pass_row; r < width; r += kProducerThreads / (kBlockK / 16)) {
              const int token = s.gather_token[r];
              const bool ok = token >= 0 && kcol < a.k;
              const uint8_t* src = ok ? a.x + int64_t(token) * a.k + kcol : a.x;
              ptx::cp_async_16_zfill(ptx::smem_u32(tile + r * kBlockK + ((piece ^ (r % 8)) << 4)), src, ok ? 16u : 0u);
            }
            if (pt < width) {
              const float* src = scale_token >= 0 ? a.x_scales + int64_t(kb) * a.x_rows + scale_token : a.x_scales;
              ptx::cp_async_4_zfill(ptx::smem_u32(&s.scales.xs[ps.stage][pt]), src, scale_token >= 0 ? 4u : 0u);
            }
            ptx::cp_async_mbar_arrive_noinc(&s.full[ps.stage]);
            ps.advance();
          }
        }
      }
    }
  } else {
    ptx::setmaxnreg_inc<kConsumerRegs>();
    const int consumer = warpgroup - 1;
    PipelineState<S::kStages> ps;
    uint32_t handoff_phase = 0;
    PipelineState<QuadScales::kSlots> quad;  // hand-off: the scale-quad ring, as the producer's
    WorkCursor work(a, warm_up ? end_warm_up() : units);
    if (early) ptx::pdl_wait();  // the rows' tokens and weights, and the cleared output
    Unit unit;
    const bool dynamic = !gather && a.work_queue != nullptr;
    PipelineState<kUnitSlots> ring;  // unit_ring slot and phase, as the producer's
    while (true) {
      int row_begin, rows;
      if (dynamic) {
        ptx::mbar_wait(&s.unit_full[ring.stage], ring.phase);
        const int4 tag = s.unit_ring[ring.stage];
        // Each thread's arrival releases its own read of the slot (once a unit: cheap).
        ptx::mbar_arrive(&s.unit_empty[ring.stage]);
        ring.advance();
        if (tag.x < 0) break;
        unit = decode_unit<kBins>(s, a, tag.x);
        row_begin = tag.y;
        rows = tag.z;
      } else if (work.template next<kBins>(s, a, unit)) {
        unit_rows<kBins>(s, a, unit, row_begin, rows);
      } else {
        break;
      }
      for (int chunk = 0; chunk < rows; chunk += kChunk) {
        const int chunk_rows = min(kChunk, rows - chunk), row0 = row_begin + chunk;
        const int wi = width_index(chunk_rows);
        if (wi == 0)
          consume_chunk<16>(s, ps, handoff_phase, quad, a, unit, row0, chunk_rows, consumer, gather);
        else if (gathers(kRows) || wi == 1)
          consume_chunk<32>(s, ps, handoff_phase, quad, a, unit, row0, chunk_rows, consumer, gather);
        else if constexpr (!gathers(kRows)) {
          if (wi == 2)
            consume_chunk<64>(s, ps, handoff_phase, quad, a, unit, row0, chunk_rows, consumer, gather);
          else
            consume_chunk<128>(s, ps, handoff_phase, quad, a, unit, row0, chunk_rows, consumer, gather);
        }
      }
    }
    if constexpr (kHandoff) end_epilogue_warps(s, handoff_phase);
    if (threadIdx.x == 128) LOOM_TRACE(kGemmEnd);
  }
  ptx::pdl_launch_dependents();
}

}  // namespace

std::string GemmFp8Config::str() const {
  if (resident_rows)
    return std::string("fp8 grouped GEMM: 128 weight rows (M) x an expert's token rows in {16, 32, 48}-wide chunks (N), "
                       "the chunk's rows resident in shared memory over all of K, 5 weight TMA stages, persistent "
                       "grid") +
           (dynamic ? ", units past the first round from a queue" : ", round robin") +
           ", combine by bulk reductions from a shared-memory stage" + (weights_evict_first ? ", weights L2 evict-first" : "");
  if (x_source == XSource::token_fragments)
    return std::string("fp8 grouped GEMM: tiles of ") +
           (wide_tiles ? "64 of an expert's token rows (M) x 256 weight rows (N, one 128-row block per consumer)"
                       : "128 of an expert's token rows (M) x 128 weight rows (N)") +
           ", the rows loaded by token into A-fragment registers, 4 weight TMA stages, persistent grid, combine by "
           "bulk reductions from a shared-memory stage (atomic) or stores from registers (store)" +
           (weights_evict_first ? ", weights L2 evict-first" : "") +
           (x_evict_last ? ", activation rows L2 evict-last" : "");
  return "fp8 grouped GEMM: units of 128 weight rows x all of an expert's rows in {16..128}-wide chunks, " +
         std::to_string(stages) + " TMA stages, persistent grid, " +
         (dense ? std::string("dense unit walk") : std::string("compact unit walk over experts with rows")) +
         (split_k > 1 ? ", split-K " + std::to_string(split_k) : "") +
         (balanced ? ", balanced shares of (unit, K block)" : "") + (dynamic ? ", dynamic tail (last round from a queue)" : "") +
         (x_source == XSource::gather_by_token ? ", rows gathered by token (cp.async)" : ", expert-sorted rows (TMA)") +
         (weights_evict_first ? ", weights L2 evict-first" : "") +
         (x_evict_first ? ", activations L2 evict-first" : "") +
         (handoff_epilogue ? ", epilogue handed to the producer warpgroup's spare warps" : ", epilogue in the consumers") +
         (warm_up ? ", instruction-cache warm-up before the PDL wait" : "");
}

bool use_token_fragments(int64_t tokens, int64_t topk, int64_t experts, int64_t k, bool routes_in_bins) {
  const double rows = double(tokens) * double(topk) / double(experts);
  const double wide_from = routes_in_bins ? kWideTilesFromBinsRowsPerExpert : kWideTilesRowsPerExpert[0];
  const bool wide = rows >= wide_from && rows < kWideTilesRowsPerExpert[1] && k % (2 * kBlockK) == 0;
  return (rows >= kTokenFragmentsMinRowsPerExpert || wide) &&
         k % kBlockK == 0 && k >= kRegsRing * kBlockK && k <= kRegsMaxK && experts <= kGpuMaxExperts &&
         tokens * k < (int64_t(1) << 31);
}

GemmFp8Config choose_gemm_fp8_config(int64_t tokens, int64_t topk, int64_t experts, int64_t n, int64_t k,
                                     bool deterministic, const DeviceInfo& device, bool allow_token_fragments,
                                     bool routes_in_bins) {
  GemmFp8Config c;
  c.max_width = kMaxChunk;  // the chunk width adapts per expert at run time
  // Expected experts with rows under uniform routing: E (1 - (1 - k/E)^T).
  const double hit = double(experts) * (1.0 - std::pow(1.0 - double(topk) / double(experts), double(tokens)));
  // The dense walk when nearly every expert has rows: a CTA then knows its first unit before the
  // routing exists (the gathering kernels' instruction-cache warm-up walks to it).
  c.dense = hit >= 0.9 * double(experts);
  // Fewer units than SMs leave SMs idle: split K until there is about one unit per SM (atomic
  // combine only; a split needs its partial sums added). Not further: more, shorter units cost more
  // than the balance they buy. Measured e2e (same call, x2), T=1 (32 units): split 4 14.9 / 14.9,
  // 8 15.5 / 15.3, 16 16.3 / 16.7, 2 16.5 / 16.6 us; T=8 (229 units): none 27.6 / 27.5, 2 29.3 /
  // 28.9, 4 31.8 / 32.0 us.
  const int64_t nblocks = (n + kBlockM - 1) / kBlockM, kblocks = (k + kBlockK - 1) / kBlockK;
  const double units = std::max(1.0, hit) * double(nblocks);
  // Gather by token only while no expert can have more than kGatherMaxTokens rows (a token
  // routes to an expert at most once): the cp.async gather of wide chunks cannot keep their bytes
  // in flight, and skew makes wide chunks at any T. Measured GEMM alone, gathered vs sorted:
  // T=2048 154.8 vs 106-113 us; T=128 72.9 vs 69.4 (e2e equal: 82.1 vs 82.0), zipf:1.2 73.7 vs
  // 66.0 e2e, hot:0.9 93.5 vs 80.8. Small batches gain a kernel boundary and the sorted copy.
  // Above that, gathering from expert bins while experts have at most kGatherBinsMaxRowsPerExpert
  // rows: the routing fills the bins, so there is no dispatch kernel and no sorted copy (glue at
  // T=128 ~4 us instead of ~8), and the chunk walk spreads an expert's chunks over the CTAs. Measured
  // e2e, from bins vs dispatch + sorted rows (one call, x3; docs/perf.md, twenty-first session):
  // T=33 / 64 / 128 / 256 / 512 51.3 / 66.4 / 74.8 / 75.3 / 79.2 vs 54.7 / 69.0 / 76.2 / 78.9 /
  // 83.5 us; at 20 rows per expert (T=640, x2, an earlier build) 83.2 vs 88.8; skewed routes from
  // logits, T=128 / 512: hot:0.9 75.9 / 84.8 vs 76.1 / 101.2, zipf:1.2 60.5 / 94.2 vs 58.7 / 95.6
  // (zipf's hot experts' further chunks re-read their weights). From 24 rows the register-loaded
  // kernel's wide tiles take over where K allows (below).
  const double rows_per_expert = double(tokens) * double(topk) / double(experts);
  const bool gather_from_bins_allowed = routes_in_bins && !deterministic && allow_token_fragments;
  const bool gather_from_bins =
      gather_from_bins_allowed && tokens > kGatherMaxTokens && rows_per_expert <= kGatherBinsMaxRowsPerExpert;
  c.x_source = tokens <= kGatherMaxTokens || gather_from_bins ? XSource::gather_by_token : XSource::sorted_rows;
  // L2 eviction priority, when the weight stream outgrows about half of L2 (below that nothing
  // useful is evicted, and T=1 measured 0.2-0.6 us slower with the hint). While an expert's rows
  // fit one chunk, each unit reads its weight tile once: weights go first, which keeps the
  // activation rows (read by every unit of the expert) and the combine's output lines in L2.
  // Measured e2e, hint vs none (same call, 300 reps): T=8 28.8 vs 30.3, T=32 55.8 vs 57.0,
  // T=128 77.5 vs 81.5, T=512 87.2 vs 94.5, T=2048 136.7 vs 139.3 us. With several chunks per
  // expert the unit re-reads its weights: activations go first instead (T=8192 351.9 vs 365.3).
  const double weight_bytes = hit * double(n) * double(k);
  const bool stream_outgrows_l2 = weight_bytes > 0.5 * double(device.l2_bytes);
  c.weights_evict_first = stream_outgrows_l2 && rows_per_expert <= kMaxChunk;
  c.x_evict_first = stream_outgrows_l2 && rows_per_expert > kMaxChunk;
  c.split_k = 1;
  if (!deterministic && units < device.sm_count && !gather_from_bins)  // the chunk walk takes no split
    c.split_k = int(std::clamp<int64_t>(int64_t(std::ceil(device.sm_count / units)), 1, std::min<int64_t>(8, kblocks)));
  // Balanced shares when each SM has one to a few whole units (gathered rows, T <= 32): round
  // robin then leaves some SMs a whole unit more than others (T=8: 232 units on 132 SMs).
  // Measured e2e, balanced vs round robin (same binary, x2): T=8 26.2 / 26.2 vs 27.4 / 27.4, T=16
  // 38.6 / 38.6 vs 44.4 / 44.4, T=32 52.8 / 52.8 vs 53.4 / 53.5 us; in place of split-K (T=1:
  // 15.1 / 14.8 vs 14.5 / 14.4) and with sorted rows (T=64: 69.8 / 69.8 vs 68.8 / 68.6) it lost.
  c.balanced = !deterministic && !c.dense && c.x_source == XSource::gather_by_token && c.split_k == 1;
  // Dynamic tail with sorted rows: round robin leaves the CTAs unequal work at the end (a unit
  // more or less, units of unequal width, SMs that stream at unequal rates). Measured e2e, round
  // robin vs dynamic tail (two builds, same call, x2): T=64 68.5 / 68.7 vs 68.0 / 68.0, T=128 75.9
  // / 76.1 vs 75.6 / 75.8, T=512 86.7 / 86.7 vs 86.5 / 86.4, T=2048 134.7 / 134.4 vs 131.6 / 131.8,
  // T=4096 222.1 / 221.2 vs 209.8 / 209.8, T=8192 351.4 / 350.8 vs 344.7 / 344.3 us; zipf:1.2 T=128
  // 64.9 vs 58.4, hot:0.9 81.4 vs 76.9. Every unit from the queue lost at T=8192 (362.4 us).
  c.dynamic = c.x_source == XSource::sorted_rows;
  // Hand-off epilogue once chunks are wide (its staging leaves room for 4 stages, not 6). Measured
  // e2e, hand-off vs in the consumers (same binary, x2): T=128 76.1 vs 75.5, T=1024 100.8-101.1 vs
  // 98.8-99.1, T=2048 126.5 vs 129.2-129.5, T=4096 203.1-203.4 vs 210.1-210.3, T=8192 336.4-336.5
  // vs 345.1-345.4 us.
  set_handoff_epilogue(c, c.x_source == XSource::sorted_rows && rows_per_expert >= 64);
  // Gathered batches: the producer's dry walk before the PDL wait (instruction fetch). Measured
  // e2e in their own kernel, with vs without (same binary, x3): T=1 12.4-12.5 vs 12.4-12.8, T=8
  // 24.4 vs 24.4-24.6, T=16 35.8-35.9 vs 35.9-36.1, T=32 48.9-49.0 vs 49.1-49.3 us. (In the kernel
  // the sorted rows share, it cost 1.7-3 us at T=16-32: ninth session.)
  c.warm_up = c.x_source == XSource::gather_by_token;
  // From 52 rows per expert (and from 30 to 52, in wide tiles): token rows on M, loaded by token
  // into registers, so no sorted copy is written (gemm_fp8_regs_sm90.cuh). Since the bulk-reduction
  // combine (fifteenth session) the register-loaded kernel wins from 32 rows per expert on, its glue
  // (route+quantise in token order, count, dispatch) about 15 us shorter at T=2048 than dispatch +
  // the sorted copy. Measured e2e, sorted rows / wide tiles / 128 x 128 tiles (one build, environment
  // switch, x2 in one call; seventeenth session): T=896 (28 rows) 98.1-98.2 / 99.6-99.7 / -;
  // T=1024 (32) 101.8-101.9 / 99.7-99.9 / 102.7; T=1536 (48) - / 106.1-106.2 / 109.4-109.5;
  // T=1792 (56) - / 116.5 / 114.8-114.9; T=2048 (64) 129.2-129.3 / 125.3-125.6 / 118.4-118.7 us.
  // With expert bins the register-loaded kernel has no count or dispatch kernel before it, and its
  // wide tiles win from fewer rows. Measured e2e from logits, wide tiles vs the gathering kernel
  // from bins (one call, x3; twenty-first session): 22 / 23 / 23.5 / 24 rows per expert (T=704 /
  // 736 / 752 / 768) 83.8-83.9 / 84.6-84.7 / 84.2-84.3 / 84.4-84.5 vs 80.7-80.8 / 80.7-81.0 /
  // 81.0-81.1 / 88.7-89.0 us; at 28 rows (T=896) 85.9-86.0 vs 98.7-98.9 on sorted rows. Skew
  // favours the wide tiles earlier (zipf:1.2, T=704 / 736: 92.3 / 93.4 vs 104.3 / 112.3); the
  // chooser, as everywhere, assumes uniform routing.
  if (allow_token_fragments && use_token_fragments(tokens, topk, experts, k, gather_from_bins_allowed)) {
    c = GemmFp8Config{};
    c.x_source = XSource::token_fragments;
    // L2 eviction priorities, when the weight stream outgrows half of L2 as above: the activation
    // rows (read by every unit of their row tile) evict-last, and the weights evict-first while an
    // expert reads them in at most about one and a half row tiles. Either way the weight stream does
    // not push out the rows and output lines that are read again. Measured e2e (one build,
    // environment switches, x2 in one call; seventeenth session):
    //   weights evict-first vs none: T=1024 / 1536 / 2048 / 2560 / 4096 93.1-93.2 / 97.9 /
    //   108.1-108.4 / 120.8-121.0 / 158.6-158.9 vs 99.2-99.7 / 106.1-106.3 / 120.1 / 130.7-130.9 /
    //   170.2-170.6 us; at T=8192 (two row tiles an expert) 273.3-274.7 vs 270.6-270.8, and on each
    //   expert's last row tile only T=5120 / 6144 / 8192 204.6 / 221.0-221.3 / 274.0-274.2 vs none
    //   203.9-204.0 / 220.5-221.1 / 266.1-269.3.
    //   activations evict-last, on weights evict-first up to T=4096: T=2048 / 4096 / 6144 / 8192
    //   107.6-107.7 / 158.2-158.4 / 212.9-213.7 / 268.4-269.0 vs 107.5-107.8 / 158.7-158.9 /
    //   221.1-221.7 / 271.0-272.1 us; with weights evict-first as well at 6144 / 8192 208.4 (x2) /
    //   273.1-274.6.
    c.x_evict_last = stream_outgrows_l2;
    c.weights_evict_first = stream_outgrows_l2 && rows_per_expert <= 1.5 * kRegsTileRows;
    // 64 x 256 tiles below 40 rows per expert, where most experts' rows fit one 64-row tile. With
    // the activations in registers they won up to 52 (48 rows 106.1 wide vs 109.5 tall, 56 rows
    // 116.5 vs 114.9 us); with the shared-memory ring 128 x 128 tiles win from 40: T=1280 / 1536 /
    // 1792 e2e 80.5-80.7 / 84.0 / 87.8 vs 81.9-82.0 / 84.8 / 95.3-95.5 us (docs/perf.md,
    // thirty-sixth session).
    c.wide_tiles = rows_per_expert < kTallTilesRowsPerExpert;
    // Dynamic tail, as for sorted rows. Measured e2e, with vs round robin (one build, environment
    // switch, x3 in one call; eighteenth session): T=1024 / 2048 / 4096 / 8192 84.6-84.8 /
    // 98.4-98.6 / 143.8-143.9 / 249.6-251.6 vs 84.4-84.6 / 98.4-98.6 / 148.6-148.8 / 257.4-258.0 us.
    c.dynamic = true;
  }
  // Resident token rows (weights on M, an expert's rows in shared memory over all of K), from expert
  // bins, while nearly every expert has rows (a compact walk of fewer hit experts leaves CTAs idle:
  // T=33 e2e 59.5 vs 49.7 us) and the kernel holds 1.5x the mean rows per expert in one chunk (a
  // second chunk streams the expert's weights again: T=1280, 40 rows, 106.7 vs 85.2). Measured e2e,
  // resident vs the chooser's kernel before it (one build, environment switch, x2 in one call;
  // twenty-eighth session): T=64 64.8-64.9 vs 64.5-64.6 (hit 222 of 256: not taken), T=128
  // 71.2-71.3 vs 71.9, T=256 72.7-72.8 vs 72.6-72.7, T=384 74.1-74.2 vs 74.0-74.1, T=512 74.8 vs
  // 76.5-76.6, T=768 76.3-76.4 vs 81.7, T=1024 78.1-78.3 vs 82.1 us. Skewed routes from logits
  // (the chooser assumes uniform routing): T=128 zipf:1.2 61.4 vs 58.0, hot:0.9 71.5 vs 72.6; T=512
  // zipf:1.2 88.9 vs 90.4, hot:0.9 88.8 vs 81.5 us.
  if (gather_from_bins_allowed && tokens > kGatherMaxTokens && hit >= 0.9 * double(experts) &&
      rows_per_expert <= kResidentRowsMaxRowsPerExpert &&
      1.5 * rows_per_expert <= double(resident_rows_capacity(n, k))) {
    c = GemmFp8Config{};
    c.resident_rows = true;
    c.weights_evict_first = stream_outgrows_l2;
    c.dynamic = true;
  }
  return c;
}

void set_handoff_epilogue(GemmFp8Config& c, bool on) {
  c.handoff_epilogue = on;
  c.stages = pipeline_stages(c);
}

int pipeline_stages(const GemmFp8Config& c) {
  // 6 x 16 KiB of weights in flight per SM, 4 beside the hand-off staging (what that costs where
  // chunks are narrow: the measurements above); 8 in the gathering kernels (kStagesGathered).
  if (c.handoff_epilogue) return kStagesHandoff;
  return c.x_source == XSource::gather_by_token ? kStagesGathered : kStagesInline;
}

void launch_gemm_fp8(const GemmFp8Params& p, const GemmFp8Config& cfg, const DeviceInfo& device, cudaStream_t stream,
                     bool pdl) {
  if (cfg.x_source == XSource::token_fragments) return launch_gemm_fp8_regs(p, cfg, device, stream, pdl);
  if (cfg.resident_rows) return launch_gemm_fp8_resident(p, cfg, device, stream, pdl);
  if (cfg.x_evict_last) throw Error("fp8 GEMM: x_evict_last is for the register-loaded GEMM (token fragments) only");
  if (p.expert_counts && (cfg.x_source != XSource::gather_by_token || p.combine != CombineMode::atomic))
    throw Error("fp8 GEMM: expert bins are for the register-loaded GEMM and for gathered rows with the atomic "
                "combine");
  if (p.n <= 0 || p.k <= 0 || p.n % 16 || p.k % 16)
    throw Error("fp8 GEMM: N and K must be positive multiples of 16 (got N=" + std::to_string(p.n) +
                ", K=" + std::to_string(p.k) + ")");
  if (int64_t(p.experts) * p.n >= (int64_t(1) << 31) || p.x_rows <= 0 || p.x_rows >= (int64_t(1) << 31))
    throw Error("fp8 GEMM: sizes exceed the kernel's 32-bit coordinates");
  if (!p.weights || !p.weight_scales || !p.x || !p.x_scales || !(p.offsets || p.expert_counts) || !p.row_token ||
      !p.row_weight || !p.out)
    throw Error("fp8 GEMM: null device pointer");
  if (reinterpret_cast<uintptr_t>(p.x) % 16 || reinterpret_cast<uintptr_t>(p.x_scales) % 16)
    throw Error("fp8 GEMM: the activation rows and scales must be 16-byte aligned");
  if (cfg.x_source == XSource::sorted_rows && p.x_rows % kScaleAlign)
    throw Error("fp8 GEMM: sorted activation rows must be padded to a multiple of 4");
  if (cfg.stages != pipeline_stages(cfg) || cfg.max_width != kMaxChunk)
    throw Error("fp8 GEMM: config not instantiated: " + cfg.str());
  if (cfg.handoff_epilogue && cfg.x_source != XSource::sorted_rows)
    throw Error("fp8 GEMM: the hand-off epilogue needs sorted rows (gathering takes every producer thread)");
  const ScaleLayout scale_layout = cfg.handoff_epilogue ? ScaleLayout::row_quads : ScaleLayout::group_major;
  if (p.x_scale_layout != scale_layout)
    throw Error(std::string("fp8 GEMM: this config reads activation scales ") +
                (cfg.handoff_epilogue ? "in row quads (sorted rows, hand-off epilogue)" : "group-major") +
                "; GemmFp8Params::x_scale_layout says otherwise");
  if (p.early_ids && (cfg.x_source != XSource::gather_by_token || cfg.dense || !p.hit_list || p.expert_counts || p.early_routes < 1 || p.early_routes > kEarlyIdWords))
    throw Error("fp8 GEMM: early expert ids need a compact gathering walk with a hit list and 1 to " +
                std::to_string(kEarlyIdWords) + " routes");
  if (p.experts > kGpuMaxExperts) throw Error("fp8 GEMM: at most " + std::to_string(kGpuMaxExperts) + " experts");
  if (cfg.split_k > 1 && p.combine != CombineMode::atomic) throw Error("fp8 GEMM: split-K needs the atomic combine");
  if (cfg.split_k > 1 && p.expert_counts) throw Error("fp8 GEMM: the chunk walk over expert bins takes no split-K");
  if (cfg.dynamic && (cfg.x_source != XSource::sorted_rows || cfg.balanced || !p.work_queue))
    throw Error("fp8 GEMM: the dynamic tail needs sorted rows, no balanced shares, and a work_queue");
  if (cfg.balanced && p.combine != CombineMode::atomic)
    throw Error("fp8 GEMM: balanced shares split units, which needs the atomic combine");
  const int nblocks = int((p.n + kBlockM - 1) / kBlockM), kblocks = int((p.k + kBlockK - 1) / kBlockK);
  const int split = cfg.balanced ? 1 : std::max(1, std::min(cfg.split_k, kblocks));
  const int kb_per_split = (kblocks + split - 1) / split;
  TensorMaps maps{};
  // Weight box rows fetched from DRAM as their own 128-byte lines, not widened to 256 bytes: the
  // stream is ~8 % faster so (launch_gemm_fp8_regs says more).
  maps.w = make_tensor_map_2d(p.weights, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, uint64_t(p.experts) * p.n, p.k, p.k,
                              kBlockM, kBlockK, TmaSwizzle::b128, TmaL2Promotion::b128);
  const bool gather = cfg.x_source == XSource::gather_by_token;
  if (!gather) {
    for (int i = 0; i < kWidthCount; ++i) {
      maps.x[i] = make_tensor_map_2d(p.x, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, p.x_rows, p.k, p.k, 16 << i, kBlockK,
                                     TmaSwizzle::b128);
      // (Row quads come by 1-D bulk copies: no map.)
      if (scale_layout == ScaleLayout::group_major)
        maps.xs[i] = make_tensor_map_2d(p.x_scales, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, kblocks, p.x_rows, p.x_rows * 4,
                                        1, (16 << i) + kScaleAlign, TmaSwizzle::none);
    }
  }
  KernelArgs a{p.weights,
               p.weight_scales,
               p.x,
               p.x_scales,
               p.x_rows,
               p.offsets,
               p.expert_counts,
               p.expert_stride,
               p.row_token,
               p.row_weight,
               p.out,
               p.experts,
               p.n,
               p.k,
               nblocks,
               kblocks,
               p.combine == CombineMode::atomic ? 1 : 0,
               cfg.dense ? 1 : 0,
               (kblocks + kb_per_split - 1) / kb_per_split,
               kb_per_split,
               cfg.balanced ? 1 : 0,
               cfg.weights_evict_first ? 1 : 0,
               cfg.x_evict_first && !gather ? 1 : 0,
               cfg.dynamic ? p.work_queue : nullptr,
               p.hit_list,
               // Without PDL the wait is no wait, and the dry walk would only add to the kernel's
               // time. Its shared-memory reads stay in bounds with a hit list or a dense walk.
               cfg.warm_up && pdl && gather && (p.expert_counts || p.hit_list != nullptr || cfg.dense) ? 1 : 0};
  // + alignment slack for the 1024-byte base
  const size_t smem = (cfg.handoff_epilogue ? sizeof(HandoffStorage)
                       : gather           ? sizeof(GatheredStorage)
                                          : sizeof(InlineStorage)) + 1024;
  // The enumerated instantiations: gathered batches (from offsets or early ids, or from expert bins
  // by the chunk walk), sorted rows with either epilogue.
  using Kernel = void (*)(const TensorMaps, const KernelArgs);
  static constexpr Kernel kernels[5] = {
      gemm_fp8_block_kernel<false, Rows::gathered>, gemm_fp8_block_kernel<false, Rows::sorted>,
      gemm_fp8_block_kernel<true, Rows::sorted>, gemm_fp8_block_kernel<false, Rows::binned>,
      gemm_fp8_block_kernel<false, Rows::gathered, true>};
  const int variant = gather ? (p.expert_counts ? 3 : p.early_ids ? 4 : 0) : (cfg.handoff_epilogue ? 2 : 1);
  const Kernel kernel = kernels[variant];
  ensure_dynamic_smem(kernel, smem);
  // Persistent grid: one CTA per SM (at most one unit per CTA when there are fewer units).
  const int64_t units = int64_t(p.experts) * nblocks * (cfg.balanced ? kblocks : a.split_k);
  if (units >= (int64_t(1) << 31)) throw Error("fp8 GEMM: E x ceil(N/128) x ceil(K/128) exceeds the kernel's 32-bit work index");
  // The chunk walk's unit count is known only on the device (an expert's further chunks): every SM.
  const int grid = p.expert_counts ? device.sm_count : int(std::max<int64_t>(1, std::min<int64_t>(units, device.sm_count)));
  a.kblocks_div = FastDivisor(uint32_t(kblocks));
  a.nblocks_div = FastDivisor(uint32_t(nblocks));
  a.per_expert_div = FastDivisor(uint32_t(nblocks * a.split_k));
  a.split_k_div = FastDivisor(uint32_t(a.split_k));
  a.grid_div = FastDivisor(uint32_t(grid));
  a.early_ids = p.early_ids;
  a.early_routes = p.early_routes;
  launch_kernel(kernel, dim3(grid), dim3(kThreads), smem, stream, pdl, maps, a);
}

}  // namespace loom
