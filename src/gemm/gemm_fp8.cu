// The FP8 grouped GEMM's host entry: checks what a config and its parameters ask of the kernels,
// builds the TMA descriptors and the kernel arguments, and launches the config's instance.
#include <cuda.h>

#include <algorithm>
#include <string>
#include <variant>

#include "common/cuda_check.hpp"
#include "common/tensor_map.hpp"
#include "contract/device_layout.hpp"
#include "gemm/fast_divisor.hpp"
#include "gemm/gemm_fp8.hpp"
#include "gemm/instances/instances.cuh"

namespace loom {

namespace {
constexpr int kBlockK = kFp8BlockK, kBlockM = kFp8BlockRows;
constexpr int kWidthCount = gemm::kWidthCount, kScaleAlign = gemm::kScaleAlign;

// What every config asks of its parameters: the combine it writes, the scale layout it reads, its
// work queue; and what every kernel asks: experts within the tables, the pointers, the bins' stride.
void check_config_against_params(const GemmFp8Params& p, const GemmConfig& cfg, const std::string& who) {
  // The SiLU*up epilogue writes the intermediate (GemmFp8Params::act), neither out nor a combine.
  const auto* tm = std::get_if<TokensOnMConfig>(&cfg);
  const bool act = tm && tm->act;
  if (!act && combine_stores_rows(cfg) != (p.combine == CombineMode::store))
    throw Error(who + key(cfg) + (combine_stores_rows(cfg) ? " stores route rows" : " reduces into the output") +
                "; GemmFp8Params::combine says otherwise");
  // (The tokens-on-M kernels read either layout: row quads where the pipeline runs them.)
  if (p.x_scale_layout != scale_layout(cfg) && !std::holds_alternative<TokensOnMConfig>(cfg))
    throw Error(who + key(cfg) + " reads activation scales " +
                (scale_layout(cfg) == ScaleLayout::row_quads ? "in row quads" : "group-major") +
                "; GemmFp8Params::x_scale_layout says otherwise");
  if (uses_work_queue(cfg) && !p.work_queue) throw Error(who + key(cfg) + " takes units from a work queue: none given");
  if (p.experts <= 0 || p.experts > kGpuMaxExperts)
    throw Error(who + "experts must be in [1, " + std::to_string(kGpuMaxExperts) + "]");
  if (!p.weights || !p.weight_scales || !p.x || !p.x_scales || !(p.offsets || p.expert_counts) || !p.row_token ||
      (!p.out && !act))
    throw Error(who + "null device pointer");
  if (p.expert_counts && (p.expert_stride <= 0 || int64_t(p.experts) * p.expert_stride >= (int64_t(1) << 31)))
    throw Error(who + "expert bins need a positive stride with experts * stride below 2^31, got stride " +
                std::to_string(p.expert_stride));
  if (p.segment_rows < 0 || (p.segment_rows > 0 && (p.segment_rows % 16 || p.n % p.segment_rows)))
    throw Error(who + "segment_rows must be 0 or a multiple of 16 that divides N, got " +
                std::to_string(p.segment_rows) + " (N=" + std::to_string(p.n) + ")");
  if (p.prewait_prefetch_bytes < 0) throw Error(who + "prewait_prefetch_bytes must not be negative");
  if (p.store_bf16 && (p.combine != CombineMode::store || fused_act(cfg)))
    throw Error(who + key(cfg) + ": store_bf16 is for configs that store route rows");
  if (p.reduce_rows && (p.combine != CombineMode::atomic || !std::holds_alternative<WeightsOnMConfig>(cfg)))
    throw Error(who + key(cfg) + ": reduce_rows is for weights-on-M configs that reduce");
  if ((p.prewait_prefetch_bytes > 0 || p.walk_inputs_ready) && !std::holds_alternative<WeightsOnMConfig>(cfg))
    throw Error(who + key(cfg) + ": the pre-wait weight prefetch is the weights-on-M kernels' only");
  // The resident-rows kernel cuts N into plain 128-row blocks.
  if (std::holds_alternative<ResidentConfig>(cfg) && p.segment_rows > 0 && p.segment_rows % kBlockM)
    throw Error(who + key(cfg) + " cuts N into plain 128-row blocks: segment_rows must be a multiple of 128, got " +
                std::to_string(p.segment_rows));
}

// N's segments (GemmFp8Params::segment_rows) and its 128-row blocks over all segments.
WeightSegments segments_of(const GemmFp8Params& p) { return WeightSegments::of(p.segment_rows > 0 ? p.segment_rows : p.n); }
int weight_blocks(const GemmFp8Params& p) {
  const WeightSegments s = segments_of(p);
  return p.n / s.rows * s.blocks;
}

// The tokens-on-M kernels (tall and wide tiles): their checks, tensor map and arguments.
void launch_gemm_fp8_tokens_on_m(const GemmFp8Params& p, const TokensOnMConfig& cfg, const DeviceInfo& device,
                                 cudaStream_t stream, bool pdl) {
  const gemm::TokensOnMLaunch l = gemm::make_tokens_on_m_launch(p, cfg);
  // Persistent: one CTA per SM; the row tiles are known only on the device.
  using namespace gemm;
  if (cfg.act)
    launch_grouped_gemm<Sm90Fp8TmWideAct>(l.map, l.args, device.sm_count, launch_smem_bytes<Sm90Fp8TmWideAct>, stream,
                                          pdl);
  else if (cfg.wide && cfg.sorted)
    launch_grouped_gemm<Sm90Fp8TmWideSorted>(l.map, l.args, device.sm_count, launch_smem_bytes<Sm90Fp8TmWideSorted>,
                                             stream, pdl);
  else if (cfg.sorted)
    launch_grouped_gemm<Sm90Fp8TmTallSorted>(l.map, l.args, device.sm_count, launch_smem_bytes<Sm90Fp8TmTallSorted>,
                                             stream, pdl);
  else if (cfg.wide)
    launch_grouped_gemm<Sm90Fp8TmWide>(l.map, l.args, device.sm_count, launch_smem_bytes<Sm90Fp8TmWide>, stream, pdl);
  else
    launch_grouped_gemm<Sm90Fp8TmTall>(l.map, l.args, device.sm_count, launch_smem_bytes<Sm90Fp8TmTall>, stream, pdl);
}

void launch_gemm_fp8_resident(const GemmFp8Params& p, const ResidentConfig& cfg, const DeviceInfo& device,
                              cudaStream_t stream, bool pdl) {
  namespace rs = gemm::resident;
  static const std::string who = "fp8 GEMM (resident token rows): ";
  const int capacity = resident_rows_capacity(p.n, p.k);
  if (p.n <= 0 || p.n % 16 || capacity == 0)
    throw Error(who + "N must be a positive multiple of 16 and K a multiple of 128 whose 16 rows fit in shared memory "
                      "(K <= " + std::to_string(int64_t(rs::kSmemLimit - rs::kSmemFixed) / (16 * (rs::kBlockK + 4)) * rs::kBlockK) +
                ", N/128 x K/128 <= " + std::to_string(rs::kMaxUnitScales) + "), got N=" + std::to_string(p.n) +
                ", K=" + std::to_string(p.k));
  check_config_against_params(p, GemmConfig(cfg), who);
  if (int64_t(p.experts) * p.n >= (int64_t(1) << 31) || p.x_rows <= 0 || p.x_rows * p.k >= (int64_t(1) << 31))
    throw Error(who + "sizes exceed the kernel's 32-bit coordinates");
  if (reinterpret_cast<uintptr_t>(p.x) % 16 || reinterpret_cast<uintptr_t>(p.x_scales) % 4)
    throw Error(who + "the activation rows must be 16-byte aligned");
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

TokensOnMLaunch make_tokens_on_m_launch(const GemmFp8Params& p, const TokensOnMConfig& cfg) {
  namespace tm = tokens_on_m;
  static const std::string who = "fp8 GEMM (tokens on M): ";
  if (p.n <= 0 || p.k <= 0 || p.n % 16 || p.k % tm::kBlockK || p.k > tm::kMaxK)
    throw Error(who + "N must be a positive multiple of 16 and K a multiple of 128 up to " + std::to_string(tm::kMaxK) +
                " (got N=" + std::to_string(p.n) + ", K=" + std::to_string(p.k) + ")");
  if (p.k < tm::kRing * tm::kBlockK)
    throw Error(who + "K must be at least " + std::to_string(tm::kRing * tm::kBlockK) + " (the activation ring), got " +
                std::to_string(p.k));
  if (cfg.wide && p.k % (2 * tm::kBlockK))
    throw Error(who + "wide tiles need K a multiple of " + std::to_string(2 * tm::kBlockK) + " (their ring of 2 does not "
                "rotate), got " + std::to_string(p.k));
  if (int64_t(p.experts) * p.n >= (int64_t(1) << 31) || p.x_rows <= 0 || p.x_rows * p.k >= (int64_t(1) << 31))
    throw Error(who + "sizes exceed the kernel's 32-bit coordinates");
  if (p.expert_counts && p.combine != CombineMode::atomic)
    throw Error(who + "expert bins hold no sorted row index for the store epilogue: atomic combine only");
  if (cfg.sorted && (p.expert_counts || !p.offsets))
    throw Error(who + key(cfg) + " reads A by sorted row: the rows come from offsets, not expert bins");
  if (cfg.sorted && p.x_rows % 4)
    throw Error(who + "sorted activation rows must be padded to a multiple of 4, got " + std::to_string(p.x_rows));
  if (reinterpret_cast<uintptr_t>(p.x) % 16 || reinterpret_cast<uintptr_t>(p.x_scales) % 4)
    throw Error(who + "the activation rows must be 16-byte aligned");
  check_config_against_params(p, GemmConfig(cfg), who);
  TokensOnMLaunch l;
  static_cast<TokensOnMArgs&>(l.args) = TokensOnMArgs{p.x, p.x_scales, p.x_rows, p.x_scale_layout == ScaleLayout::row_quads ? 1 : 0,
                         p.weight_scales, p.offsets, p.expert_counts, p.expert_stride, p.row_token, p.row_weight,
                         p.out, p.experts, p.n, p.k, weight_blocks(p), p.k / tm::kBlockK,
                         p.combine == CombineMode::atomic ? 1 : 0, cfg.weights_evict_first ? 1 : 0,
                         cfg.x_evict_last ? 1 : 0, cfg.dynamic ? p.work_queue : nullptr, segments_of(p),
                         p.store_bf16 ? 1 : 0};
  if (cfg.act) {
    const GemmFp8Params::Intermediate& m = p.act;
    const int64_t blocks = (int64_t(m.inter) + tm::kTileCols - 1) / tm::kTileCols;
    if (m.inter <= 0 || m.inter % 16 || p.n != 2 * m.inter)
      throw Error(who + key(cfg) + " runs w13: N = 2 inter with inter a positive multiple of 16, got N=" +
                  std::to_string(p.n) + ", inter=" + std::to_string(m.inter));
    if (!m.codes || !m.scales || m.rows <= 0 || m.rows % 4 || !p.offsets || p.expert_counts)
      throw Error(who + key(cfg) + " writes the intermediate's sorted rows: codes, scales, padded rows (a multiple "
                  "of 4) and offsets needed");
    if (m.fragment_order && m.inter % tm::kTileCols)
      throw Error(who + "the intermediate in fragment order takes inter a multiple of 128");
    if (reinterpret_cast<uintptr_t>(m.codes) % 16 || (m.values && reinterpret_cast<uintptr_t>(m.values) % 8))
      throw Error(who + "the intermediate's codes must be 16-byte and its values 8-byte aligned");
    l.args.nblocks = int(2 * blocks);  // w13's scales: the gate segment's blocks, then the up segment's
    l.args.seg = WeightSegments::of(m.inter);
    l.args.atomic = 0;
    l.args.act_codes = m.codes;
    l.args.act_scales = m.scales;
    l.args.act_values = m.values;
    l.args.act_rows = m.rows;
    l.args.act_quads = m.scale_layout == ScaleLayout::row_quads ? 1 : 0;
    l.args.act_fragments = m.fragment_order ? 1 : 0;
    l.args.inter = m.inter;
    l.args.inter_blocks = int(blocks);
  }
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

namespace {

// The weights-on-M kernels (src/gemm/instances/sm90_fp8_wm_*.cu).
void launch_gemm_fp8_weights_on_m(const GemmFp8Params& p, const WeightsOnMConfig& cfg, const DeviceInfo& device,
                                  cudaStream_t stream, bool pdl) {
  static const std::string who = "fp8 GEMM (weights on M): ";
  if (p.n <= 0 || p.k <= 0 || p.n % 16 || p.k % 16)
    throw Error(who + "N and K must be positive multiples of 16 (got N=" + std::to_string(p.n) +
                ", K=" + std::to_string(p.k) + ")");
  if (int64_t(p.experts) * p.n >= (int64_t(1) << 31) || p.x_rows <= 0 || p.x_rows >= (int64_t(1) << 31))
    throw Error(who + "sizes exceed the kernel's 32-bit coordinates");
  if (reinterpret_cast<uintptr_t>(p.x) % 16 || reinterpret_cast<uintptr_t>(p.x_scales) % 16)
    throw Error(who + "the activation rows and scales must be 16-byte aligned");
  const bool sorted = cfg.rows == WmRows::sorted, bins = cfg.rows == WmRows::bins, early = cfg.rows == WmRows::early;
  if (sorted && p.x_rows % kScaleAlign) throw Error(who + "sorted activation rows must be padded to a multiple of 4");
  if (bins != (p.expert_counts != nullptr))
    throw Error(who + (bins ? "the chunk walk reads expert bins (GemmFp8Params::expert_counts)"
                            : "expert bins are read by the bins walk only (" + key(GemmConfig(cfg)) + ")"));
  if (early != (p.early_ids != nullptr) ||
      (early && (!p.hit_list || p.early_routes < 1 || p.early_routes > kEarlyIdWords)))
    throw Error(who + "early expert ids go with the early walk, a hit list and 1 to " + std::to_string(kEarlyIdWords) +
                " routes (" + key(GemmConfig(cfg)) + ")");
  // The dry walk reads shared memory within bounds only where the walk's indices are valid before
  // the wait: a dense walk, a hit list, or the chunk walk's clamped decode.
  if (cfg.warm_up && !(cfg.dense || p.hit_list || bins))
    throw Error(who + "the warm-up needs a dense walk, a hit list or expert bins");
  check_config_against_params(p, GemmConfig(cfg), who);
  const int nblocks = weight_blocks(p), kblocks = int((p.k + kBlockK - 1) / kBlockK);
  const int split = cfg.balanced ? 1 : std::max(1, std::min(cfg.split_k, kblocks));
  const int kb_per_split = (kblocks + split - 1) / split;
  gemm::TensorMaps maps{};
  // Weight box rows fetched from DRAM as their own 128-byte lines, not widened to 256 bytes: the
  // stream is faster so.
  maps.w = make_tensor_map_2d(p.weights, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, uint64_t(p.experts) * p.n, p.k, p.k,
                              kBlockM, kBlockK, TmaSwizzle::b128, TmaL2Promotion::b128);
  if (sorted) {
    for (int i = 0; i < kWidthCount; ++i) {
      maps.x[i] = make_tensor_map_2d(p.x, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, p.x_rows, p.k, p.k, 16 << i, kBlockK,
                                     TmaSwizzle::b128);
      // (Row quads come by 1-D bulk copies: no map.)
      if (!cfg.handoff)
        maps.xs[i] = make_tensor_map_2d(p.x_scales, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, kblocks, p.x_rows, p.x_rows * 4,
                                        1, (16 << i) + kScaleAlign, TmaSwizzle::none);
    }
  }
  gemm::WeightsOnMArgs a{};
  a.weights = p.weights;
  a.weight_scales = p.weight_scales;
  a.x = p.x;
  a.x_scales = p.x_scales;
  a.x_rows = p.x_rows;
  a.offsets = p.offsets;
  a.counts = p.expert_counts;
  a.stride = p.expert_stride;
  a.row_token = p.row_token;
  a.row_weight = p.row_weight;
  a.out = p.out;
  a.experts = p.experts;
  a.n = p.n;
  a.k = p.k;
  a.nblocks = nblocks;
  a.kblocks = kblocks;
  a.seg = segments_of(p);
  a.atomic = cfg.store ? 0 : 1;
  a.dense = cfg.dense ? 1 : 0;
  a.split_k = (kblocks + kb_per_split - 1) / kb_per_split;
  a.kblocks_per_split = kb_per_split;
  a.balanced = cfg.balanced ? 1 : 0;
  a.weights_evict_first = cfg.weights_evict_first ? 1 : 0;
  a.x_evict_first = cfg.x_evict_first ? 1 : 0;
  a.work_queue = cfg.dynamic ? p.work_queue : nullptr;
  a.hit_list = p.hit_list;
  // Without PDL the wait is no wait, and the dry walk would only add to the kernel's time.
  a.warm_up = cfg.warm_up && pdl ? 1 : 0;
  // Persistent grid: one CTA per SM (at most one unit per CTA when there are fewer units).
  const int64_t units = int64_t(p.experts) * nblocks * (cfg.balanced ? kblocks : a.split_k);
  if (units >= (int64_t(1) << 31)) throw Error(who + "E x ceil(N/128) x ceil(K/128) exceeds the kernel's 32-bit work index");
  // The chunk walk's unit count is known only on the device (an expert's further chunks): every SM.
  const int grid = bins ? device.sm_count : int(std::max<int64_t>(1, std::min<int64_t>(units, device.sm_count)));
  a.kblocks_div = FastDivisor(uint32_t(kblocks));
  a.nblocks_div = FastDivisor(uint32_t(nblocks));
  a.per_expert_div = FastDivisor(uint32_t(nblocks * a.split_k));
  a.split_k_div = FastDivisor(uint32_t(a.split_k));
  a.grid_div = FastDivisor(uint32_t(grid));
  a.early_ids = p.early_ids;
  a.early_routes = p.early_routes;
  a.store_bf16 = p.store_bf16 ? 1 : 0;
  a.reduce_rows = p.reduce_rows ? 1 : 0;
  // Sorted rows walked in whole units (round robin), under PDL: otherwise there is no wait to
  // overlap, or the gathering walks' own warm-up and balanced shares take its place.
  if (sorted && pdl && !cfg.balanced) {
    a.prewait_bytes = p.prewait_prefetch_bytes / grid;
    a.walk_inputs_ready = p.walk_inputs_ready ? 1 : 0;
  }
  using namespace gemm;
  switch (cfg.rows) {
    case WmRows::bins:
      return launch_grouped_gemm<Sm90Fp8WmBins>(maps, a, grid, launch_smem_bytes<Sm90Fp8WmBins>, stream, pdl);
    case WmRows::early:
      return launch_grouped_gemm<Sm90Fp8WmGatherEarly>(maps, a, grid, launch_smem_bytes<Sm90Fp8WmGatherEarly>, stream,
                                                       pdl);
    case WmRows::gather:
      return launch_grouped_gemm<Sm90Fp8WmGather>(maps, a, grid, launch_smem_bytes<Sm90Fp8WmGather>, stream, pdl);
    case WmRows::sorted:
      if (cfg.handoff)
        return launch_grouped_gemm<Sm90Fp8WmSortedHandoff>(maps, a, grid, launch_smem_bytes<Sm90Fp8WmSortedHandoff>,
                                                           stream, pdl);
      return launch_grouped_gemm<Sm90Fp8WmSorted>(maps, a, grid, launch_smem_bytes<Sm90Fp8WmSorted>, stream, pdl);
  }
}

}  // namespace

void launch_gemm_fp8(const GemmFp8Params& p, const GemmConfig& cfg, const DeviceInfo& device, cudaStream_t stream,
                     bool pdl) {
  validate(cfg);
  if (const auto* c = std::get_if<WeightsOnMConfig>(&cfg)) return launch_gemm_fp8_weights_on_m(p, *c, device, stream, pdl);
  if (const auto* c = std::get_if<ResidentConfig>(&cfg)) return launch_gemm_fp8_resident(p, *c, device, stream, pdl);
  return launch_gemm_fp8_tokens_on_m(p, std::get<TokensOnMConfig>(cfg), device, stream, pdl);
}

}  // namespace loom
