#include "bench/stream_read_sm90.cuh"

#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "ptx/mbarrier.cuh"
#include "ptx/tma.cuh"

namespace loom::bench {

namespace {

struct DeviceReadArgs {
  const uint8_t* base[2];
  int64_t stride[2];
  uint32_t elems[2];      // 16-byte elements per segment
  uint32_t group0_total;  // elements of group 0 over all segments
  uint32_t total;         // elements over both groups
  const int32_t* seg_ids;
  uint32_t* sink;
  bool checksum;
};

__device__ __forceinline__ const uint4* element_address(const DeviceReadArgs& a, uint32_t i) {
  const int g = i < a.group0_total ? 0 : 1;
  const uint32_t local = g == 0 ? i : i - a.group0_total;
  const uint32_t seg = local / a.elems[g];
  const uint32_t off = local - seg * a.elems[g];
  return reinterpret_cast<const uint4*>(a.base[g] + int64_t(__ldg(a.seg_ids + seg)) * a.stride[g]) + off;
}

// Grid-stride loop; each thread keeps kUnroll independent 16-byte loads in flight before it
// folds them into its hash, so the memory system sees enough outstanding requests.
template <int kUnroll>
__global__ void stream_read_kernel(DeviceReadArgs a) {
  const uint32_t stride = gridDim.x * blockDim.x;
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  uint32_t hash = 0;
  for (; i + (kUnroll - 1) * stride < a.total; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      // Streamed once: no L1 allocation.
      const uint4* p = element_address(a, i + u * stride);
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                   : "l"(p));
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) hash ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < a.total; i += stride) {
    const uint4 v = __ldg(element_address(a, i));
    hash ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (a.checksum) {
    atomicXor(a.sink, hash);  // tests prove every byte was read exactly once
  } else if (hash == 0x9e3779b9u) {
    *a.sink = hash;  // keeps the loads alive; harmless if it ever matches
  }
}

// The bulk reader: chunks of up to kChunkBytes of each segment, dealt to the CTAs round robin in
// runs of consecutive chunks (ReadConfig::bulk_run; 0: one contiguous span per CTA).
// Thread 0 copies each chunk into the next ring stage; warps 1-4 hash every word of it and free it.
constexpr int kChunkBytes = 16384;
constexpr int kBulkConsumerWarps = 4;
constexpr int kBulkThreads = 32 * (1 + kBulkConsumerWarps);

struct ChunkPlace {
  const uint8_t* src;
  uint32_t bytes;
};

__device__ __forceinline__ ChunkPlace chunk_place(const DeviceReadArgs& a, const uint32_t (&chunks)[2], uint32_t c) {
  const uint32_t group0_chunks = chunks[0] * uint32_t(a.group0_total / a.elems[0]);
  const int g = c < group0_chunks ? 0 : 1;
  const uint32_t local = g == 0 ? c : c - group0_chunks;
  const uint32_t seg = local / chunks[g], piece = local - seg * chunks[g];
  const uint32_t seg_bytes = a.elems[g] * 16u, offset = piece * uint32_t(kChunkBytes);
  return ChunkPlace{a.base[g] + int64_t(__ldg(a.seg_ids + seg)) * a.stride[g] + offset,
                    min(uint32_t(kChunkBytes), seg_bytes - offset)};
}

template <int kStages>
__global__ void __launch_bounds__(kBulkThreads)
    stream_read_bulk_kernel(DeviceReadArgs a, uint32_t total_chunks, uint32_t run) {
  extern __shared__ __align__(128) uint8_t ring[];
  uint64_t* full = reinterpret_cast<uint64_t*>(ring + kStages * kChunkBytes);
  uint64_t* empty = full + kStages;
  uint32_t* sizes = reinterpret_cast<uint32_t*>(empty + kStages);  // each stage's bytes, for the hashers
  const uint32_t chunks[2] = {(a.elems[0] * 16u + kChunkBytes - 1) / kChunkBytes,
                              a.elems[1] ? (a.elems[1] * 16u + kChunkBytes - 1) / kChunkBytes : 1u};
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbar_init(full + s, 1);
      ptx::mbar_init(empty + s, 32 * kBulkConsumerWarps);
    }
    ptx::fence_mbar_init();
  }
  __syncthreads();
  if (run == 0) run = (total_chunks + gridDim.x - 1) / gridDim.x;
  // Chunk i of this CTA: run blockIdx.x + (i / run) * gridDim.x, its chunk i % run. The last run
  // of all may be short.
  const uint32_t runs = (total_chunks + run - 1) / run;
  const uint32_t my_runs = runs > blockIdx.x ? (runs - blockIdx.x + gridDim.x - 1) / gridDim.x : 0u;
  const uint32_t last_run = blockIdx.x + (my_runs - 1) * gridDim.x;
  const uint32_t mine =
      my_runs == 0 ? 0u : (my_runs - 1) * run + (last_run == runs - 1 ? total_chunks - last_run * run : run);
  uint32_t hash = 0;
  if (threadIdx.x == 0) {
    for (uint32_t i = 0; i < mine; ++i) {
      const int stage = int(i % kStages);
      if (i >= uint32_t(kStages)) ptx::mbar_wait(empty + stage, (i / kStages - 1) & 1u);
      const ChunkPlace c = chunk_place(a, chunks, (blockIdx.x + (i / run) * gridDim.x) * run + i % run);
      sizes[stage] = c.bytes;  // read by the hashers after the full barrier, which this arrival releases
      ptx::mbar_arrive_expect_tx(full + stage, c.bytes);
      ptx::bulk_load(ring + stage * kChunkBytes, c.src, c.bytes, full + stage);
    }
  } else if (threadIdx.x >= 32) {
    const int t = int(threadIdx.x) - 32;
    for (uint32_t i = 0; i < mine; ++i) {
      const int stage = int(i % kStages);
      ptx::mbar_wait(full + stage, (i / kStages) & 1u);
      const uint4* words = reinterpret_cast<const uint4*>(ring + stage * kChunkBytes);
      const int n = int(sizes[stage] / 16u);
      for (int j = t; j < n; j += 32 * kBulkConsumerWarps) {
        const uint4 v = words[j];
        hash ^= v.x ^ v.y ^ v.z ^ v.w;
      }
      // Every reader arrives after its own reads (not one lane after __syncwarp): the release that
      // orders them before the next bulk write into the stage is then each thread's own.
      ptx::mbar_arrive(empty + stage);
    }
  }
  if (a.checksum) {
    if (threadIdx.x >= 32) atomicXor(a.sink, hash);
  } else if (hash == 0x9e3779b9u) {
    *a.sink = hash;  // keeps the reads alive; harmless if it ever matches
  }
}

template <int kStages>
void launch_bulk(const DeviceReadArgs& d, int ctas, int run, cudaStream_t stream) {
  const size_t smem = size_t(kStages) * kChunkBytes + 2 * kStages * sizeof(uint64_t) + kStages * sizeof(uint32_t);
  ensure_dynamic_smem(stream_read_bulk_kernel<kStages>, smem);
  const uint32_t chunks0 = (d.elems[0] * 16u + kChunkBytes - 1) / kChunkBytes;
  const uint32_t chunks1 = d.elems[1] ? (d.elems[1] * 16u + kChunkBytes - 1) / kChunkBytes : 0u;
  const uint32_t segments = d.group0_total / d.elems[0];
  const uint32_t total_chunks = segments * (chunks0 + (d.total > d.group0_total ? chunks1 : 0u));
  stream_read_bulk_kernel<kStages><<<unsigned(ctas), kBulkThreads, smem, stream>>>(d, total_chunks, uint32_t(run));
}

}  // namespace

std::string ReadConfig::str() const {
  if (bulk_stages > 0)
    return std::to_string(ctas_per_sm) + "/SM bulk " + std::to_string(bulk_stages) + "x16KiB " +
           (bulk_run > 0 ? "runs of " + std::to_string(bulk_run) : std::string("spans"));
  return std::to_string(ctas_per_sm) + "x" + std::to_string(threads) + "/SM u" + std::to_string(unroll);
}

void launch_stream_read(const ReadArgs& args, const ReadConfig& cfg, int sm_count, cudaStream_t stream) {
  if (args.groups < 1 || args.groups > 2) throw Error("stream read: 1 or 2 groups");
  DeviceReadArgs d{};
  uint64_t totals[2] = {0, 0};
  for (int g = 0; g < args.groups; ++g) {
    const ReadGroup& rg = args.group[g];
    if (rg.bytes <= 0 || rg.bytes % 16 != 0 || rg.stride % 16 != 0 || (reinterpret_cast<uintptr_t>(rg.base) & 15))
      throw Error("stream read: segments must be 16-byte aligned and sized");
    d.base[g] = static_cast<const uint8_t*>(rg.base);
    d.stride[g] = rg.stride;
    d.elems[g] = uint32_t(rg.bytes / 16);
    totals[g] = uint64_t(args.segments) * uint64_t(d.elems[g]);
  }
  if (totals[0] + totals[1] >= (1ull << 32)) throw Error("stream read: more than 64 GiB in one pass");
  d.group0_total = uint32_t(totals[0]);
  d.total = uint32_t(totals[0] + totals[1]);
  d.seg_ids = args.seg_ids;
  d.sink = args.sink;
  d.checksum = args.checksum;
  if (d.total == 0) return;
  if (cfg.bulk_stages > 0) {
    if (cfg.bulk_run < 0) throw Error("stream read: bulk_run must be >= 0");
    for (int g = 0; g < args.groups; ++g)
      if (args.group[g].bytes >= (int64_t(1) << 32)) throw Error("stream read: bulk segments below 4 GiB each");
    const int ctas = cfg.ctas_per_sm * sm_count;
    switch (cfg.bulk_stages) {
      case 4: launch_bulk<4>(d, ctas, cfg.bulk_run, stream); break;
      case 6: launch_bulk<6>(d, ctas, cfg.bulk_run, stream); break;
      case 8: launch_bulk<8>(d, ctas, cfg.bulk_run, stream); break;
      case 12: launch_bulk<12>(d, ctas, cfg.bulk_run, stream); break;
      default: throw Error("stream read: bulk_stages must be 4, 6, 8 or 12");
    }
    LOOM_CUDA_CHECK_LAUNCH();
    return;
  }
  const dim3 grid(unsigned(cfg.ctas_per_sm * sm_count)), block(unsigned(cfg.threads));
  switch (cfg.unroll) {
    case 1: stream_read_kernel<1><<<grid, block, 0, stream>>>(d); break;
    case 2: stream_read_kernel<2><<<grid, block, 0, stream>>>(d); break;
    case 4: stream_read_kernel<4><<<grid, block, 0, stream>>>(d); break;
    case 8: stream_read_kernel<8><<<grid, block, 0, stream>>>(d); break;
    default: throw Error("stream read: unroll must be 1, 2, 4 or 8");
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::bench
