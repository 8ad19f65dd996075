#include "gemm/gemm_fp8_resident_sm90.cuh"

#include <cuda.h>

#include <algorithm>
#include <string>

#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "common/tensor_map.hpp"
#include "gemm/expert_scan.cuh"
#include "gemm/promote_rows.cuh"
#include "gemm/ring_cursor.cuh"
#include "gemm/work_queue.cuh"
#include "contract/device_layout.hpp"
#include "ptx/barrier.cuh"
#include "ptx/cp_async.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/pdl.cuh"
#include "ptx/red.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"

namespace loom {

namespace {

constexpr int kBlockK = 128;        // K per weight stage and per token slot: one scale block
constexpr int kTileRows = 128;      // weight rows per tile: two consumer warpgroups of 64 (the MMA's M)
// Weight tiles in flight per SM. The token rows take most of the shared memory: 48 rows over all of
// K=2048 beside 5 stages. Measured on the experiment branch (docs/perf.md, twenty-eighth session):
// 6 and 8 stages (with K split into ranges to make room) ran as fast as each other, and splitting K
// cost more than the stages gave.
constexpr int kStages = 5;
constexpr int kThreads = 384;       // warpgroup 0: producers; 1, 2: consumers
constexpr int kConsumerWarps = 8;
constexpr int kGatherThreads = 64;  // producer warps 2 and 3
constexpr int kMaxChunkRows = 48;   // widest chunk (the MMA's N)
constexpr int kMaxKBlocks = 64;     // K <= 8192: one token slot (and its barriers) per K block
constexpr int kMaxUnitScales = 512; // a unit's weight scales (N/128 x K/128), in its record
constexpr int kWTileBytes = kTileRows * kBlockK;
constexpr int kStageStride = 64 + 4;  // floats per staged token: +4 spreads a warp's stores over the banks
constexpr int kMetaSlots = 2;         // unit records: the one in use and the next (the gather's)
// One sm_90 CTA's shared memory, less the 1 KiB the kernel's static shared memory shows (cuobjdump).
constexpr size_t kSmemLimit = 227 * 1024 - 1024;

static_assert(kWTileBytes % 1024 == 0, "128-byte-swizzled TMA tiles start on 1024-byte boundaries");
static_assert(kBlockK == 4 * 32, "four k32 MMAs per K block");
static_assert(kThreads == 3 * 128 && kConsumerWarps == 8, "one producer and two consumer warpgroups");
static_assert(kGatherThreads == 8 * 8, "8 threads per 128-byte row (16 bytes each), 8 rows per pass");
static_assert(kMaxChunkRows % 16 == 0 && kMaxChunkRows <= kGatherThreads, "widths in 16s; a scale per gather thread");
static_assert(kMaxChunkRows <= 128, "one bulk reduction per token by a thread of the consumer warpgroup");
static_assert(kStageStride * 4 % 16 == 0, "each staged token starts 16-byte aligned (bulk copies)");

struct UnitMeta {
  int32_t token[kMaxChunkRows];  // -1 past the chunk's rows
  float weight[kMaxChunkRows];
  float wscale[kMaxUnitScales];  // [weight block][K block]
  int32_t expert, rows, width;   // rows < 0: the end of the walk
};

struct alignas(1024) Smem {
  uint8_t w[kStages][kWTileBytes];
  float stage[2][kMaxChunkRows][kStageStride];  // per consumer warpgroup: top-k-weighted outputs by token
  UnitMeta meta[kMetaSlots];
  uint64_t full[kStages], empty[kStages];
  uint64_t tok_full[kMaxKBlocks];   // the gather threads' cp.async of the slot have landed
  uint64_t tok_empty[kMaxKBlocks];  // the consumers' last weight block has read the slot
  uint64_t meta_full[kMetaSlots], meta_empty[kMetaSlots];
  int32_t chunk_start[kGpuMaxExperts + 1];  // units of the experts before e (chunk_start[E]: all)
  int32_t expert_begin[kGpuMaxExperts];
  int32_t expert_rows[kGpuMaxExperts];
};
// After Smem: kblocks token slots of capacity x 128 bytes, then kblocks x capacity activation scales.
constexpr size_t kSmemFixed = sizeof(Smem) + 1024;  // + alignment slack for the 1024-byte base

struct Args {
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

using StageCursor = PipelineState<kStages>;
using MetaCursor = PipelineState<kMetaSlots>;

__device__ __forceinline__ uint8_t* token_slots(Smem& s) { return reinterpret_cast<uint8_t*>(&s + 1); }
__device__ __forceinline__ float* slot_scales(Smem& s, const Args& a) {
  return reinterpret_cast<float*>(token_slots(s) + size_t(a.kblocks) * a.capacity * kBlockK);
}

// chunk_start from the bins or offsets: ceil(rows / capacity) chunks per expert, scanned by warp 0.
__device__ __forceinline__ void build_chunk_starts(Smem& s, const Args& a) {
  for (int e = threadIdx.x; e < a.experts; e += blockDim.x) {
    const int begin = a.counts ? e * a.stride : __ldcg(a.offsets + e);
    const int rows = a.counts ? min(__ldcg(a.counts + e * kBinCountStride), a.stride) : __ldcg(a.offsets + e + 1) - begin;
    s.chunk_start[e + 1] = (rows + a.capacity - 1) / a.capacity;
    s.expert_begin[e] = begin;
    s.expert_rows[e] = rows;
  }
  __syncthreads();
  if (threadIdx.x < 32) scan_expert_counts(s.chunk_start, a.experts, threadIdx.x);
  __syncthreads();
}

// The expert of unit u: the last whose first unit is at or before u (an expert without rows shares
// its start with the next one).
__device__ __forceinline__ int unit_expert(const Smem& s, const Args& a, int u) {
  int lo = 0, hi = a.experts - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (s.chunk_start[mid] <= u) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// out[token, n0 .. n0 + 63] += top-k weight * final, by one bulk reduction per token from the
// warpgroup's staging block (a thread holds weight rows r, r + 8 of token columns c, c + 1). Red.v4
// from registers after a transpose across lanes cost 3 / 9 / 23 us more than no combine at
// T=512 / 1024 / 2048 (experiment branch). The block is rewritten only after the reductions issued
// from it have read it: each issuing thread waits for its own, then the warpgroup's barrier.
template <int W>
__device__ __forceinline__ void combine(Smem& s, const Args& a, const UnitMeta& m, const float (&final_acc)[W / 2],
                                        int n0, int consumer) {
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

// One unit's weight blocks on chunk width W (consumer warpgroup `consumer`).
template <int W>
__device__ __forceinline__ void consume_unit(Smem& s, const Args& a, const UnitMeta& m, StageCursor& st,
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
        ptx::mbar_wait(&s.tok_full[kb], unit_parity);
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
      // Every lane's reads of the stage (and, after the last weight block, of the slot) are done.
      __syncwarp();
      if (lane == 0) {
        ptx::mbar_arrive(&s.empty[st.stage]);
        if (last_block) ptx::mbar_arrive(&s.tok_empty[kb]);
      }
      st.advance();
      promote_columns<W>(final_acc, acc, sa);
    }
    combine<W>(s, a, m, final_acc, nb * kTileRows + consumer * 64, consumer);
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    gemm_fp8_resident_kernel(const __grid_constant__ CUtensorMap weights_map, const Args a) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t align_pad = (1024u - uint32_t(reinterpret_cast<uintptr_t>(smem_raw) % 1024u)) % 1024u;
  Smem& s = *reinterpret_cast<Smem*>(smem_raw + align_pad);
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      ptx::mbar_init(&s.full[i], 1);
      ptx::mbar_init(&s.empty[i], kConsumerWarps);
    }
    for (int kb = 0; kb < a.kblocks; ++kb) {
      ptx::mbar_init(&s.tok_full[kb], kGatherThreads);
      ptx::mbar_init(&s.tok_empty[kb], kConsumerWarps);
    }
    for (int i = 0; i < kMetaSlots; ++i) {
      ptx::mbar_init(&s.meta_full[i], 32);
      ptx::mbar_init(&s.meta_empty[i], kConsumerWarps + kGatherThreads / 32 + 1);  // + the weight thread
    }
    ptx::fence_mbar_init();
    ptx::prefetch_tensormap(&weights_map);
  }
  // Everything below reads what the routing and quantisation kernels wrote.
  ptx::pdl_wait();
  build_chunk_starts(s, a);  // its barriers also publish the mbarrier initialisation
  const int units = s.chunk_start[a.experts];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (warp == 0) {
    if (lane == 0) {
      // The weight stream: each unit's N/128 x K/128 tiles in the consumers' order, the units as
      // the records name them (the walk may be dynamic).
      StageCursor st;
      MetaCursor mc;
      const uint64_t evict_first = ptx::l2_policy_evict_first();
      while (true) {
        ptx::mbar_wait(&s.meta_full[mc.stage], mc.phase);
        const UnitMeta& m = s.meta[mc.stage];
        if (m.rows < 0) break;
        const int expert = m.expert;
        ptx::mbar_arrive(&s.meta_empty[mc.stage]);
        mc.advance();
        for (int nb = 0; nb < a.nblocks; ++nb)
          for (int kb = 0; kb < a.kblocks; ++kb) {
            ptx::mbar_wait(&s.empty[st.stage], st.phase ^ 1);
            ptx::mbar_arrive_expect_tx(&s.full[st.stage], kWTileBytes);
            const int w_row = expert * a.n + nb * kTileRows;
            if (a.weights_evict_first)
              ptx::tma_load_2d_hint(s.w[st.stage], &weights_map, kb * kBlockK, w_row, &s.full[st.stage], evict_first);
            else
              ptx::tma_load_2d(s.w[st.stage], &weights_map, kb * kBlockK, w_row, &s.full[st.stage]);
            st.advance();
          }
      }
    }
  } else if (warp == 1) {
    // Unit records, one unit ahead of the consumers; the queue's units fetched one unit ahead too.
    MetaCursor mc;
    for (int u = blockIdx.x;;) {
      ptx::mbar_wait(&s.meta_empty[mc.stage], mc.phase ^ 1);
      UnitMeta& m = s.meta[mc.stage];
      if (u >= units) {
        if (lane == 0) m.rows = -1;
      } else {
        const int e = unit_expert(s, a, u), chunk = u - s.chunk_start[e];
        const int chunks = s.chunk_start[e + 1] - s.chunk_start[e], expert_rows = s.expert_rows[e];
        const int per_chunk = (expert_rows + chunks - 1) / chunks;  // <= capacity
        const int row0 = chunk * per_chunk, rows = min(per_chunk, expert_rows - row0);
        const int width = (rows + 15) / 16 * 16;
        const int begin = s.expert_begin[e] + row0;
        for (int i = lane; i < width; i += 32) {
          m.token[i] = i < rows ? __ldcg(a.row_token + begin + i) : -1;
          m.weight[i] = i < rows ? __ldcg(a.row_weight + begin + i) : 0.0f;
        }
        const float* wscale = a.weight_scales + int64_t(e) * a.nblocks * a.kblocks;
        for (int i = lane; i < a.nblocks * a.kblocks; i += 32) m.wscale[i] = __ldg(wscale + i);
        if (lane == 0) {
          m.expert = e;
          m.rows = rows;
          m.width = width;
        }
      }
      ptx::mbar_arrive(&s.meta_full[mc.stage]);  // release: this lane's stores
      mc.advance();
      if (u >= units) break;
      u = a.queue == nullptr ? u + int(gridDim.x) : fetch_work_unit(a.queue, int(gridDim.x), lane);
    }
    if (a.queue != nullptr && lane == 0) leave_work_queue(a.queue);  // lane 0 made every fetch
  } else if (warp < 4) {
    // The gather: thread t copies 16-byte piece t % 8 of rows t / 8 + 8 i and the scale of row t,
    // slot by slot, each slot once the consumers are done with it.
    const int t = threadIdx.x - 64, piece = t % 8, row_lo = t / 8;
    float* const scales = slot_scales(s, a);
    uint8_t* const slots = token_slots(s);
    MetaCursor mc;
    uint32_t unit_parity = 0;
    while (true) {
      ptx::mbar_wait(&s.meta_full[mc.stage], mc.phase);
      const UnitMeta& m = s.meta[mc.stage];
      if (m.rows < 0) break;
      const int width = m.width;
      int src[kMaxChunkRows / 8];  // byte offset of this thread's piece in each of its rows' K block 0; -1: none
#pragma unroll
      for (int i = 0; i < kMaxChunkRows / 8; ++i) {
        const int r = row_lo + 8 * i, token = r < width ? m.token[r] : -1;
        src[i] = token >= 0 ? token * a.k + 16 * piece : -1;
      }
      const int scale_token = t < width ? m.token[t] : -1;
      __syncwarp();
      if (lane == 0) ptx::mbar_arrive(&s.meta_empty[mc.stage]);
      for (int kb = 0; kb < a.kblocks; ++kb) {
        ptx::mbar_wait(&s.tok_empty[kb], unit_parity ^ 1);
        uint8_t* slot = slots + size_t(kb) * a.capacity * kBlockK;
#pragma unroll
        for (int i = 0; i < kMaxChunkRows / 8; ++i) {
          const int r = row_lo + 8 * i;
          if (r < width) {
            const bool ok = src[i] >= 0;
            ptx::cp_async_16_zfill(ptx::smem_u32(slot + r * kBlockK + ((piece ^ (r % 8)) << 4)),
                                   ok ? a.x + src[i] + kb * kBlockK : a.x, ok ? 16u : 0u);
          }
        }
        if (t < width)
          ptx::cp_async_4_zfill(ptx::smem_u32(scales + kb * a.capacity + t),
                                scale_token >= 0 ? a.x_scales + int64_t(kb) * a.x_rows + scale_token : a.x_scales,
                                scale_token >= 0 ? 4u : 0u);
        ptx::cp_async_mbar_arrive_noinc(&s.tok_full[kb]);
      }
      unit_parity ^= 1;
      mc.advance();
    }
  } else {
    const int consumer = warp / 4 - 1;
    MetaCursor mc;
    StageCursor st;
    uint32_t unit_parity = 0;
    while (true) {
      ptx::mbar_wait(&s.meta_full[mc.stage], mc.phase);
      const UnitMeta& m = s.meta[mc.stage];
      if (m.rows < 0) break;
      static_assert(kMaxChunkRows == 48, "one consume_unit instantiation per width in 16s");
      switch (m.width) {
        case 16: consume_unit<16>(s, a, m, st, unit_parity, consumer); break;
        case 32: consume_unit<32>(s, a, m, st, unit_parity, consumer); break;
        default: consume_unit<48>(s, a, m, st, unit_parity, consumer); break;
      }
      __syncwarp();
      if (lane == 0) ptx::mbar_arrive(&s.meta_empty[mc.stage]);
      unit_parity ^= 1;
      mc.advance();
    }
    ptx::bulk_wait();  // this thread's reductions have completed, before the CTA exits
  }
  ptx::pdl_launch_dependents();
}

}  // namespace

int resident_rows_capacity(int64_t n, int64_t k) {
  if (n <= 0 || k <= 0 || k % kBlockK || k / kBlockK > kMaxKBlocks) return 0;
  const int64_t kblocks = k / kBlockK;
  if ((n + kTileRows - 1) / kTileRows * kblocks > kMaxUnitScales) return 0;
  const int64_t rows = int64_t(kSmemLimit - kSmemFixed) / (kblocks * (kBlockK + 4)) / 16 * 16;  // codes + scale
  return rows < 16 ? 0 : int(std::min<int64_t>(rows, kMaxChunkRows));
}

void launch_gemm_fp8_resident(const GemmFp8Params& p, const GemmFp8Config& cfg, const DeviceInfo& device,
                              cudaStream_t stream, bool pdl) {
  const std::string who = "fp8 GEMM (resident token rows): ";
  const int capacity = resident_rows_capacity(p.n, p.k);
  if (p.n <= 0 || p.n % 16 || capacity == 0)
    throw Error(who + "N must be a positive multiple of 16 and K a multiple of 128 whose 16 rows fit in shared memory "
                      "(K <= " + std::to_string(int64_t(kSmemLimit - kSmemFixed) / (16 * (kBlockK + 4)) * kBlockK) +
                ", N/128 x K/128 <= " + std::to_string(kMaxUnitScales) + "), got N=" + std::to_string(p.n) +
                ", K=" + std::to_string(p.k));
  if (p.experts <= 0 || p.experts > kGpuMaxExperts)
    throw Error(who + "experts must be in [1, " + std::to_string(kGpuMaxExperts) + "]");
  if (p.combine != CombineMode::atomic) throw Error(who + "atomic combine only");
  if (int64_t(p.experts) * p.n >= (int64_t(1) << 31) || p.x_rows <= 0 || p.x_rows * p.k >= (int64_t(1) << 31))
    throw Error(who + "sizes exceed the kernel's 32-bit coordinates");
  if (!p.weights || !p.weight_scales || !p.x || !p.x_scales || !(p.offsets || p.expert_counts) || !p.row_token ||
      !p.row_weight || !p.out)
    throw Error(who + "null device pointer");
  if (p.expert_counts && (p.expert_stride <= 0 || int64_t(p.experts) * p.expert_stride >= (int64_t(1) << 31)))
    throw Error(who + "expert bins need a positive stride with experts * stride below 2^31");
  if (reinterpret_cast<uintptr_t>(p.x) % 16 || reinterpret_cast<uintptr_t>(p.x_scales) % 4)
    throw Error(who + "the activation rows must be 16-byte aligned");
  if (cfg.x_source != XSource::gather_by_token || p.x_scale_layout != ScaleLayout::group_major)
    throw Error(who + "reads token-order rows (XSource::gather_by_token) with group-major scales");
  if (cfg.dynamic && !p.work_queue) throw Error(who + "the dynamic walk needs a work_queue");
  if (cfg.split_k != 1 || cfg.balanced || cfg.handoff_epilogue ||
      cfg.x_evict_first || cfg.x_evict_last || cfg.wide_tiles)
    throw Error(who + "takes none of the other kernels' options (its combine is always by bulk reductions): " +
                cfg.str());
  const int kblocks = p.k / kBlockK;
  Args a{p.x, p.x_scales, p.x_rows, p.weight_scales, p.offsets, p.expert_counts, p.expert_stride, p.row_token,
         p.row_weight, p.out, p.experts, p.n, p.k, (p.n + kTileRows - 1) / kTileRows, kblocks, capacity,
         cfg.weights_evict_first ? 1 : 0, cfg.dynamic ? p.work_queue : nullptr};
  const CUtensorMap map = make_tensor_map_2d(p.weights, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, uint64_t(p.experts) * p.n,
                                             p.k, p.k, kTileRows, kBlockK, TmaSwizzle::b128, TmaL2Promotion::b128);
  const size_t smem = kSmemFixed + size_t(kblocks) * capacity * (kBlockK + 4);
  ensure_dynamic_smem(gemm_fp8_resident_kernel, smem);
  // Persistent: one CTA per SM; the units are known only on the device.
  launch_kernel(gemm_fp8_resident_kernel, dim3(device.sm_count), dim3(kThreads), smem, stream, pdl, map, a);
}

}  // namespace loom
