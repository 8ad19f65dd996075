// Owning device allocation (RAII) for the harness and tests.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "common/cuda_check.hpp"

namespace loom::bench {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes) LOOM_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
  }
  template <class T>
  static DeviceBuffer from(const std::vector<T>& host) {
    DeviceBuffer b(host.size() * sizeof(T));
    if (b.bytes_) LOOM_CUDA_CHECK(cudaMemcpy(b.ptr_, host.data(), b.bytes_, cudaMemcpyHostToDevice));
    // A pageable copy may still be in flight when cudaMemcpy returns, and work on non-blocking
    // streams does not order against it: finish it before anyone uses the buffer.
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());
    return b;
  }
  // Overwrites the whole buffer with `host` (sizes must match).
  template <class T>
  void upload(const std::vector<T>& host) {
    if (host.size() * sizeof(T) != bytes_) throw Error("DeviceBuffer::upload: size mismatch");
    if (bytes_) LOOM_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), bytes_, cudaMemcpyHostToDevice));
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());  // see from()
  }
  DeviceBuffer clone() const {
    DeviceBuffer b(bytes_);
    if (bytes_) LOOM_CUDA_CHECK(cudaMemcpy(b.ptr_, ptr_, bytes_, cudaMemcpyDeviceToDevice));
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());
    return b;
  }
  template <class T>
  std::vector<T> to_host() const {
    std::vector<T> v(bytes_ / sizeof(T));
    // Whatever any stream still does to this buffer finishes first.
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());
    if (bytes_) LOOM_CUDA_CHECK(cudaMemcpy(v.data(), ptr_, v.size() * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace loom::bench
