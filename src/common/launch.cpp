#include "common/launch.hpp"

#include <map>
#include <mutex>
#include <utility>

namespace loom {

void ensure_dynamic_smem(const void* kernel, size_t bytes) {
  constexpr size_t kDefault = 48 * 1024;  // what every kernel may use without the opt-in
  if (bytes <= kDefault) return;
  int device = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, size_t> configured;
  const std::lock_guard<std::mutex> lock(mutex);
  size_t& done = configured[{device, kernel}];
  if (done >= bytes) return;
  LOOM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  done = bytes;
}

}  // namespace loom
