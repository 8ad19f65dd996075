// The dispatch kernel. See dispatch_sm90.cuh for the contract; the layout it must reproduce is
// dispatch_ref (src/dispatch/dispatch_ref.cpp).
//
// Design (one CTA of 1024 threads = 32 warps per slice of routes):
//
//   Routes are cut into CTA slices of 1024 * steps consecutive routes, and each slice into 32 warp
//   ranges of 32 * steps routes (a warp handles `steps` steps of 32 routes; steps <= 4, so a warp
//   keeps all its ids and weights in registers from its first load to its last store).
//
//   With more than one CTA, a count kernel runs first: each of its CTAs counts one slice's routes
//   per expert (and its out-of-range ids) into a row of DispatchParams::slice_counts, with plain
//   stores (every cell every run: nothing to clear). The dispatch CTAs then read the other slices'
//   counts from there instead of each counting every route of the batch again (at T=8192, k=8 that
//   recount was most of the kernel's time on the chain trace).
//
//   Shared memory holds a count table of kRows = 34 rows x `window` experts (row stride odd, so
//   walking down a column touches distinct banks):
//     row 0        routes of this expert before this CTA's slice (other slices' counts)
//     row 1 + w    routes of this expert in warp w's range
//     row 33       routes of this expert after this CTA's slice
//   Read in expert-major, row-minor order, the exclusive scan of the table is exactly the stable
//   layout: the value at (e, 1 + w) is the first row of expert e taken by warp w, because every
//   route ordered before warp w's routes of expert e is either of a lower expert or of expert e
//   and earlier (row 0, warps < w). One block scan gives offsets[] and every warp's cursors.
//
//   The CTA stages its own rows in shared memory by *local* index (its own routes, expert-major)
//   and writes row_token / row_weight at the end, so the global stores of consecutive threads hit
//   consecutive rows (a single CTA writes them fully coalesced). The global row of a local index
//   is local + delta(e), delta(e) constant per expert (kept in row 0 once the scan is done).
//
// Phases per expert window (one window when E <= 1024):
//   1. each warp zeroes its own row; threads zero rows 0 and 33; __syncwarp
//   2. each warp counts its own routes into its row (shared atomics; it alone touches it)
//      [more than one CTA: __syncthreads; the threads add the other slices' counts into rows 0 / 33]
//   3. __syncthreads; block scan of the table (serial run per thread, warp shuffles, one exchange
//      of warp totals through shared memory: __syncthreads), written back as cursors / deltas
//   4. __syncthreads; each warp walks its steps in order: __match_any_sync groups the lanes of one
//      expert, popc of the lower lanes ranks them, the group leader reads and advances the warp's
//      cursor for that expert; rows go to the staging arrays, route_row straight to global.
//   After the last window: __syncthreads, then the staged rows are written out.
// Block barriers: 4 for one CTA and one window; several CTAs add 1 per window; each extra window
// adds 4 (its own 3, and one before re-zeroing the table).
#include "dispatch/dispatch_sm90.cuh"

#include <cstdint>
#include <limits>
#include <string>

#include "diag/chain_trace.cuh"
#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "loom/types.hpp"
#include "ptx/pdl.cuh"

namespace loom {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxSteps = 4;            // 32-route steps per warp in its CTA's slice
constexpr int kSliceUnit = kThreads;    // routes per CTA per step
constexpr int kWindow = 1024;           // most experts per pass
constexpr int kRows = kWarps + 2;       // before, warps 0..31, after
// Grow the slice (steps) before the CTA count passes this: every CTA reads all CTAs' slice counts.
constexpr int kMaxCtasBeforeSteps = 128;
constexpr int kLoadsInFlight = 8;  // per thread, reading the other slices' counts
constexpr unsigned kFull = 0xffffffffu;

struct Geometry {
  int steps = 0;    // 32-route steps per warp
  int capacity = 0; // staging rows per CTA: min(1024 * steps, T*k)
  int window = 0;   // experts per window
  int wpad = 0;     // window rounded up to 32
  int stride = 0;   // row stride of the count table: wpad + 1 (odd)
  int windows = 0;  // number of expert windows
};

__device__ __forceinline__ unsigned lanemask_lt() {
  unsigned m;
  asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
  return m;
}

// Per-expert counts of slice blockIdx.x's routes into row blockIdx.x of p.slice_counts (E + 1
// words: the experts, then the out-of-range ids).
__global__ void __launch_bounds__(kThreads) dispatch_count_kernel(const DispatchParams p, const Geometry g) {
  extern __shared__ int counts[];  // [E + 1]
  ptx::pdl_launch_dependents();  // the dispatch kernel waits for our completion before reading
  const int experts = p.experts;
  for (int e = int(threadIdx.x); e <= experts; e += kThreads) counts[e] = 0;
  __syncthreads();
  ptx::pdl_wait();  // the ids come from the previous kernel
  const unsigned routes = unsigned(p.tokens) * unsigned(p.topk), slice = unsigned(kSliceUnit * g.steps);
  const unsigned begin = blockIdx.x * slice, end = min(routes, begin + slice);
  for (unsigned r = begin + threadIdx.x; r < end; r += kThreads) {
    const unsigned e = unsigned(p.topk_ids[r]);
    atomicAdd(&counts[e < unsigned(experts) ? e : unsigned(experts)], 1);
  }
  __syncthreads();
  int32_t* row = p.slice_counts + int64_t(blockIdx.x) * (experts + 1);
  for (int e = int(threadIdx.x); e <= experts; e += kThreads) row[e] = counts[e];
}

// Adds the other slices' counts of window experts [e0, e0 + width) into `before` (slices below
// this CTA's) and `after` (slices above): kThreads / wpad threads (>= 1) sum each expert's column,
// coalesced across experts, then add their sums in with one shared atomic each.
__device__ __forceinline__ void add_other_slices(const DispatchParams& p, int* before, int* after, unsigned e0,
                                                 unsigned width, int wpad) {
  const int parts = max(1, kThreads / wpad);
  const int e = int(threadIdx.x) % wpad, part = int(threadIdx.x) / wpad;
  if (part >= parts || unsigned(e) >= width) return;
  const int64_t stride = p.experts + 1;
  const int self = int(blockIdx.x), ctas = int(gridDim.x);
  int b = 0, a = 0;
  // kLoadsInFlight independent loads per batch: the column is read from L2, and one load at a time
  // would put a round trip per slice on the critical path.
  for (int c0 = part; c0 < ctas; c0 += kLoadsInFlight * parts) {
    int v[kLoadsInFlight];
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const int c = c0 + u * parts;
      v[u] = c < ctas ? p.slice_counts[int64_t(c) * stride + e0 + unsigned(e)] : 0;
    }
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const int c = c0 + u * parts;
      b += c < self ? v[u] : 0;
      a += c > self ? v[u] : 0;
    }
  }
  if (b) atomicAdd(&before[e], b);
  if (a) atomicAdd(&after[e], a);
}

__global__ void __launch_bounds__(kThreads, 1) dispatch_kernel(const DispatchParams p, const Geometry g) {
  extern __shared__ __align__(16) int smem[];
  __shared__ int warp_total_g[kWarps], warp_total_l[kWarps], warp_drop[kWarps], warp_nan[kWarps];

  int* const table = smem;                               // [kRows][stride]
  int* const s_row = table + kRows * g.stride;           // [capacity] global row of each local row
  int* const s_token = s_row + g.capacity;               // [capacity]
  float* const s_weight = reinterpret_cast<float*>(s_token + g.capacity);  // [capacity]

  // Our outputs are only read by kernels that wait for our completion (pdl_wait), so the next
  // kernel may start launching now.
  if (threadIdx.x == 0) LOOM_TRACE(kDispatchStart);
  ptx::pdl_launch_dependents();
  ptx::pdl_wait();  // before the first global access: the ids come from the previous kernel
  if (threadIdx.x == 0) LOOM_TRACE(kDispatchWaited);

  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  const unsigned experts = unsigned(p.experts), topk = unsigned(p.topk);
  const unsigned routes = unsigned(p.tokens) * topk;  // < 2^31
  const unsigned slice = unsigned(kSliceUnit * g.steps);
  const unsigned cta_begin = blockIdx.x * slice;
  const unsigned cta_end = min(routes, cta_begin + slice);
  const unsigned warp_begin = cta_begin + unsigned(warp * 32 * g.steps);
  const unsigned warp_end = min(cta_end, warp_begin + unsigned(32 * g.steps));  // may be < warp_begin
  const bool lead = blockIdx.x == 0;  // writes offsets and status
  const bool several = gridDim.x > 1;

  // This warp's routes: ids and weights stay in registers for the whole kernel.
  int id[kMaxSteps];
  float wt[kMaxSteps];
#pragma unroll
  for (int s = 0; s < kMaxSteps; ++s) {
    const unsigned r = warp_begin + unsigned(s * 32 + lane);
    id[s] = -1;
    wt[s] = 0.0f;
    if (s < g.steps && r < warp_end) {
      id[s] = p.topk_ids[r];
      wt[s] = p.topk_weights[r];
    }
  }

  // NaN flags (lead CTA): loaded while the ids are in flight, one global round trip for both.
  {
    unsigned nan = 0;
    if (lead && p.nan_flags) {
      for (unsigned t = threadIdx.x; t < unsigned(p.tokens); t += kThreads) nan += p.nan_flags[t] != 0;
    }
    nan = __reduce_add_sync(kFull, nan);
    if (lane == 0) warp_nan[warp] = int(nan);  // read after window 0's scan barrier
  }

  int* const own_row = table + (warp + 1) * g.stride;
  int* const before_row = table;                       // becomes delta(e) after the scan
  int* const after_row = table + (kRows - 1) * g.stride;
  int carried_g = 0, carried_l = 0;  // rows of earlier windows: all CTAs / this CTA

  for (int win = 0; win < g.windows; ++win) {
    const unsigned e0 = unsigned(win * g.window);
    const unsigned width = min(unsigned(g.window), experts - e0);

    // 1. Zero the table: each warp its own row, all threads rows 0 and 33 (they stay zero with one
    // CTA; with several, a barrier below orders this before the counting into them). In a later
    // window, the previous window's scatter may still be reading row 0: barrier first.
    if (win > 0) __syncthreads();
    for (int e = lane; e < g.wpad; e += 32) own_row[e] = 0;
    for (int i = int(threadIdx.x); i < 2 * g.wpad; i += kThreads) {
      if (i < g.wpad)
        before_row[i] = 0;
      else
        after_row[i - g.wpad] = 0;
    }
    __syncwarp();

    // 2. Counts: own routes into the warp's row, the rest of the batch into rows 0 / 33.
    int drop = 0;
#pragma unroll
    for (int s = 0; s < kMaxSteps; ++s) {
      const unsigned r = warp_begin + unsigned(s * 32 + lane);
      if (s < g.steps && r < warp_end) {
        const unsigned e = unsigned(id[s]) - e0;
        if (e < width) atomicAdd(&own_row[e], 1);
        if (win == 0 && unsigned(id[s]) >= experts) ++drop;
      }
    }
    if (several) {
      __syncthreads();  // rows 0 and 33 are zero before any thread adds to them
      if (threadIdx.x == 0) LOOM_TRACE(kDispatchCounted);
      add_other_slices(p, before_row, after_row, e0, width, g.wpad);
      // The lead CTA also counts the other slices' out-of-range ids.
      if (win == 0 && lead)
        for (int c = int(threadIdx.x) + 1; c < int(gridDim.x); c += kThreads)
          drop += p.slice_counts[int64_t(c) * (experts + 1) + experts];
    }
    if (win == 0) {
      drop = int(__reduce_add_sync(kFull, unsigned(drop)));
      if (lane == 0) warp_drop[warp] = drop;
    }
    __syncthreads();
    if (threadIdx.x == 0) LOOM_TRACE(kDispatchSlices);

    // 3. Exclusive scan of the table in (expert, row) order, two sums at once: g over all rows
    // (global rows), l over the warp rows only (this CTA's local rows).
    const int items = kRows * g.wpad;
    const int per_thread = (items + kThreads - 1) / kThreads;
    const int i0 = min(items, int(threadIdx.x) * per_thread);
    const int i1 = min(items, i0 + per_thread);
    int sum_g = 0, sum_l = 0;
    {
      int e = i0 / kRows, row = i0 % kRows;
      for (int i = i0; i < i1; ++i) {
        const int v = table[row * g.stride + e];
        sum_g += v;
        if (row >= 1 && row <= kWarps) sum_l += v;
        if (++row == kRows) {
          row = 0;
          ++e;
        }
      }
    }
    int inc_g = sum_g, inc_l = sum_l;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int a = __shfl_up_sync(kFull, inc_g, d), b = __shfl_up_sync(kFull, inc_l, d);
      if (lane >= d) {
        inc_g += a;
        inc_l += b;
      }
    }
    if (lane == 31) {
      warp_total_g[warp] = inc_g;
      warp_total_l[warp] = inc_l;
    }
    __syncthreads();
    const int tg = warp_total_g[lane], tl = warp_total_l[lane];
    int wg = tg, wl = tl;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int a = __shfl_up_sync(kFull, wg, d), b = __shfl_up_sync(kFull, wl, d);
      if (lane >= d) {
        wg += a;
        wl += b;
      }
    }
    const int warp_excl_g = __shfl_sync(kFull, wg - tg, warp), warp_excl_l = __shfl_sync(kFull, wl - tl, warp);
    const int window_g = __shfl_sync(kFull, wg, 31), window_l = __shfl_sync(kFull, wl, 31);
    {
      int run_g = carried_g + warp_excl_g + inc_g - sum_g;
      int run_l = carried_l + warp_excl_l + inc_l - sum_l;
      int e = i0 / kRows, row = i0 % kRows;
      for (int i = i0; i < i1; ++i) {
        int* const cell = &table[row * g.stride + e];
        const int v = *cell;
        if (row == 0) {
          if (lead && unsigned(e) < width) p.offsets[e0 + unsigned(e)] = run_g;
          *cell = run_g + v - run_l;  // delta(e): global row - local row, for every warp
        } else if (row <= kWarps) {
          *cell = run_l;  // first local row of expert e taken by warp row - 1
          run_l += v;
        }
        run_g += v;
        if (++row == kRows) {
          row = 0;
          ++e;
        }
      }
    }
    carried_g += window_g;
    carried_l += window_l;
    if (lead && threadIdx.x == 0 && win == g.windows - 1) p.offsets[experts] = carried_g;
    if (lead && win == 0 && warp == 0) {
      const unsigned drops = __reduce_add_sync(kFull, unsigned(warp_drop[lane]));
      const unsigned nans = __reduce_add_sync(kFull, unsigned(warp_nan[lane]));
      if (lane == 0) {
        p.status->nan_tokens = nans;
        p.status->dropped_routes = drops;
        p.status->reserved[0] = 0;
        p.status->reserved[1] = 0;
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) LOOM_TRACE(kDispatchScanned);

    // 4. Rows, in route order within the warp: groups of equal experts per step, ranked by lane.
#pragma unroll
    for (int s = 0; s < kMaxSteps; ++s) {
      const unsigned step_begin = warp_begin + unsigned(s * 32);
      if (s >= g.steps || step_begin >= warp_end) break;  // warp-uniform
      const unsigned r = step_begin + unsigned(lane);
      const bool in = r < warp_end;
      const unsigned e = unsigned(id[s]) - e0;
      const bool ok = in && e < width;
      const unsigned group = __match_any_sync(kFull, ok ? e : 0xffffffffu);
      const int leader = __ffs(group) - 1;
      int cursor = 0;
      if (ok && lane == leader) cursor = own_row[e];
      cursor = __shfl_sync(kFull, cursor, leader);
      if (ok && lane == leader) own_row[e] = cursor + __popc(group);
      __syncwarp();  // the next step's leader of this expert may be another lane
      if (ok) {
        const int local = cursor + __popc(group & lanemask_lt());
        const int row = before_row[e] + local;
        s_row[local] = row;
        s_token[local] = int(r / topk);
        s_weight[local] = wt[s];
        p.route_row[r] = row;
      } else if (in && win == 0 && unsigned(id[s]) >= experts) {
        p.route_row[r] = -1;
      }
    }
  }

  // 5. This CTA's rows, in local order: consecutive threads store consecutive global rows within
  // each (expert) run; with one CTA, local rows are the global rows.
  __syncthreads();
  if (threadIdx.x == 0) LOOM_TRACE(kDispatchScattered);
  for (int i = int(threadIdx.x); i < carried_l; i += kThreads) {
    const int row = s_row[i];
    p.row_token[row] = s_token[i];
    p.row_weight[row] = s_weight[i];
  }
  if (threadIdx.x == 0) LOOM_TRACE(kDispatchEnd);
}

struct Plan {
  DispatchLaunch launch;
  Geometry geometry;
};

Plan make_plan(int64_t tokens, int64_t topk, int64_t experts) {
  constexpr int64_t kMaxRoutes = std::numeric_limits<int32_t>::max();
  if (tokens < 0) throw Error("dispatch: tokens must be >= 0, got " + std::to_string(tokens));
  if (topk <= 0) throw Error("dispatch: topk must be positive, got " + std::to_string(topk));
  if (experts <= 0 || experts > kMaxExperts)
    throw Error("dispatch: experts = " + std::to_string(experts) + " must be in [1, " + std::to_string(kMaxExperts) +
                "]");
  if (tokens > kMaxRoutes / topk)
    throw Error("dispatch: tokens * topk = " + std::to_string(tokens) + " * " + std::to_string(topk) +
                " does not fit in int32");
  const int64_t routes = tokens * topk;
  Plan plan;
  Geometry& g = plan.geometry;
  DispatchLaunch& l = plan.launch;
  g.windows = int((experts + kWindow - 1) / kWindow);
  g.window = int((experts + g.windows - 1) / g.windows);
  g.wpad = (g.window + 31) / 32 * 32;
  g.stride = g.wpad + 1;
  const int64_t per_step = int64_t(kSliceUnit) * kMaxCtasBeforeSteps;
  g.steps = int(std::min<int64_t>(kMaxSteps, std::max<int64_t>(1, (routes + per_step - 1) / per_step)));
  const int64_t slice = int64_t(kSliceUnit) * g.steps;
  g.capacity = int(std::min<int64_t>(slice, routes));
  l.ctas = int((routes + slice - 1) / slice);
  l.threads = kThreads;
  l.steps = g.steps;
  l.windows = g.windows;
  l.window = g.window;
  l.smem_bytes = size_t(kRows * g.stride + 3 * g.capacity) * sizeof(int32_t);
  l.slice_count_words = l.ctas > 1 ? size_t(l.ctas) * size_t(experts + 1) : 0;
  return plan;
}

}  // namespace

DispatchLaunch dispatch_launch_shape(int64_t tokens, int64_t topk, int64_t experts) {
  return make_plan(tokens, topk, experts).launch;
}

size_t dispatch_slice_count_bytes(int64_t max_tokens, int64_t topk, int64_t experts) {
  // The CTA count grows with T up to kMaxCtasBeforeSteps (one step), drops when the slices grow to
  // two steps, and passes it again only with four: the largest over T <= max_tokens is the larger
  // of max_tokens' own and min(kMaxCtasBeforeSteps, ceil(routes / kSliceUnit)).
  const DispatchLaunch at_max = make_plan(max_tokens, topk, experts).launch;
  const int64_t one_step = std::min<int64_t>(kMaxCtasBeforeSteps, (max_tokens * topk + kSliceUnit - 1) / kSliceUnit);
  const int64_t ctas = std::max<int64_t>(at_max.ctas, one_step);
  return ctas > 1 ? size_t(ctas) * size_t(experts + 1) * sizeof(int32_t) : 0;
}

void launch_dispatch(const DispatchParams& p, cudaStream_t stream, bool pdl) {
  const Plan plan = make_plan(p.tokens, p.topk, p.experts);
  if (p.tokens == 0) return;
  if (!p.topk_ids || !p.topk_weights || !p.offsets || !p.route_row || !p.row_token || !p.row_weight || !p.status)
    throw Error("dispatch: a required pointer is null (all but nan_flags are required)");
  if (plan.launch.ctas > 1) {
    if (!p.slice_counts)
      throw Error("dispatch: " + std::to_string(plan.launch.ctas) +
                  " CTAs need DispatchParams::slice_counts (dispatch_launch_shape().slice_count_words words)");
    launch_kernel(dispatch_count_kernel, dim3(unsigned(plan.launch.ctas)), dim3(unsigned(kThreads)),
                  size_t(p.experts + 1) * sizeof(int32_t), stream, pdl, p, plan.geometry);
  }
  ensure_dynamic_smem(dispatch_kernel, plan.launch.smem_bytes);
  launch_kernel(dispatch_kernel, dim3(unsigned(plan.launch.ctas)), dim3(unsigned(plan.launch.threads)),
                plan.launch.smem_bytes, stream, pdl, p, plan.geometry);
}

}  // namespace loom
