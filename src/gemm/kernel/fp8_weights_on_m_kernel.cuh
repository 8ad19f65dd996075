// The weights-on-M kernels: the FP8 weights-on-M mainloop (mainloop/fp8_weights_on_m.cuh) over a
// token source, an epilogue and the expert walk (scheduler/expert_walk.cuh), in the skeleton
// (grouped_gemm_sm90.cuh).
//
//   warp roles   warpgroup 0 (56 registers a thread): the token source's producer (thread 0 alone
//                for sorted rows, all 128 threads when gathering), the epilogue's warps (hand-off:
//                warps 1-3); warpgroups 1 and 2 (224): the MMAs over 64 weight rows each, then the
//                epilogue (or its hand-off)
//   ring         per stage the weight tile and the chunk's activation tile (and their scales)
//   units        (expert, 128 weight rows, K range) for all of the expert's rows, in chunks of the
//                width that fits them; the consumers take chunks of 16, 32, 64 or 128 columns
//
// Instances (src/gemm/instances/): gathered rows from offsets, from early ids, from expert bins;
// sorted rows with the epilogue in the consumers or handed off.
#pragma once

#include <cstdint>
#include <type_traits>

#include "diag/chain_trace.cuh"
#include "gemm/fast_divisor.hpp"
#include "gemm/kernel/grouped_gemm_sm90.cuh"
#include "gemm/mainloop/fp8_weights_on_m.cuh"
#include "gemm/operand/sorted_rows.cuh"
#include "gemm/scheduler/expert_walk.cuh"
#include "gemm/weight_segments.hpp"
#include "ptx/barrier.cuh"
#include "ptx/pdl.cuh"
#include "ptx/tma.cuh"

namespace loom::gemm {

struct WeightsOnMArgs {
  const uint8_t* weights;
  const float* weight_scales;
  const uint8_t* x;       // [x_rows, K] e4m3: token order (gather) or expert-sorted rows
  const float* x_scales;  // [KB, x_rows], or row quads (hand-off)
  int64_t x_rows;
  const int32_t* offsets;
  const int32_t* counts;  // expert bins (GemmFp8Params::expert_counts) or nullptr: offsets
  int stride;             // GemmFp8Params::expert_stride
  const int32_t* row_token;
  const float* row_weight;
  float* out;
  int experts, n, k, nblocks, kblocks;
  WeightSegments seg;  // block nb's weight rows and output columns
  int atomic;
  int dense;
  int split_k, kblocks_per_split;
  int balanced;  // CTAs take equal shares of the (unit, K block) space (WeightsOnMConfig::balanced)
  // L2 eviction priority of the TMA loads: 1 = evict_first (read once, let it go first), 0 = normal.
  int weights_evict_first, x_evict_first;
  // Dynamic tail (sorted rows): the work queue (scheduler/work_queue.cuh); nullptr = static walk.
  int32_t* work_queue;
  // Compact mode: the experts with rows and their row ranges, written by the kernel before
  // (DispatchParams::hit_list); nullptr = built here from the offsets.
  const int4* hit_list;
  // Gathered batches under PDL, with a hit list or a dense walk: the producer walks to its first
  // unit's rows once, dry, before the PDL wait (WeightsOnMConfig::warm_up).
  int warm_up;
  // The unit walk's divisors (kblocks, nblocks, nblocks * split_k, split_k, gridDim.x), their
  // divisions on the path from the PDL wait to the first unit a high multiply each.
  FastDivisor kblocks_div, nblocks_div, per_expert_div, split_k_div, grid_div;
  // GemmFp8Params::early_ids (gathering compact walks only; nullptr: none) and early_routes.
  const uint32_t* early_ids;
  int early_routes;
  // GemmFp8Params::prewait_prefetch_bytes, this CTA's share (sorted rows; 0: none), and
  // walk_inputs_ready.
  int64_t prewait_bytes;
  int walk_inputs_ready;
  int store_bf16;   // GemmFp8Params::store_bf16: route rows in bf16 (epilogue/route_rows.cuh)
  int reduce_rows;  // GemmFp8Params::reduce_rows: red.v4 into the sorted row, not the token's
};

template <class SourceT, class EpilogueT, ExpertsFrom kFrom, int kStagesT>
struct WeightsOnMKernel {
  using Source = SourceT;
  using Epilogue = EpilogueT;
  static constexpr int kStages = kStagesT;
  static constexpr uint32_t kProducerRegs = 56;  // the gather needs more than 40 (it spilled)
  static constexpr uint32_t kConsumerRegs = 224;
  static_assert(!Epilogue::kHandoff || !Source::kGathered, "the hand-off epilogue takes the producer threads a gather needs");
  static_assert(!Epilogue::kHandoff || kStages <= 4, "the producer runs at most one scale quad ahead (QuadScales::kSlots)");
  static_assert(Epilogue::kHandoff == Source::kQuads, "row-quad scales go with the hand-off epilogue");
  static_assert(kFrom != ExpertsFrom::early_ids || Source::kGathered, "early ids serve the gathering compact walk");
  static_assert(kFrom != ExpertsFrom::bins || Source::kGathered, "the chunk walk over expert bins gathers its rows");

  using Maps = TensorMaps;
  using Args = WeightsOnMArgs;
  using Params = ParamRefs<Maps, Args>;
  using SharedStorage = WeightsOnMStorage<kStages, Source::kXRows, typename Source::template Storage<kStages>,
                                          typename Epilogue::Storage, WalkStorage>;
  struct Schedule {
    int units;     // the walk's units (0 while the warm-up defers the wait)
    bool warm_up;  // the producer's dry walk runs before the PDL wait
  };

  static __device__ __forceinline__ void init(SharedStorage& s, const Params&) {
    init_stage_barriers(s, Source::kFullArrivals);
    UnitRing::init(s.walk, 32 * kConsumerWarps);
    ptx::mbar_init(&s.walk.walk_ready, kProducerThreads);
    Epilogue::init(s);
    Source::init(s);
  }
  static __device__ __forceinline__ void prefetch(const Params& p) { ptx::prefetch_tensormap(&p.maps.w); }

  // Everything after the PDL wait reads what the dispatch and quantisation kernels wrote. Early
  // ids: the hit list comes from them before the PDL wait, which each thread then runs before its
  // first read of the layout or the activations (the producer threads after their first weight
  // load, the consumers at once). Sorted rows with a pre-wait prefetch: a walk that needs nothing
  // the kernel before writes (dense, or walk_inputs_ready) is built before the wait, and this
  // CTA's first weights are requested then.
  template <class Group>
  static __device__ __forceinline__ int wait_for_inputs(SharedStorage& s, const Params& p) {
    const auto& a = p.a;
    const bool early = kPrewait && a.prewait_bytes > 0 && (a.dense || a.walk_inputs_ready);
    int units = 0;
    if (early) {
      units = prepare_walk<kFrom, Group>(s.walk, a);
      prefetch_first_units<Group>(s.walk, a, units);
    }
    if constexpr (kFrom != ExpertsFrom::early_ids) ptx::pdl_wait();
    if (threadIdx.x == 0) LOOM_TRACE(kGemmWaited);
    if (!early) units = prepare_walk<kFrom, Group>(s.walk, a);
    if (threadIdx.x == 0) LOOM_TRACE(kGemmUnits);
    return units;
  }
  static constexpr bool kPrewait = !Source::kGathered && kFrom == ExpertsFrom::offsets;
  // This CTA's units in walk order (blockIdx.x, + gridDim.x, ...; a dynamic tail may hand the
  // last ones to other CTAs, which then find them in L2 as well), K-first within each: thread t of
  // the first 128 prefetches weight row t of each unit, up to its share of prewait_bytes. Only a
  // hint: nothing waits for it.
  template <class Group>
  static __device__ __forceinline__ void prefetch_first_units(const WalkStorage& w, const Args& a, int units) {
    constexpr int kRows = WeightSegments::kBlockRows, kBlockK = 128;
    const int t = Group::rank();
    if (t >= kRows) return;
    int64_t left = a.prewait_bytes / kRows;
#pragma unroll 1
    for (int u = int(blockIdx.x); u < units && left >= 16; u += int(gridDim.x)) {
      const Unit unit = decode_unit<kFrom>(w, a, u);
      const int row = a.seg.first_row(unit.nb) + t;
      const int64_t k0 = int64_t(unit.kb_begin) * kBlockK, k1 = min(int64_t(unit.kb_end) * kBlockK, int64_t(a.k));
      const int64_t bytes = min(k1 - k0, left) / 16 * 16;  // K and the budget's share: multiples of 16 bytes
      if (bytes <= 0) break;
      if (row < a.seg.end_row(unit.nb))
        ptx::prefetch_l2_bulk(a.weights + (int64_t(unit.expert) * a.n + row) * a.k + k0, uint32_t(bytes));
      left -= bytes;
    }
  }
  static __device__ __forceinline__ Schedule prepare(SharedStorage& s, const Params& p) {
    __syncthreads();  // the barriers' initialisation
    const bool warm_up = Source::kGathered && p.a.warm_up != 0;
    return Schedule{warm_up ? 0 : wait_for_inputs<CtaGroup>(s, p), warm_up};
  }
  // The warm-up's end, producer side (from its loop, after the dry iteration): the producer
  // warpgroup alone waits for the inputs and builds the walk, then tells the consumers.
  static __device__ __forceinline__ int end_warm_up(SharedStorage& s, const Params& p) {
    ProducerGroup::sync();  // every producer thread's dry reads of the walk's tables, before they are rewritten
    const int units = wait_for_inputs<ProducerGroup>(s, p);
    ptx::mbar_arrive(&s.walk.walk_ready);  // release: this thread's part of the walk's tables
    return units;
  }
  // ... consumer side: the walk the producers built.
  static __device__ __forceinline__ int await_warm_up(SharedStorage& s, const Params& p) {
    ptx::mbar_wait(&s.walk.walk_ready, 0);
    if constexpr (kFrom != ExpertsFrom::early_ids) ptx::pdl_wait();
    return unit_count<kFrom>(s.walk, p.a);
  }

  static __device__ __forceinline__ void produce(SharedStorage& s, const Params& p, const Schedule& sched) {
    const auto& a = p.a;
    Epilogue::producer_warps(s, a);
    // The warm-up's dry walk takes the first unit of a walk whose indices are valid before the
    // wait: dense, the real one (its count needs no inputs); compact, a grid-sized one (hit-list
    // slots below gridDim.x / ceil(N/128), within kGpuMaxExperts); the chunk walk, a grid-sized one
    // (its decode clamps what it reads).
    WorkCursor work(a, sched.warm_up
                           ? (a.dense && kFrom != ExpertsFrom::bins ? unit_count<kFrom>(s.walk, a) : int(gridDim.x))
                           : sched.units);
    if constexpr (Source::kGathered)
      Source::produce(s, p, sched.warm_up, work, [&] { return end_warm_up(s, p); });
    else
      Source::template produce<kFrom>(s, p, sched.units, work);
  }

  static __device__ __forceinline__ void consume(SharedStorage& s, const Params& p, const Schedule& sched,
                                                 int consumer) {
    const auto& a = p.a;
    ConsumerCursors<kStages, Source, Epilogue> cursors;
    WorkCursor work(a, sched.warm_up ? await_warm_up(s, p) : sched.units);
    if constexpr (kFrom == ExpertsFrom::early_ids) ptx::pdl_wait();  // the rows' tokens and weights, the cleared output
    Unit unit;
    const bool dynamic = !Source::kGathered && a.work_queue != nullptr;
    PipelineState<kUnitSlots> ring;  // unit_ring slot and phase, as the producer's
    while (true) {
      int row_begin, rows;
      if (dynamic) {
        const int4 tag = UnitRing::take(s.walk, ring);
        if (tag.x < 0) break;
        unit = decode_unit<kFrom>(s.walk, a, tag.x);
        row_begin = tag.y;
        rows = tag.z;
      } else if (work.template next<kFrom>(s.walk, a, unit)) {
        unit_rows<kFrom>(s.walk, a, unit, row_begin, rows);
      } else {
        break;
      }
      for (int chunk = 0; chunk < rows; chunk += Source::kChunk) {
        const int chunk_rows = min(Source::kChunk, rows - chunk), row0 = row_begin + chunk;
        const int wi = width_index(chunk_rows);
        if (wi == 0)
          consume_chunk<16, Source, Epilogue>(s, cursors, a, unit, row0, chunk_rows, consumer);
        else if (Source::kGathered || wi == 1)
          consume_chunk<32, Source, Epilogue>(s, cursors, a, unit, row0, chunk_rows, consumer);
        else if constexpr (!Source::kGathered) {
          if (wi == 2)
            consume_chunk<64, Source, Epilogue>(s, cursors, a, unit, row0, chunk_rows, consumer);
          else
            consume_chunk<128, Source, Epilogue>(s, cursors, a, unit, row0, chunk_rows, consumer);
        }
      }
    }
    Epilogue::end(s, cursors.epi);
    if (threadIdx.x == 128) LOOM_TRACE(kGemmEnd);
  }
};

}  // namespace loom::gemm
