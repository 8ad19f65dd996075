#include "bench/stream_read_sm90.cuh"

#include "common/cuda_check.hpp"

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

}  // namespace

std::string ReadConfig::str() const {
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
