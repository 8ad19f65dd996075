#include "probes/stream_probe_sm90.cuh"

#include <cuda.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "probes/probe_launch.hpp"
#include "bench/sol_read.hpp"
#include "bench/stats.hpp"
#include "bench/stream_read_sm90.cuh"
#include "common/cuda_check.hpp"
#include "common/device_info.hpp"
#include "common/tensor_map.hpp"
#include "ptx/mbarrier.cuh"
#include "ptx/tma.cuh"

namespace loom::bench {
namespace {

// The bytes streamed: 256 MiB, as the qwen35-single weights (E=256, N=512, K=2048 e4m3), viewed
// as rows of `pitch` bytes read in units of `unit_rows` rows (StreamProbeOptions).
constexpr int64_t kWeightBytes = int64_t(256) * 512 * 2048;
constexpr int kBlockK = 128;  // bytes of a row per box: one 128-byte swizzled row
constexpr int kThreads = 64;  // warp 0: the producer's lane 0; warp 1: the consumer's lane 0

// A unit is unit_rows rows; a stage is one box of them, 128 bytes of each row.
struct Geometry {
  int64_t pitch;  // bytes per row (a multiple of 128)
  int unit_rows;
  // Whole groups of four units (Order::k_outer4's), so every order streams the same bytes.
  __host__ __device__ int units() const { return int(kWeightBytes / (pitch * unit_rows)) / 4 * 4; }
  __host__ __device__ int blocks() const { return int(pitch / kBlockK); }
  __host__ __device__ int stage_bytes() const { return unit_rows * kBlockK; }
};

enum class Source { boxes, bulk };
// Whole units asked of L2 ahead of their boxes (cp.async.bulk.prefetch.L2 of the unit's contiguous
// rows, one stage's bytes per instruction), issued by the producer when it starts a unit's first K block
// (or its middle one): none; the next unit; the unit itself; the next unit from the middle block.
enum class Prefetch { none, next_unit, this_unit, next_from_middle };
// The order of a unit's K blocks: 0, 1, ...; or rotated, starting at block (unit mod blocks) or at
// (CTA mod blocks), so that the CTAs streaming at one time read different columns of their rows.
// k_outer4: units go in groups of four (an expert's 512 rows at N=512), each group K block by K
// block with its four units' boxes in turn (the row-ring GEMM's order).
enum class Order { in_order, from_unit, from_cta, k_outer4 };
constexpr int kGroupUnits = 4;

__device__ __forceinline__ void prefetch_unit(const Geometry& g, const uint8_t* weights, int unit) {
  if (unit >= g.units()) return;
  const uint8_t* base = weights + int64_t(unit) * g.unit_rows * g.pitch;
  for (int c = 0; c < g.blocks(); ++c) ptx::prefetch_l2_bulk(base + int64_t(c) * g.stage_bytes(), g.stage_bytes());
}

// Step i of this CTA: its (i / kBlocks)-th unit's K block i % kBlocks, in stage i % kStages.
template <int kStages, int kBatch, Source kSource, Prefetch kPrefetch, Order kOrder>
__global__ void __launch_bounds__(kThreads)
    stream_kernel(const __grid_constant__ CUtensorMap map, const Geometry g, const uint8_t* weights, uint32_t* sink) {
  static_assert(kStages % kBatch == 0, "batches never straddle the ring's end");
  extern __shared__ __align__(1024) uint8_t ring[];
  const int stage_bytes = g.stage_bytes(), blocks = g.blocks(), units = g.units();
  uint64_t* full = reinterpret_cast<uint64_t*>(ring + kStages * stage_bytes);
  uint64_t* empty = full + kStages;
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbar_init(full + s, 1);
      ptx::mbar_init(empty + s, 1);
    }
    ptx::fence_mbar_init();
  }
  __syncthreads();
  const int walk_units = kOrder == Order::k_outer4 ? units / kGroupUnits : units;
  const int steps_per_unit = kOrder == Order::k_outer4 ? blocks * kGroupUnits : blocks;
  const int my_units = (walk_units - int(blockIdx.x) + int(gridDim.x) - 1) / int(gridDim.x);
  const int steps = my_units * steps_per_unit;
  if (warp == 0 && lane == 0) {
    for (int i = 0; i < steps; i += kBatch) {
      // Every stage of the batch free before any of its loads: the pairs variant puts two K
      // blocks of the same rows on the wire together.
      for (int j = 0; j < kBatch; ++j) {
        const int step = i + j;
        if (step >= kStages) ptx::mbar_wait(empty + step % kStages, uint32_t((step / kStages - 1) & 1));
      }
      for (int j = 0; j < kBatch && i + j < steps; ++j) {
        const int step = i + j, stage = step % kStages;
        int unit = int(blockIdx.x) + (step / steps_per_unit) * int(gridDim.x);
        const int rot = kOrder == Order::from_unit ? unit : kOrder == Order::from_cta ? int(blockIdx.x) : 0;
        int kb = (step + rot) % blocks;
        if constexpr (kOrder == Order::k_outer4) {
          const int in_group = step % steps_per_unit;
          unit = unit * kGroupUnits + in_group % kGroupUnits;
          kb = in_group / kGroupUnits;
        }
        if constexpr (kPrefetch == Prefetch::next_unit)
          if (kb == 0) prefetch_unit(g, weights, unit + int(gridDim.x));
        if constexpr (kPrefetch == Prefetch::this_unit)
          if (kb == 0) prefetch_unit(g, weights, unit);
        if constexpr (kPrefetch == Prefetch::next_from_middle)
          if (kb == blocks / 2) prefetch_unit(g, weights, unit + int(gridDim.x));
        ptx::mbar_arrive_expect_tx(full + stage, stage_bytes);
        if constexpr (kSource == Source::boxes)
          ptx::tma_load_2d(ring + stage * stage_bytes, &map, kb * kBlockK, unit * g.unit_rows, full + stage);
        else
          ptx::bulk_load(ring + stage * stage_bytes,
                         weights + int64_t(unit) * g.unit_rows * g.pitch + int64_t(kb) * stage_bytes, stage_bytes,
                         full + stage);
      }
    }
  } else if (warp == 1 && lane == 0) {
    uint32_t keep = 0;
    for (int step = 0; step < steps; ++step) {
      const int stage = step % kStages;
      ptx::mbar_wait(full + stage, uint32_t((step / kStages) & 1));
      keep ^= reinterpret_cast<const uint32_t*>(ring + stage * stage_bytes)[step & 63];
      ptx::mbar_arrive(empty + stage);
    }
    if (keep == 0x9e3779b9u && steps < 0) *sink = keep;  // never: keeps the reads
  }
}

struct Variant {
  std::string name;
  void (*kernel)(const CUtensorMap, const Geometry, const uint8_t*, uint32_t*);
  int stages;
  int ctas_per_sm;
  TmaSwizzle swizzle = TmaSwizzle::b128;
  TmaL2Promotion promotion = TmaL2Promotion::b256;  // the GEMMs' maps
};

template <int kStages, int kBatch, Source kSource, Prefetch kPrefetch = Prefetch::none, Order kOrder = Order::in_order>
Variant variant(const std::string& name, int ctas_per_sm = 1, TmaSwizzle swizzle = TmaSwizzle::b128,
                TmaL2Promotion promotion = TmaL2Promotion::b256) {
  return Variant{name, stream_kernel<kStages, kBatch, kSource, kPrefetch, kOrder>, kStages, ctas_per_sm, swizzle,
                 promotion};
}

}  // namespace

std::string run_stream_probe(const StreamProbeOptions& opt, std::ostream& log) {
  const Geometry g{opt.pitch, opt.unit_rows};
  if (g.pitch < kBlockK || g.pitch % kBlockK || g.unit_rows < 8 || g.unit_rows > 256 || g.unit_rows % 8 ||
      g.units() < 1)
    throw Error("stream-probe: the pitch must be a positive multiple of 128 bytes and the unit 8 to 256 rows, a "
                "multiple of 8 (128-byte-swizzled boxes on 1024-byte boundaries), at most 256 MiB together");
  const int64_t streamed = int64_t(g.units()) * g.unit_rows * g.pitch;  // the boxes' bytes (whole units)
  const DeviceInfo dev = probe_device("stream-probe");
  uint8_t* copies[2] = {nullptr, nullptr};
  for (int c = 0; c < 2; ++c) {
    LOOM_CUDA_CHECK(cudaMalloc(&copies[c], size_t(kWeightBytes)));
    LOOM_CUDA_CHECK(cudaMemset(copies[c], 0x38 + c, size_t(kWeightBytes)));
  }
  uint32_t* sink = nullptr;
  LOOM_CUDA_CHECK(cudaMalloc(&sink, sizeof(uint32_t)));

  std::ostringstream table;
  table << "stream probe: " << dev.name << ", " << dev.sm_count << " SMs; " << (streamed >> 20) << " MiB as rows of "
        << g.pitch << " bytes, " << g.units() << " units of " << g.unit_rows << " rows (boxes " << g.unit_rows
        << " x 128 B), two copies read by turns, median of " << opt.repeats << " launches\n";
  char line[240];
  std::snprintf(line, sizeof line, "  %-58s %6s %9s %8s\n", "variant", "KiB", "us", "TB/s");
  table << line;
  const auto report = [&](const std::string& name, int kib, double us, int64_t bytes) {
    std::snprintf(line, sizeof line, "  %-58s %6d %9.1f %8.2f\n", name.c_str(), kib, us, double(bytes) / us / 1e6);
    table << line;
  };

  const Variant variants[] = {
      variant<4, 1, Source::boxes>("boxes, 4 stages (the FP8 GEMMs' weight ring)"),
      variant<6, 1, Source::boxes>("boxes, 6 stages"),
      variant<8, 1, Source::boxes>("boxes, 8 stages"),
      variant<12, 1, Source::boxes>("boxes, 12 stages"),
      variant<16, 1, Source::boxes>("boxes, 16 stages"),
      variant<24, 1, Source::boxes>("boxes, 24 stages"),
      variant<4, 2, Source::boxes>("boxes, 4 stages, issued in pairs"),
      variant<8, 2, Source::boxes>("boxes, 8 stages, issued in pairs"),
      variant<4, 1, Source::boxes>("boxes, 4 stages, 2 CTAs per SM", 2),
      variant<4, 1, Source::boxes, Prefetch::this_unit>("boxes, 4 stages, L2 prefetch of the unit at its start"),
      variant<4, 1, Source::boxes, Prefetch::next_unit>("boxes, 4 stages, L2 prefetch of the next unit"),
      variant<4, 1, Source::boxes, Prefetch::next_from_middle>("boxes, 4 stages, ... the next unit from mid-unit"),
      variant<4, 1, Source::boxes, Prefetch::none, Order::from_unit>("boxes, 4 stages, K blocks rotated by unit"),
      variant<4, 1, Source::boxes, Prefetch::none, Order::from_cta>("boxes, 4 stages, K blocks rotated by CTA"),
      variant<8, 1, Source::boxes, Prefetch::none, Order::from_unit>("boxes, 8 stages, K blocks rotated by unit"),
      variant<4, 1, Source::boxes>("boxes, 4 stages, no swizzle", 1, TmaSwizzle::none),
      variant<4, 1, Source::boxes>("boxes, 4 stages, L2 promotion none", 1, TmaSwizzle::b128, TmaL2Promotion::none),
      variant<4, 1, Source::boxes>("boxes, 4 stages, L2 promotion 64 B", 1, TmaSwizzle::b128, TmaL2Promotion::b64),
      variant<4, 1, Source::boxes>("boxes, 4 stages, L2 promotion 128 B", 1, TmaSwizzle::b128, TmaL2Promotion::b128),
      variant<8, 1, Source::boxes>("boxes, 8 stages, L2 promotion 128 B", 1, TmaSwizzle::b128, TmaL2Promotion::b128),
      variant<6, 1, Source::boxes>("boxes, 6 stages, L2 promotion 128 B", 1, TmaSwizzle::b128, TmaL2Promotion::b128),
      variant<6, 1, Source::boxes, Prefetch::none, Order::k_outer4>(
          "... K-outer over 4 units (row-ring GEMM order)", 1, TmaSwizzle::b128, TmaL2Promotion::b128),
      variant<8, 1, Source::boxes, Prefetch::none, Order::k_outer4>(
          "boxes, 8 stages, 128 B, K-outer over 4 units", 1, TmaSwizzle::b128, TmaL2Promotion::b128),
      variant<4, 1, Source::bulk>("1-D bulk copies of a stage's bytes, 4 stages"),
      variant<8, 1, Source::bulk>("1-D bulk copies of a stage's bytes, 8 stages"),
  };
  for (const Variant& v : variants) {
    log << "stream-probe: " << v.name << "\n";
    const size_t smem = size_t(v.stages) * size_t(g.stage_bytes()) + size_t(2 * v.stages) * sizeof(uint64_t);
    if (smem > size_t(dev.smem_per_block_optin) || (v.ctas_per_sm > 1 && 2 * smem > size_t(dev.smem_per_block_optin))) {
      log << "stream-probe: " << v.name << ": its ring does not fit this geometry's stages, skipped\n";
      continue;
    }
    LOOM_CUDA_CHECK(cudaFuncSetAttribute(v.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    const int grid = dev.sm_count * v.ctas_per_sm;
    CUtensorMap maps[2];
    for (int c = 0; c < 2; ++c)
      maps[c] = make_tensor_map_2d(copies[c], CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, uint64_t(kWeightBytes / g.pitch),
                                   uint64_t(g.pitch), uint64_t(g.pitch), uint32_t(g.unit_rows), kBlockK, v.swizzle,
                                   v.promotion);
    std::vector<double> micros;
    for (int i = 0; i < opt.repeats + 2; ++i) {  // the first two launches (one per copy) are not counted
      const int c = i & 1;
      const double us = time_launch_us([&] { v.kernel<<<grid, kThreads, smem>>>(maps[c], g, copies[c], sink); });
      if (i >= 2) micros.push_back(us);
    }
    report(v.name, int(smem / 1024), summarize(micros).median_us, streamed);
  }

  // The speed-of-light kernel over the same bytes: each expert's N x K rows one segment.
  constexpr int kSegments = 256;  // the floor reads the same bytes as 256 segments of 1 MiB
  std::vector<int32_t> ids(kSegments);
  for (int e = 0; e < kSegments; ++e) ids[size_t(e)] = e;
  int32_t* d_ids = nullptr;
  LOOM_CUDA_CHECK(cudaMalloc(&d_ids, ids.size() * sizeof(int32_t)));
  LOOM_CUDA_CHECK(cudaMemcpy(d_ids, ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  double best_us = 0.0;
  std::string best_cfg;
  for (const ReadConfig& cfg : read_sweep()) {
    log << "stream-probe: the floor's reader, " << cfg.str() << "\n";
    std::vector<double> micros;
    for (int i = 0; i < opt.repeats + 2; ++i) {
      ReadArgs args;
      args.group[0] = ReadGroup{copies[i & 1], kWeightBytes / kSegments, kWeightBytes / kSegments};
      args.seg_ids = d_ids;
      args.segments = kSegments;
      args.sink = sink;
      const double us = time_launch_us([&] { launch_stream_read(args, cfg, dev.sm_count, nullptr); });
      if (i >= 2) micros.push_back(us);
    }
    const double us = summarize(micros).median_us;
    if (best_cfg.empty() || us < best_us) best_us = us, best_cfg = cfg.str();
  }
  report("the floor's reader, fastest of its sweep (" + best_cfg + ")", 0, best_us, kWeightBytes);

  LOOM_CUDA_CHECK(cudaFree(d_ids));
  LOOM_CUDA_CHECK(cudaFree(sink));
  for (uint8_t* p : copies) LOOM_CUDA_CHECK(cudaFree(p));
  return table.str();
}

}  // namespace loom::bench
