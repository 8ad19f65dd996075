#include "common/device_info.hpp"

#include <cuda_runtime.h>

namespace loom {

std::optional<DeviceInfo> query_device(std::string* why) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    if (why) *why = e != cudaSuccess ? std::string("no CUDA device (") + cudaGetErrorString(e) + ")" : "no CUDA device";
    cudaGetLastError();  // clear the sticky-free error so later calls are not confused
    return std::nullopt;
  }
  int dev = 0;
  cudaGetDevice(&dev);
  cudaDeviceProp p{};
  if ((e = cudaGetDeviceProperties(&p, dev)) != cudaSuccess) {
    if (why) *why = std::string("cannot query device: ") + cudaGetErrorString(e);
    return std::nullopt;
  }
  DeviceInfo d;
  d.ordinal = dev;
  d.name = p.name;
  d.major = p.major;
  d.minor = p.minor;
  d.sm_count = p.multiProcessorCount;
  d.l2_bytes = p.l2CacheSize;
  d.global_bytes = int64_t(p.totalGlobalMem);
  d.smem_per_block_optin = int64_t(p.sharedMemPerBlockOptin);
  int v = 0;
  if (cudaDeviceGetAttribute(&v, cudaDevAttrClockRate, dev) == cudaSuccess) d.clock_mhz = v / 1000;
  if (cudaDeviceGetAttribute(&v, cudaDevAttrMemoryClockRate, dev) == cudaSuccess) d.memory_clock_mhz = v / 1000;
  if (cudaDeviceGetAttribute(&v, cudaDevAttrGlobalMemoryBusWidth, dev) == cudaSuccess) d.memory_bus_bits = v;
  cudaGetLastError();
  return d;
}

}  // namespace loom
