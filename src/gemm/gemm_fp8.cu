// The FP8 grouped GEMM's host entry: checks what a config and its parameters ask of the kernels,
// builds the TMA descriptors and the kernel arguments, and launches the config's instance.
#include <cuda.h>

#include <algorithm>
#include <string>

#include "common/cuda_check.hpp"
#include "common/tensor_map.hpp"
#include "contract/device_layout.hpp"
#include "gemm/fast_divisor.hpp"
#include "gemm/gemm_fp8.hpp"
#include "gemm/instances/instances.cuh"

namespace loom {

namespace {
constexpr int kBlockK = kFp8BlockK, kBlockM = kFp8BlockRows, kMaxChunk = kWeightsOnMMaxChunk;
constexpr int kWidthCount = gemm::kWidthCount, kScaleAlign = gemm::kScaleAlign;
}  // namespace

namespace {

// The tokens-on-M kernels (tall and wide tiles): their checks, tensor map and arguments.
void launch_gemm_fp8_tokens_on_m(const GemmFp8Params& p, const GemmFp8Config& cfg, const DeviceInfo& device,
                                 cudaStream_t stream, bool pdl) {
  const gemm::TokensOnMLaunch l = gemm::make_tokens_on_m_launch(p, cfg);
  // Persistent: one CTA per SM; the row tiles are known only on the device.
  using namespace gemm;
  if (cfg.wide_tiles)
    launch_grouped_gemm<Sm90Fp8TmWide>(l.map, l.args, device.sm_count, launch_smem_bytes<Sm90Fp8TmWide>, stream, pdl);
  else
    launch_grouped_gemm<Sm90Fp8TmTall>(l.map, l.args, device.sm_count, launch_smem_bytes<Sm90Fp8TmTall>, stream, pdl);
}

void launch_gemm_fp8_resident(const GemmFp8Params& p, const GemmFp8Config& cfg, const DeviceInfo& device,
                              cudaStream_t stream, bool pdl) {
  namespace rs = gemm::resident;
  const std::string who = "fp8 GEMM (resident token rows): ";
  const int capacity = resident_rows_capacity(p.n, p.k);
  if (p.n <= 0 || p.n % 16 || capacity == 0)
    throw Error(who + "N must be a positive multiple of 16 and K a multiple of 128 whose 16 rows fit in shared memory "
                      "(K <= " + std::to_string(int64_t(rs::kSmemLimit - rs::kSmemFixed) / (16 * (rs::kBlockK + 4)) * rs::kBlockK) +
                ", N/128 x K/128 <= " + std::to_string(rs::kMaxUnitScales) + "), got N=" + std::to_string(p.n) +
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
  if (cfg.split_k != 1 || cfg.balanced || cfg.handoff_epilogue || cfg.x_evict_first || cfg.x_evict_last ||
      cfg.wide_tiles)
    throw Error(who + "takes none of the other kernels' options (its combine is always by bulk reductions): " +
                cfg.str());
  const int kblocks = p.k / rs::kBlockK;
  const gemm::ResidentArgs a{p.x, p.x_scales, p.x_rows, p.weight_scales, p.offsets, p.expert_counts,
                             p.expert_stride, p.row_token, p.row_weight, p.out, p.experts, p.n, p.k,
                             (p.n + rs::kTileRows - 1) / rs::kTileRows, kblocks, capacity, cfg.weights_evict_first ? 1 : 0,
                             cfg.dynamic ? p.work_queue : nullptr};
  const CUtensorMap map = make_tensor_map_2d(p.weights, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, uint64_t(p.experts) * p.n,
                                             p.k, p.k, rs::kTileRows, rs::kBlockK, TmaSwizzle::b128, TmaL2Promotion::b128);
  const size_t smem = rs::kSmemFixed + size_t(kblocks) * capacity * (rs::kBlockK + 4);
  // Persistent: one CTA per SM; the units are known only on the device.
  gemm::launch_grouped_gemm<gemm::Sm90Fp8WmResident>(map, a, device.sm_count, smem, stream, pdl);
}

}  // namespace

namespace gemm {

TokensOnMLaunch make_tokens_on_m_launch(const GemmFp8Params& p, const GemmFp8Config& cfg) {
  namespace tm = tokens_on_m;
  const std::string who = "fp8 GEMM (rows in registers): ";
  if (cfg.x_source != XSource::token_fragments) throw Error(who + "needs XSource::token_fragments");
  if (p.n <= 0 || p.k <= 0 || p.n % 16 || p.k % tm::kBlockK || p.k > tm::kMaxK)
    throw Error(who + "N must be a positive multiple of 16 and K a multiple of 128 up to " + std::to_string(tm::kMaxK) +
                " (got N=" + std::to_string(p.n) + ", K=" + std::to_string(p.k) + ")");
  if (p.experts <= 0 || p.experts > kGpuMaxExperts)
    throw Error(who + "experts must be in [1, " + std::to_string(kGpuMaxExperts) + "]");
  if (p.k < tm::kRing * tm::kBlockK)
    throw Error(who + "K must be at least " + std::to_string(tm::kRing * tm::kBlockK) + " (the activation ring), got " +
                std::to_string(p.k));
  if (cfg.wide_tiles && p.k % (2 * tm::kBlockK))
    throw Error(who + "wide tiles need K a multiple of " + std::to_string(2 * tm::kBlockK) + " (their ring of 2 does not "
                "rotate), got " + std::to_string(p.k));
  if (int64_t(p.experts) * p.n >= (int64_t(1) << 31) || p.x_rows <= 0 || p.x_rows * p.k >= (int64_t(1) << 31))
    throw Error(who + "sizes exceed the kernel's 32-bit coordinates");
  if (!p.weights || !p.weight_scales || !p.x || !p.x_scales || !(p.offsets || p.expert_counts) || !p.row_token ||
      !p.row_weight || !p.out)
    throw Error(who + "null device pointer");
  if (p.expert_counts && p.combine != CombineMode::atomic)
    throw Error(who + "expert bins hold no sorted row index for the store epilogue: atomic combine only");
  if (p.expert_counts && (p.expert_stride <= 0 || int64_t(p.experts) * p.expert_stride >= (int64_t(1) << 31)))
    throw Error(who + "expert bins need a positive stride with experts * stride below 2^31, got stride " +
                std::to_string(p.expert_stride));
  if (reinterpret_cast<uintptr_t>(p.x) % 16 || reinterpret_cast<uintptr_t>(p.x_scales) % 4)
    throw Error(who + "the activation rows must be 16-byte aligned");
  if (cfg.split_k != 1 || cfg.balanced || cfg.handoff_epilogue || cfg.x_evict_first)
    throw Error(who + "takes none of split-K, balanced shares, the hand-off epilogue or an activation eviction "
                      "hint: " + cfg.str());
  if (cfg.dynamic && !p.work_queue) throw Error(who + "the dynamic tail needs a work_queue");
  TokensOnMLaunch l;
  l.args = TokensOnMArgs{p.x, p.x_scales, p.x_rows, p.x_scale_layout == ScaleLayout::row_quads ? 1 : 0,
                         p.weight_scales, p.offsets, p.expert_counts, p.expert_stride, p.row_token, p.row_weight,
                         p.out, p.experts, p.n, p.k, (p.n + tm::kTileCols - 1) / tm::kTileCols, p.k / tm::kBlockK,
                         p.combine == CombineMode::atomic ? 1 : 0, cfg.weights_evict_first ? 1 : 0,
                         cfg.x_evict_last ? 1 : 0, cfg.dynamic ? p.work_queue : nullptr};
  // L2 fetches exactly the 128-byte line of each box row it misses on: widened to 256 bytes (the
  // usual promotion) the weight stream ran slower.
  l.map = make_tensor_map_2d(p.weights, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, uint64_t(p.experts) * p.n, p.k, p.k,
                             tm::kTileCols, tm::kBlockK, TmaSwizzle::b128, TmaL2Promotion::b128);
  return l;
}

}  // namespace gemm

int resident_rows_capacity(int64_t n, int64_t k) {
  namespace rs = gemm::resident;
  if (n <= 0 || k <= 0 || k % rs::kBlockK || k / rs::kBlockK > rs::kMaxKBlocks) return 0;
  const int64_t kblocks = k / rs::kBlockK;
  if ((n + rs::kTileRows - 1) / rs::kTileRows * kblocks > rs::kMaxUnitScales) return 0;
  const int64_t rows = int64_t(rs::kSmemLimit - rs::kSmemFixed) / (kblocks * (rs::kBlockK + 4)) / 16 * 16;  // codes + scale
  return rows < 16 ? 0 : int(std::min<int64_t>(rows, rs::kMaxChunkRows));
}

void launch_gemm_fp8(const GemmFp8Params& p, const GemmFp8Config& cfg, const DeviceInfo& device, cudaStream_t stream,
                     bool pdl) {
  if (cfg.x_source == XSource::token_fragments) return launch_gemm_fp8_tokens_on_m(p, cfg, device, stream, pdl);
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
  gemm::TensorMaps maps{};
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
  gemm::WeightsOnMArgs a{p.weights,
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
  // The enumerated instances (src/gemm/instances/): gathered batches (from offsets or early ids, or
  // from expert bins by the chunk walk), sorted rows with either epilogue.
  using namespace gemm;
  if (gather) {
    if (p.expert_counts)
      launch_grouped_gemm<Sm90Fp8WmBins>(maps, a, grid, launch_smem_bytes<Sm90Fp8WmBins>, stream, pdl);
    else if (p.early_ids)
      launch_grouped_gemm<Sm90Fp8WmGatherEarly>(maps, a, grid, launch_smem_bytes<Sm90Fp8WmGatherEarly>, stream, pdl);
    else
      launch_grouped_gemm<Sm90Fp8WmGather>(maps, a, grid, launch_smem_bytes<Sm90Fp8WmGather>, stream, pdl);
  } else if (cfg.handoff_epilogue) {
    launch_grouped_gemm<Sm90Fp8WmSortedHandoff>(maps, a, grid, launch_smem_bytes<Sm90Fp8WmSortedHandoff>, stream,
                                                pdl);
  } else {
    launch_grouped_gemm<Sm90Fp8WmSorted>(maps, a, grid, launch_smem_bytes<Sm90Fp8WmSorted>, stream, pdl);
  }
}

}  // namespace loom
