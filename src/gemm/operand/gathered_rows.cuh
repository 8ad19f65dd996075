// Token source: rows gathered by token. The chunk's activation rows are copied by cp.async straight
// from the token-order quantised rows (row_token gives each sorted row's token), so no sorted copy
// is written: small batches have one kernel before the GEMM, and from expert bins none but the
// routing. Chunks are at most kGatherMaxTokens rows (an expert with more rows takes several): the
// cp.async gather cannot keep the bytes of wider chunks in flight.
//
// All 128 producer threads gather, 16 bytes each per row pass (8 threads per 128-byte row, 16 rows
// a pass), into the 128-byte-swizzled layout a TMA would have produced (16-byte piece c of row r at
// r * 128 + (c ^ (r % 8)) * 16 in a 1024-byte-aligned tile); rows past the chunk and K past the end
// are zero-filled. Thread 0 also issues the weight tiles. Each thread's copies arrive on the
// stage's full barrier (cp.async.mbarrier.arrive.noinc), beside the weight tile's expect_tx.
//
// Warm-up (WeightsOnMConfig::warm_up, under PDL): before the PDL wait the producer runs its loop's
// first iteration dry, so that code is in the instruction caches when the wait ends (instruction
// fetch was half of the GEMM's stalls at T=1).
#pragma once

#include <cstdint>

#include "gemm/mainloop/fp8_weights_on_m.cuh"
#include "gemm/operand/sorted_rows.cuh"
#include "gemm/scheduler/expert_walk.cuh"
#include "ptx/barrier.cuh"
#include "ptx/cp_async.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/pdl.cuh"

namespace loom::gemm {

inline constexpr int kGatherBarrier = 3;  // named barrier of the producer warpgroup (0: __syncthreads, 1-2: consumers)
static_assert(kProducerThreads == 16 * (kBlockK / 16) && kMaxChunk <= kProducerThreads,
              "16 rows per gather pass; one scale per producer thread");

template <ExpertsFrom kFrom>
struct GatheredRows {
  static constexpr bool kGathered = true;
  static constexpr bool kQuads = false;
  static constexpr int kXRows = kGatherMaxTokens;  // its chunks are at most this wide: so are its stages
  static constexpr int kChunk = kGatherMaxTokens;
  static constexpr int kFullArrivals = 1 + kProducerThreads;  // thread 0's expect_tx, every thread's copies
  static_assert(kXRows == 32, "gathered chunks are the widths 16 and 32 only");

  template <int kStages>
  struct Storage {
    StageScales<kStages> scales;
    int32_t gather_token[kMaxChunk];  // token of each row of the chunk being loaded, -1 past its end
  };
  using ConsumerState = NoConsumerState;

  template <class S>
  static __device__ __forceinline__ void init(S&) {}
  static __device__ __forceinline__ int scale_shift(int) { return 0; }
  static __device__ __forceinline__ ScaleRead scale_read(const ConsumerState&, uint32_t stage, int, const Unit&) {
    return ScaleRead{stage, 0, false};
  }
  template <class S>
  static __device__ __forceinline__ void wait_scales(S&, const ScaleRead&) {}
  template <class S>
  static __device__ __forceinline__ float block_scale(const S& s, uint32_t buf, int col, int, int scale_shift) {
    return s.src.scales.xs[buf][scale_shift + col];
  }
  template <class S>
  static __device__ __forceinline__ void scale_done(S&, ConsumerState&, int, const Unit&) {}

  // Every producer thread. warm_up: run the loop's first iteration dry, then end_warm_up() (the PDL
  // wait and the walk, built by the producer warpgroup while the consumers wait for it) gives the
  // real unit count.
  template <class S, class P, class EndWarmUp>
  static __device__ __forceinline__ void produce(S& s, const P& p, bool warm_up, WorkCursor& work,
                                                 const EndWarmUp& end_warm_up) {
    const auto& a = p.a;
    constexpr bool early = kFrom == ExpertsFrom::early_ids;
    const int pt = threadIdx.x, piece = pt % (kBlockK / 16), pass_row = pt / (kBlockK / 16);
    WeightTiles weights(p.maps.w, a.weights_evict_first);
    PipelineState<S::kStages> ps;
    Unit unit;
    bool dry = warm_up;
    // The chunk walk (many short units per CTA): the walk's next unit, and the row token of this
    // thread for its first chunk, taken one unit ahead. The token's load is then in flight while
    // this unit streams, so the next unit's first stages do not wait for an L2 round trip before
    // their activation gather (not in the T <= 32 kernel, whose CTAs have 2-3 units: no gain there).
    constexpr bool kLookAhead = kFrom == ExpertsFrom::bins;
    bool ahead = false, next_has = false;
    Unit next_unit;
    int next_begin = 0, next_rows = 0, next_token = -1;
    while (true) {
      bool has_unit;
      int row_begin = 0, rows = 0, first_token = -1;
      if (kLookAhead && ahead) {
        has_unit = next_has, unit = next_unit, row_begin = next_begin, rows = next_rows, first_token = next_token;
      } else {
        has_unit = work.template next<kFrom>(s.walk, a, unit);
        if (has_unit) unit_rows<kFrom>(s.walk, a, unit, row_begin, rows);
      }
      if (dry) {
        // Warm-up: the code from the walk to here is now in the instruction caches. The unit and
        // its rows (stale shared memory, or offsets still being written) are not used. A CTA the
        // dry walk gives no unit ends it here too, so its consumers always get their walk.
        dry = false;
        work = WorkCursor(a, end_warm_up());
        continue;
      }
      if (!has_unit) break;
      if constexpr (kLookAhead) {
        if (!ahead) first_token = pt < min(kChunk, rows) ? __ldcg(a.row_token + row_begin + pt) : -1;
        next_has = work.template next<kFrom>(s.walk, a, next_unit);
        next_begin = next_rows = 0;
        if (next_has) unit_rows<kFrom>(s.walk, a, next_unit, next_begin, next_rows);
        next_token = next_has && pt < min(kChunk, next_rows) ? __ldcg(a.row_token + next_begin + pt) : -1;
        ahead = true;
      }
      const int e = unit.expert, nb = unit.nb;
      const int w_row = e * a.n + a.seg.first_row(nb);  // the unit's first weight row
#ifdef LOOM_CHAIN_TRACE
      if (pt == 0 && weights.first) LOOM_TRACE(kGemmFirstRows);
#endif
      for (int chunk = 0; chunk < rows; chunk += kChunk) {
        const int chunk_rows = min(kChunk, rows - chunk);
        const int wi = width_index(chunk_rows), width = 16 << wi;
        // The chunk's first weight tile does not need the row tokens: start it before their lookup.
        if (pt == 0) {
          ptx::mbar_wait(&s.empty[ps.stage], ps.phase ^ 1);
          ptx::mbar_arrive_expect_tx(&s.full[ps.stage], kWTileBytes);
          weights.load(s.w[ps.stage], unit.kb_begin, w_row, &s.full[ps.stage]);
        }
        if (early) ptx::pdl_wait();  // the row tokens and activations below (once per thread suffices)
        // Every thread has issued the previous chunk's copies (their addresses are taken at issue).
        ptx::named_barrier_sync(kGatherBarrier, kProducerThreads);
        s.src.gather_token[pt] = kLookAhead && chunk == 0 ? first_token
                             : pt < chunk_rows            ? __ldcg(a.row_token + row_begin + chunk + pt)
                                                          : -1;
        ptx::named_barrier_sync(kGatherBarrier, kProducerThreads);
        const int scale_token = s.src.gather_token[pt];
        for (int kb = unit.kb_begin; kb < unit.kb_end; ++kb) {
          ptx::mbar_wait(&s.empty[ps.stage], ps.phase ^ 1);
          if (pt == 0 && kb != unit.kb_begin) {
            ptx::mbar_arrive_expect_tx(&s.full[ps.stage], kWTileBytes);
            weights.load(s.w[ps.stage], kb, w_row, &s.full[ps.stage]);
          }
          const int kcol = kb * kBlockK + piece * 16;
          uint8_t* tile = s.x[ps.stage];
          for (int r = pass_row; r < width; r += kProducerThreads / (kBlockK / 16)) {
            const int token = s.src.gather_token[r];
            const bool ok = token >= 0 && kcol < a.k;
            const uint8_t* src = ok ? a.x + int64_t(token) * a.k + kcol : a.x;
            ptx::cp_async_16_zfill(ptx::smem_u32(tile + r * kBlockK + ((piece ^ (r % 8)) << 4)), src, ok ? 16u : 0u);
          }
          if (pt < width) {
            const float* src = scale_token >= 0 ? a.x_scales + int64_t(kb) * a.x_rows + scale_token : a.x_scales;
            ptx::cp_async_4_zfill(ptx::smem_u32(&s.src.scales.xs[ps.stage][pt]), src, scale_token >= 0 ? 4u : 0u);
          }
          ptx::cp_async_mbar_arrive_noinc(&s.full[ps.stage]);
          ps.advance();
        }
      }
    }
  }
};

}  // namespace loom::gemm
