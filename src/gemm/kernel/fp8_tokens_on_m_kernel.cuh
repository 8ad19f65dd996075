// The tokens-on-M kernels: the FP8 tokens-on-M mainloop (mainloop/fp8_tokens_on_m.cuh) with the
// token-fragments source, the staged combine and the expert-tile scheduler, in the skeleton.
//
//   warp roles   warpgroup 0 (40 registers a thread): warp 0 the weight tiles by TMA, warp 1 the
//                unit records (scheduler/expert_tiles.cuh), warp 2 the activation scales, warp 3
//                the combine; warpgroups 1 and 2 (232): their rows' activation ring and the MMAs
//   units        (expert, row tile, weight block(s)): consecutive units share a row tile, then an
//                expert, so CTAs running together read the same lines (sorted rows, ffn GEMM 2:
//                weight blocks outermost); round robin, the last round from the work queue
// Instances: tall (128 x 128) and wide (64 x 256) tiles, A rows by token (the token-order codes) or
// by sorted row (kSortedRows: the ffn intermediate; the combine still goes by token).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <type_traits>

#include "diag/chain_trace.cuh"
#include "gemm/epilogue/act_quant.cuh"
#include "gemm/epilogue/combine_staged.cuh"
#include "gemm/kernel/grouped_gemm_sm90.cuh"
#include "gemm/mainloop/fp8_tokens_on_m.cuh"
#include "gemm/operand/token_fragments.cuh"
#include "gemm/promote_rows.cuh"
#include "gemm/scheduler/expert_tiles.cuh"
#include "gemm/scheduler/work_queue.cuh"
#include "gemm/weight_segments.hpp"
#include "ptx/cp_async.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/pdl.cuh"
#include "ptx/tma.cuh"

namespace loom::gemm {

struct TokensOnMArgs {
  const uint8_t* x;       // [x_rows, K] token-order codes in fragment order
  const float* x_scales;  // [K/128, x_rows] (group-major) or [K/512, x_rows, 4] (row quads)
  int64_t x_rows;
  int scales_in_quads;    // ScaleLayout::row_quads
  const float* weight_scales;
  const int32_t* offsets;
  const int32_t* counts;  // expert bins (GemmFp8Params::expert_counts) or nullptr: offsets
  int stride;             // GemmFp8Params::expert_stride
  const int32_t* row_token;
  const float* row_weight;
  float* out;
  int experts, n, k, nblocks, kblocks;
  int atomic;
  int weights_evict_first;  // TokensOnMConfig::weights_evict_first
  int x_evict_last;         // TokensOnMConfig::x_evict_last
  int32_t* queue;           // dynamic tail (TokensOnMConfig::dynamic): the work queue; nullptr: round robin
  WeightSegments seg;       // block nb's weight rows and output columns (set after the rest)
  int store_bf16;           // GemmFp8Params::store_bf16: route rows in bf16 (epilogue/route_rows.cuh)
};

// The SiLU*up epilogue's instance (kAct; GemmFp8Params::act): units are (row tile, I block); weight
// rows gate block b and up block b (rows inter + 128 b), scales blocks b and inter_blocks + b. A
// type of its own, so the other instances' parameters stay as they are.
struct TokensOnMActArgs : TokensOnMArgs {
  uint8_t* act_codes;
  float* act_scales;
  float* act_values;  // optional (tests)
  int64_t act_rows;
  int act_quads, act_fragments, inter, inter_blocks;
};

// Host: the tensor map and arguments of a tokens-on-M launch, after every check of what the kernel
// takes (loom::Error otherwise). The product's launcher and the lab's profiled instance use it.
struct TokensOnMLaunch {
  CUtensorMap map;
  TokensOnMActArgs args;  // the other instances take its TokensOnMArgs part
};
TokensOnMLaunch make_tokens_on_m_launch(const GemmFp8Params& p, const TokensOnMConfig& cfg);

namespace tokens_on_m {

// A unit's rows as the consumers need them, loaded ahead by the record warp (so no global load of
// the consumers shares a scoreboard with their activation loads in flight).
inline constexpr int kRecordSlots = 3;  // two units ahead: a consumer reads the next unit at the start of one
struct UnitRecord {
  int32_t token[kTileRows];   // 0 past the tile's rows (never copied: the consumers zero-fill them)
  float weight[kTileRows];
  float wscale[kMaxK / kBlockK];
  float wscale2[kMaxK / kBlockK];  // wide tiles: the second weight block's
  int32_t row0, rows, nb;  // first sorted row, rows in the tile (0..128), weight block; rows < 0: the end
  int32_t expert;          // the weight producer's dynamic units read it here
};

struct alignas(1024) Storage {
  static constexpr int kStages = tokens_on_m::kStages;
  static constexpr int kRecordSlots = tokens_on_m::kRecordSlots;
  uint8_t w[kStages][tokens_on_m::kWTileBytes];
  FragmentStorage src;
  StagedCombineStorage epi;
  uint64_t full[kStages];
  uint64_t empty[kStages];
  ExpertTiles tiles;
  RecordRing<UnitRecord, kRecordSlots> meta;
};

// Unit u = (row tile, weight blocks).
struct Unit {
  int expert, tile, nb;  // nb: the unit's first weight block
};

}  // namespace tokens_on_m

template <bool kWide, class Probe = tokens_on_m::NoProbe, bool kSortedRows = false, bool kAct = false>
struct TokensOnMKernel {
  static_assert(!kAct || (kWide && !kSortedRows), "the SiLU*up epilogue: wide tiles of token-order rows");
  using Maps = CUtensorMap;
  using Args = std::conditional_t<kAct, TokensOnMActArgs, TokensOnMArgs>;
  using Params = ParamRefs<Maps, Args>;
  using SharedStorage = tokens_on_m::Storage;
  using Sh = tokens_on_m::TileShape<kWide>;
  using Unit = tokens_on_m::Unit;
  using StageCursor = tokens_on_m::StageCursor;
  using MetaCursor = PipelineState<tokens_on_m::kRecordSlots>;
  static constexpr uint32_t kProducerRegs = 40, kConsumerRegs = 232;
  static constexpr int kTileCols = tokens_on_m::kTileCols, kBlockK = tokens_on_m::kBlockK;
  static constexpr int kTileRows = tokens_on_m::kTileRows, kRing = tokens_on_m::kRing;

  struct Schedule {
    int units;
    int static_end;  // units below it go round robin; the rest come from the queue (none without one)
  };

  static __device__ __forceinline__ int unit_columns(const Args& a) {  // units per row tile
    if constexpr (kAct) return a.inter_blocks;  // a gate block and its up block each
    return (a.nblocks + Sh::kBlocks - 1) / Sh::kBlocks;
  }
  static __device__ __forceinline__ Unit decode(const SharedStorage& s, const Args& a, int u) {
    const int cols = unit_columns(a);
    if constexpr (kSortedRows) {
      // ffn GEMM 2: column blocks outermost, so the CTAs running together reduce into the same
      // [T, 128] columns of the fp32 accumulator, which stay in L2 while every expert adds to them
      // (row tiles first, the whole [T, H] accumulator outgrows L2 at prefill). The intermediate's
      // rows are read once per column block (L2 evict-last).
      const int tiles = s.tiles.tile_start[a.experts];
      const int col = u / tiles, tile = u - col * tiles;
      const int e = tile_expert(s.tiles, a.experts, tile);
      return Unit{e, tile - s.tiles.tile_start[e], col * Sh::kBlocks};
    }
    const int tile = u / cols;
    const int e = tile_expert(s.tiles, a.experts, tile);
    return Unit{e, tile - s.tiles.tile_start[e], (u - tile * cols) * (kAct ? 1 : Sh::kBlocks)};
  }

  static __device__ __forceinline__ void init(SharedStorage& s, const Params&) {
    for (int i = 0; i < tokens_on_m::kStages; ++i) {
      ptx::mbar_init(&s.full[i], 1 + 32);  // the weight tile's arrive.expect_tx, warp 2's lanes after their scales
      ptx::mbar_init(&s.empty[i], kConsumerWarps * kReleaseArrivalsPerWarp);
    }
    init_record_ring(s.meta, 32 * kConsumerWarps + 32);  // every consumer thread and warp 2's lanes
    tokens_on_m::init_staged_combine(s.epi);
  }
  static __device__ __forceinline__ void prefetch(const Params& p) { ptx::prefetch_tensormap(&p.maps); }

  // Everything below reads what the dispatch and quantisation kernels wrote.
  static __device__ __forceinline__ Schedule prepare(SharedStorage& s, const Params& p) {
    const Args& a = p.a;
    ptx::pdl_wait();
    if (threadIdx.x == 0) LOOM_TRACE(kGemmWaited);
    build_expert_tiles(s.tiles, a, Sh::kRows);  // its barriers also publish the mbarrier initialisation
    if (threadIdx.x == 0) LOOM_TRACE(kGemmUnits);
    const int units = s.tiles.tile_start[a.experts] * unit_columns(a);
    return Schedule{units, a.queue != nullptr ? dynamic_static_end(units, int(gridDim.x)) : INT32_MAX};
  }

  static __device__ __forceinline__ void produce(SharedStorage& s, const Params& p, const Schedule& sched) {
    const Args& a = p.a;
    if (threadIdx.x == 0) LOOM_TRACE(kGemmProducerRole);
    if (threadIdx.x == 0) {
      produce_weights(s, p, sched);
    } else if (threadIdx.x / 32 == 1) {
      // Warp 1: each unit's rows (tokens, top-k weights) and weight scales into the record ring.
      run_record_warp(
          s.meta, sched.units, sched.static_end, a.queue,
          [&](tokens_on_m::UnitRecord& m, int u, int lane) {
            const Unit unit = decode(s, a, u);
            const int begin = s.tiles.expert_row[unit.expert] + unit.tile * Sh::kRows;
            const int rows = min(Sh::kRows, s.tiles.expert_end[unit.expert] - begin);
            for (int i = lane; i < kTileRows; i += 32) {
              m.token[i] = i < rows ? __ldcg(a.row_token + begin + i) : 0;
              m.weight[i] = i >= rows ? 0.0f : a.row_weight ? __ldcg(a.row_weight + begin + i) : 1.0f;
            }
            const float* wscale = a.weight_scales + (int64_t(unit.expert) * a.nblocks + unit.nb) * a.kblocks;
            for (int i = lane; i < a.kblocks; i += 32) m.wscale[i] = __ldg(wscale + i);
            if constexpr (kWide) {
              const float* wscale2;
              if constexpr (kAct)  // up block nb: the up segment's blocks follow the gate's
                wscale2 = wscale + a.inter_blocks * a.kblocks;
              else
                wscale2 = wscale + (unit.nb + 1 < a.nblocks ? a.kblocks : 0);
              for (int i = lane; i < a.kblocks; i += 32) m.wscale2[i] = __ldg(wscale2 + i);
            }
#ifdef LOOM_CHAIN_TRACE
            if (lane == 0 && u == int(blockIdx.x)) LOOM_TRACE(kGemmFirstRows);
#endif
            if (lane == 0) {
              m.row0 = begin;
              m.rows = rows;
              m.nb = unit.nb;
              m.expert = unit.expert;
            }
          },
          [](tokens_on_m::UnitRecord& m, int lane) {
            if (lane == 0) m.rows = -1;
          });
    } else if (threadIdx.x / 32 == 2) {
      tokens_on_m::produce_scales<kWide, kSortedRows>(s, a);
    } else if (threadIdx.x / 32 == 3 && a.atomic) {
      tokens_on_m::drain_staged_blocks<Probe>(s.epi, a);
    }
    if (threadIdx.x % 32 == 0) LOOM_TRACE(kGemmEnd);  // each warp's end (the combine warp's after its reductions)
  }

  // Producer thread 0: the weight tiles of the CTA's units. Round-robin units it decodes itself (no
  // wait for the record warp at the start); the queue's units it reads from the records, whose
  // slots cannot be refilled before it has: a record is freed only once the consumers have taken
  // every stage of its unit.
  static __device__ __forceinline__ void produce_weights(SharedStorage& s, const Params& p, const Schedule& sched) {
    using namespace tokens_on_m;
    const Args& a = p.a;
    [[maybe_unused]] typename Probe::Sums ph = {};
    [[maybe_unused]] const uint32_t ph_start = Probe::clock();
    [[maybe_unused]] const uint64_t ns_start = Probe::nanos();
    StageCursor st;
    [[maybe_unused]] bool traced_first_tma = false;  // trace builds: the first TMA only
    const uint64_t evict_first = ptx::l2_policy_evict_first();
    MetaCursor mc;
    for (int u = blockIdx.x;;) {
      Unit unit;
      if (u < sched.static_end) {
        if (u >= sched.units) break;
        unit = decode(s, a, u);
        u += gridDim.x;
      } else {
        ptx::mbar_wait(&s.meta.full[mc.stage], mc.phase);
        const UnitRecord& m = s.meta.rec[mc.stage];
        if (m.rows < 0) break;
        unit = Unit{m.expert, 0, m.nb};
      }
      if (!traced_first_tma) LOOM_TRACE(kGemmFirstDecoded);
      mc.advance();
      // The unit's weight rows, block j: a wide unit past the last weight block (an odd number of
      // them) loads the last one again, and the warpgroup that takes it drops every output.
      int w_rows[Sh::kBlocks];
#pragma unroll
      for (int j = 0; j < Sh::kBlocks; ++j) {
        if constexpr (kAct)  // gate block nb, then up block nb (w13's up rows start at row inter)
          w_rows[j] = unit.expert * a.n + (j == 0 ? 0 : a.inter) + unit.nb * kTileCols;
        else
          w_rows[j] = unit.expert * a.n + a.seg.first_row(min(unit.nb + j, a.nblocks - 1));
      }
      for (int kb = 0; kb < a.kblocks; ++kb)
#pragma unroll
        for (int j = 0; j < Sh::kBlocks; ++j) {
          const int w_row = w_rows[j];
          [[maybe_unused]] const uint32_t ph_wait = Probe::clock();
          ptx::mbar_wait(&s.empty[st.stage], st.phase ^ 1);
          Probe::add(ph, kPhEmptyWait, Probe::clock() - ph_wait);
          Probe::add(ph, kPhStages, 1u);
          ptx::mbar_arrive_expect_tx(&s.full[st.stage], tokens_on_m::kWTileBytes);
          if (a.weights_evict_first)
            ptx::tma_load_2d_hint(s.w[st.stage], &p.maps, kb * kBlockK, w_row, &s.full[st.stage], evict_first);
          else
            ptx::tma_load_2d(s.w[st.stage], &p.maps, kb * kBlockK, w_row, &s.full[st.stage]);
          if (st.stage == 0 && st.phase == 0 && !traced_first_tma) LOOM_TRACE(kGemmFirstTma);
          traced_first_tma = true;
          st.advance();
        }
    }
    Probe::add(ph, kPhTotal, Probe::clock() - ph_start);
    Probe::set(ph, kPhNanos, uint32_t(Probe::nanos() - ns_start));
    Probe::add(ph, kPhCtas, 1u);
    Probe::flush(2, ph);
  }

  static __device__ __forceinline__ void consume(SharedStorage& s, const Params& p, const Schedule&, int consumer) {
    using namespace tokens_on_m;
    const Args& a = p.a;
    [[maybe_unused]] typename Probe::Sums ph = {};
    [[maybe_unused]] const uint32_t ph_start = Probe::clock();
    // The wide kernel keeps a ring of 2 (a ring of 3 ran slower) over an even number of K blocks,
    // so it never rotates.
    constexpr int kRingT = kWide ? 2 : kRing;
    const int lane = threadIdx.x % 32, q = lane % 4, wg_thread = threadIdx.x % 128;
    uint32_t out_phase = 0;  // fast combine: the parity of this warpgroup's next staged block
    [[maybe_unused]] bool traced_epilogue = false;  // trace builds
    const int row_a = 16 * (threadIdx.x / 32 % 4) + lane / 4, row_b = row_a + 8;  // in the warpgroup's 64
    StageCursor st;
    MetaCursor mc;
    // This warpgroup's first row in a tile, and its rows of a unit (<= 0: none).
    const int row_base = kWide ? 0 : 64 * consumer;
    // The A row of the unit's row r (-1: none): its token, or with kSortedRows its sorted row.
    auto a_row = [](const UnitRecord& m, int r) {
      if constexpr (kSortedRows)
        return r < m.rows ? m.row0 + r : -1;
      else
        return r < m.rows ? m.token[r] : -1;
    };
    auto wg_rows_of = [&](const UnitRecord& m) { return min(64, m.rows - row_base); };
    static_assert(kRingT <= kRing, "the ring's slots in shared memory");
    ptx::mbar_wait(&s.meta.full[mc.stage], mc.phase);
    // The ring slot of the unit's K block 0: block kb sits in slot (kb + rot) % kRingT, so a unit's
    // last blocks can load the next unit's first ones into the slots they free whatever K is.
    int rot = 0;
    {
      const UnitRecord& m = s.meta.rec[mc.stage];
      if (wg_rows_of(m) > 0)
#pragma unroll
        for (int i = 0; i < kRingT; ++i) {
          copy_block(s, i, consumer, wg_thread, a, a_row(m, row_base + row_a), a_row(m, row_base + row_b), q, i);
          ptx::cp_async_commit();
        }
    }
    while (s.meta.rec[mc.stage].rows >= 0) {
      [[maybe_unused]] const uint32_t ph_unit = Probe::clock();
      const UnitRecord& m = s.meta.rec[mc.stage];
      const uint32_t cur_slot = mc.stage;
      mc.advance();
      // The next unit (the record warp is two ahead: no wait in the steady state): its first blocks
      // are loaded into the ring slots this unit's last blocks free.
      ptx::mbar_wait(&s.meta.full[mc.stage], mc.phase);
      const UnitRecord& next = s.meta.rec[mc.stage];
      const bool next_has_rows = next.rows >= 0 && wg_rows_of(next) > 0;
      const int next_tok_a = a_row(next, row_base + row_a);
      const int next_tok_b = a_row(next, row_base + row_b);
      const int wg_rows = wg_rows_of(m);
      if (wg_rows <= 0) {
        // No rows here (the expert's last tile is at most half full): keep the stage ring in step.
        for (int kb = 0; kb < a.kblocks * Sh::kBlocks; ++kb) {
          pass_stage(s, st);
          st.advance();
        }
        if (next_has_rows)
#pragma unroll
          for (int i = 0; i < kRingT; ++i) {
            copy_block(s, i, consumer, wg_thread, a, next_tok_a, next_tok_b, q, i);
            ptx::cp_async_commit();
          }
        rot = 0;
        ptx::mbar_arrive(&s.meta.empty[cur_slot]);
        if (a.atomic) stage_nothing(s.epi, consumer, out_phase);
        Probe::add(ph, kPhIdle, Probe::clock() - ph_unit);
        Probe::add(ph, kPhIdleUnits, 1u);
        continue;
      }
      const int tok_a = a_row(m, row_base + row_a);
      const int tok_b = a_row(m, row_base + row_b);
      float final_acc[64], acc[64];
#pragma unroll
      for (int i = 0; i < 64; ++i) final_acc[i] = 0.0f;
      // K blocks in steps of kRingT, the loop instantiated once per rotation so that every ring
      // slot's offset is a compile-time constant.
      auto k_loop = [&](auto rotation) {
        constexpr int kRot = decltype(rotation)::value;
        for (int kb0 = 0; kb0 < a.kblocks; kb0 += kRingT) {
#pragma unroll
          for (int i = 0; i < kRingT; ++i) {
            const int kb = kb0 + i;
            if (kb >= a.kblocks) break;
            const int slot = (i + kRot) % kRingT;
            const float sw = kWide && consumer == 1 ? m.wscale2[kb] : m.wscale[kb];
            // A wide unit's K block: warpgroup 0 computes on the first stage, 1 on the second.
            if (kWide && consumer == 1) {
              pass_stage(s, st);
              st.advance();
            }
            const float2 xs = mma_block<kRingT - 1, Probe>(s, acc, slot, consumer, wg_thread, st, row_base + row_a,
                                                            row_base + row_b, [&] {
              // One group per K block, empty or not, so that the kRingT - 1 groups left pending are
              // always the blocks after this one.
              if (kb + kRingT < a.kblocks)
                copy_block(s, slot, consumer, wg_thread, a, tok_a, tok_b, q, kb + kRingT);
              else if (next_has_rows)
                copy_block(s, slot, consumer, wg_thread, a, next_tok_a, next_tok_b, q, kb + kRingT - a.kblocks);
              ptx::cp_async_commit();
            }, ph);
            [[maybe_unused]] const uint32_t ph_promote = Probe::clock();
            const float scale_a = xs.x * sw, scale_b = xs.y * sw;
            st.advance();
            if (kWide && consumer == 0) {
              pass_stage(s, st);
              st.advance();
            }
            promote_rows(final_acc, acc, scale_a, scale_b);
            Probe::add(ph, kPhPromote,
                       Probe::clock_after(__float_as_uint(final_acc[0]), __float_as_uint(final_acc[21]),
                                          __float_as_uint(final_acc[42]), __float_as_uint(final_acc[63])) -
                           ph_promote);
          }
        }
      };
      static_assert(kRingT >= 2 && kRingT <= 3, "one k_loop instantiation per rotation below");
      [[maybe_unused]] const uint32_t ph_loop = Probe::clock();
      Probe::add(ph, kPhUnitStart, ph_loop - ph_unit);
      if constexpr (kWide) {
        // An even number of K blocks (the launcher checks): the rotation stays 0.
        k_loop(std::integral_constant<int, 0>{});
      } else {
        if (rot == 0)
          k_loop(std::integral_constant<int, 0>{});
        else if (kRingT == 2 || rot == 1)
          k_loop(std::integral_constant<int, 1>{});
        else
          k_loop(std::integral_constant<int, 2 % kRingT>{});
        rot = (rot + a.kblocks) % kRingT;  // the next unit's block 0 went where this unit's block kblocks would
      }

      [[maybe_unused]] const uint32_t ph_end = Probe::clock();
      Probe::add(ph, kPhKLoop, ph_end - ph_loop);
      Probe::add(ph, kPhUnits, 1u);
      if (m.rows > 64) {
        Probe::add(ph, kPhKLoopTall, ph_end - ph_loop);
        Probe::add(ph, kPhUnitsTall, 1u);
      }
#ifdef LOOM_CHAIN_TRACE
      if (threadIdx.x == 128 && !traced_epilogue) LOOM_TRACE(kGemmEpilogue);  // the first unit's K loop done
      traced_epilogue = true;
#endif
      const int nb = m.nb + (kWide ? consumer : 0);
      auto release_record = [&] { ptx::mbar_arrive(&s.meta.empty[cur_slot]); };
      if constexpr (kAct) {
        const int row0 = m.row0, rows = m.rows, b = m.nb;
        release_record();
        act_epilogue(s, a, final_acc, consumer, row0, rows, b, row_a, row_b);
      } else if (a.atomic)
        stage_block<Probe>(s.epi, m, a, final_acc, consumer, row_base, row_a, row_b, wg_rows, nb, out_phase,
                           release_record, ph);
      else
        store_rows(m, a, final_acc, row_base, row_a, row_b, wg_rows, nb, release_record);
      Probe::add(ph, kPhEpilogue, Probe::clock() - ph_end);
    }
    if (a.atomic) stage_end(s.epi, consumer, out_phase);  // the end of the walk, for the combine warp
    Probe::add(ph, kPhTotal, Probe::clock() - ph_start);
    if (wg_thread == 0) Probe::flush(consumer, ph);
    if (threadIdx.x % 32 == 0) LOOM_TRACE(kGemmEnd);
  }
};

}  // namespace loom::gemm
