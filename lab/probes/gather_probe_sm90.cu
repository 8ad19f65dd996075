#include "probes/gather_probe_sm90.cuh"

#include <algorithm>
#include <cstdio>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "probes/probe_launch.hpp"
#include "common/cuda_check.hpp"
#include "common/device_info.hpp"
#include "common/rng.hpp"
#include "common/tensor_map.hpp"
#include "ptx/cp_async.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/tma.cuh"

namespace loom::bench {
namespace {

constexpr int kTokens = 8192, kK = 2048, kBlockK = 128, kBlocks = kK / kBlockK;
constexpr int kTileRows = 128;
constexpr int kThreads = 256;
constexpr int kPieces = kTileRows * kBlockK / 16 / kThreads;  // 16-byte pieces per thread per block: 4
constexpr int kSlots = 4;                                      // cp.async ring: 3 blocks in flight
constexpr int kRegRing = 3;                                    // register ring depth (blocks)
constexpr int kRingBytes = kSlots * kTileRows * kBlockK;
static_assert(kPieces * kThreads * 16 == kTileRows * kBlockK, "the threads cover a tile's block");

// Piece i of this thread in a block: row (threadIdx.x / 8) + 32 i of the tile, 16-byte column
// threadIdx.x % 8. Each tile's row tokens are loaded one tile ahead (as the GEMMs' producers
// announce a unit's rows before its blocks), so no gather waits on its own row index.
struct TileRows {
  int32_t tok[kPieces];
  __device__ void load(const int32_t* rows, int tile) {
#pragma unroll
    for (int i = 0; i < kPieces; ++i) tok[i] = __ldg(rows + tile * kTileRows + int(threadIdx.x) / 8 + 32 * i);
  }
  __device__ const uint4* src(const uint8_t* codes, int kb, int i) const {
    return reinterpret_cast<const uint4*>(codes + int64_t(tok[i]) * kK + kb * kBlockK) + threadIdx.x % 8;
  }
};

enum class Mode { cp_async, registers, tma_rows };

template <Mode kMode>
__global__ void __launch_bounds__(kThreads, 1)
    gather_kernel(const __grid_constant__ CUtensorMap rows_map, const uint8_t* codes, const int32_t* rows,
                  int tiles_per_cta, uint4* sink) {
  extern __shared__ __align__(1024) uint8_t ring[];
  uint4 keep = make_uint4(0u, 0u, 0u, 0u);
  const int tile0 = int(blockIdx.x) * tiles_per_cta;
  TileRows cur, next;  // the copies' and loads' row tokens (the TMA mode keeps its own per lane)
  if constexpr (kMode != Mode::tma_rows) next.load(rows, tile0);
  if constexpr (kMode == Mode::tma_rows) {
    // One TMA box per row and block ({128 bytes, 1 row}, 128-byte swizzle), issued by warp 0's
    // lanes (rows lane + 32 i); every thread waits for the block, reads it, and the slot is
    // refilled kSlots - 1 blocks later, after a CTA barrier.
    uint64_t* full = reinterpret_cast<uint64_t*>(ring + kRingBytes);
    if (threadIdx.x == 0) {
      for (int i = 0; i < kSlots; ++i) ptx::mbar_init(&full[i], 1);
      ptx::fence_mbar_init();
    }
    __syncthreads();
    const int lane = int(threadIdx.x) % 32, steps = tiles_per_cta * kBlocks;
    int32_t tok[kPieces], tok_next[kPieces];
    auto row_tokens = [&](int32_t(&t)[kPieces], int tile) {
#pragma unroll
      for (int i = 0; i < kPieces; ++i) t[i] = __ldg(rows + tile * kTileRows + lane + 32 * i);
    };
    auto issue = [&](int step) {
      const int t = step / kBlocks, kb = step % kBlocks, slot = step % kSlots;
      if (kb == 0) {
#pragma unroll
        for (int i = 0; i < kPieces; ++i) tok[i] = tok_next[i];
        if (t + 1 < tiles_per_cta) row_tokens(tok_next, tile0 + t + 1);
      }
      if (lane == 0) ptx::mbar_arrive_expect_tx(&full[slot], uint32_t(kTileRows * kBlockK));
      __syncwarp();
#pragma unroll
      for (int i = 0; i < kPieces; ++i)
        ptx::tma_load_2d(ring + slot * kTileRows * kBlockK + (lane + 32 * i) * kBlockK, &rows_map, kb * kBlockK,
                         tok[i], &full[slot]);
    };
    if (threadIdx.x < 32) {
      row_tokens(tok_next, tile0);
      for (int step = 0; step < kSlots - 1 && step < steps; ++step) issue(step);
    }
    for (int step = 0; step < steps; ++step) {
      ptx::mbar_wait(&full[step % kSlots], uint32_t(step / kSlots) & 1u);
      const uint4 v = reinterpret_cast<const uint4*>(ring + (step % kSlots) * kTileRows * kBlockK)[threadIdx.x];
      keep.x ^= v.x;
      __syncthreads();  // every read of the slot refilled next is done
      if (threadIdx.x < 32 && step + kSlots - 1 < steps) issue(step + kSlots - 1);
    }
  } else if constexpr (kMode == Mode::cp_async) {
    int slot = 0;
    for (int t = 0; t < tiles_per_cta; ++t) {
      cur = next;
      if (t + 1 < tiles_per_cta) next.load(rows, tile0 + t + 1);
      for (int kb = 0; kb < kBlocks; ++kb) {
#pragma unroll
        for (int i = 0; i < kPieces; ++i) {
          // 128-byte swizzled, as a K-major wgmma tile: piece c of row r at r * 128 + (c ^ r % 8) * 16.
          const int r = int(threadIdx.x) / 8 + 32 * i, c = int(threadIdx.x) % 8;
          const uint32_t dst = ptx::smem_u32(ring + slot * kTileRows * kBlockK + r * kBlockK + ((c ^ (r % 8)) * 16));
          ptx::cp_async_16_zfill(dst, cur.src(codes, kb, i), 16u);
        }
        ptx::cp_async_commit();
        ptx::cp_async_wait<kSlots - 1>();  // the slot written next is free (its copies landed)
        slot = slot + 1 == kSlots ? 0 : slot + 1;
      }
    }
    ptx::cp_async_wait<0>();
    __syncthreads();
    keep = reinterpret_cast<const uint4*>(ring)[threadIdx.x];
  } else {
    uint4 reg[kRegRing][kPieces];
    // Block b is loaded kRegRing blocks before it is consumed (XORed into keep).
    for (int step = 0; step < tiles_per_cta * kBlocks + kRegRing; ++step) {
      const int t = step / kBlocks, kb = step % kBlocks;
      if (kb == 0 && t < tiles_per_cta) {
        cur = next;
        if (t + 1 < tiles_per_cta) next.load(rows, tile0 + t + 1);
      }
#pragma unroll
      for (int j = 0; j < kRegRing; ++j) {  // unrolled over the ring so every slot is a register choice
        if ((step + j) % kRegRing != 0) continue;
        if (step >= kRegRing)
#pragma unroll
          for (int i = 0; i < kPieces; ++i) {
            keep.x ^= reg[j][i].x;
            keep.y ^= reg[j][i].y;
            keep.z ^= reg[j][i].z;
            keep.w ^= reg[j][i].w;
          }
        if (t < tiles_per_cta)
#pragma unroll
          for (int i = 0; i < kPieces; ++i) reg[j][i] = __ldcg(cur.src(codes, kb, i));
      }
    }
  }
  if (tiles_per_cta < 0) sink[threadIdx.x] = keep;  // never: keeps the loads live
}

}  // namespace

std::string run_gather_probe(const GatherProbeOptions& opt, std::ostream& log) {
  const DeviceInfo dev = probe_device("gather-probe");
  const int64_t row_count = int64_t(dev.sm_count) * opt.tiles_per_cta * kTileRows;
  std::vector<int32_t> rows(static_cast<size_t>(row_count));
  Rng rng(7);
  for (int32_t& r : rows) r = int32_t(rng.below(kTokens));
  uint8_t* codes = nullptr;
  int32_t* d_rows = nullptr;
  uint4* sink = nullptr;
  LOOM_CUDA_CHECK(cudaMalloc(&codes, size_t(kTokens) * kK));
  LOOM_CUDA_CHECK(cudaMemset(codes, 0x38, size_t(kTokens) * kK));
  LOOM_CUDA_CHECK(cudaMalloc(&d_rows, rows.size() * sizeof(int32_t)));
  LOOM_CUDA_CHECK(cudaMemcpy(d_rows, rows.data(), rows.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  LOOM_CUDA_CHECK(cudaMalloc(&sink, sizeof(uint4) * kThreads));
  const double bytes = double(row_count) * kK;
  std::ostringstream table;
  table << "gather probe: " << dev.name << ", " << dev.sm_count << " CTAs x " << opt.tiles_per_cta
        << " tiles of 128 random rows of a 16 MiB code matrix, K=" << kK << " (" << bytes / 1e9
        << " GB per launch), median of " << opt.repeats << "\n";
  char line[200];
  std::snprintf(line, sizeof line, "  %-44s %10s %9s %10s %8s\n", "variant", "shared KiB", "carveout", "us", "TB/s");
  table << line;
  struct Variant {
    const char* name;
    Mode mode;
    int footprint_kib;
    int carveout;  // cudaFuncAttributePreferredSharedMemoryCarveout (% of the most shared memory); -1: default
  };
  const char* const kCopy = "cp.async into a 4-slot ring";
  const char* const kLoad = "16-byte loads into a 3-block register ring";
  const char* const kTma = "TMA row boxes into a 4-slot ring";
  const Variant variants[] = {{kCopy, Mode::cp_async, 72, 0},     {kCopy, Mode::cp_async, 72, 100},
                              {kCopy, Mode::cp_async, 144, -1},   {kCopy, Mode::cp_async, 200, -1},
                              {kLoad, Mode::registers, 72, 0},    {kLoad, Mode::registers, 72, 100},
                              {kLoad, Mode::registers, 144, -1},  {kLoad, Mode::registers, 200, -1},
                              {kTma, Mode::tma_rows, 72, -1},     {kTma, Mode::tma_rows, 144, -1}};
  // The code matrix in boxes of one row's 128-byte block (the TMA variant).
  const CUtensorMap rows_map = make_tensor_map_2d(codes, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, kTokens, kK, kK, 1,
                                                  kBlockK, TmaSwizzle::b128, TmaL2Promotion::b128);
  for (const Variant& v : variants) {
    log << "gather-probe: " << v.name << ", " << v.footprint_kib << " KiB\n";
    const size_t smem = std::max<size_t>(size_t(v.footprint_kib) * 1024, kRingBytes + 1024);
    auto kernel = v.mode == Mode::cp_async    ? gather_kernel<Mode::cp_async>
                  : v.mode == Mode::registers ? gather_kernel<Mode::registers>
                                              : gather_kernel<Mode::tma_rows>;
    LOOM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    LOOM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, v.carveout));
    std::vector<double> micros;
    for (int i = 0; i < opt.repeats + 1; ++i) {  // the first launch warms L2 and is not counted
      const double us = time_launch_us(
          [&] { kernel<<<dev.sm_count, kThreads, smem>>>(rows_map, codes, d_rows, opt.tiles_per_cta, sink); });
      if (i > 0) micros.push_back(us);
    }
    std::sort(micros.begin(), micros.end());
    const double us = micros[micros.size() / 2];
    char carve[16];
    std::snprintf(carve, sizeof carve, v.carveout < 0 ? "default" : "%d %%", v.carveout);
    std::snprintf(line, sizeof line, "  %-44s %10d %9s %10.1f %8.2f\n", v.name, int(smem / 1024), carve, us,
                  bytes / us / 1e6);
    table << line;
  }
  LOOM_CUDA_CHECK(cudaFree(codes));
  LOOM_CUDA_CHECK(cudaFree(d_rows));
  LOOM_CUDA_CHECK(cudaFree(sink));
  return table.str();
}

}  // namespace loom::bench
