// The compute speed of light: cuBLASLt dense GEMMs of the same FLOPs as the MoE layer (M = T*k
// rows, the layer's N and K), FP8 e4m3 with per-tensor scales or BF16, bf16 output. The best of the
// heuristic's candidates (fast accumulation on and off for FP8) is kept.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/types.hpp"

namespace loom::bench {

struct GemmShape {
  int64_t m = 0, n = 0, k = 0;  // D[m, n] = A[m, k] * B[n, k]^T
};

// The dense GEMMs whose FLOPs equal the layer's: single -> one (M, N, K); ffn -> (M, 2I, H) and (M, H, I).
std::vector<GemmShape> sol_gemm_shapes(const Shape& shape);

class DenseGemm {
 public:
  // Allocates `copies` sets of random operands for every shape (copies rotate to keep L2 cold).
  DenseGemm(DType dtype, std::vector<GemmShape> shapes, int copies, uint64_t seed);
  ~DenseGemm();
  DenseGemm(const DenseGemm&) = delete;
  DenseGemm& operator=(const DenseGemm&) = delete;

  // Tries the heuristic's candidates with `reps` timed graph replays each and keeps the fastest.
  void autotune(class GpuTimer& timer, int reps);
  // All shapes' GEMMs for one copy of the operands.
  void enqueue(cudaStream_t stream, int copy) const;
  int64_t touched_bytes() const { return touched_bytes(impl_dtype(), shapes()); }
  // Bytes one pass over `shapes` touches: A, B read and D written (M padded as cuBLASLt needs).
  static int64_t touched_bytes(DType dtype, const std::vector<GemmShape>& shapes);
  const std::vector<GemmShape>& shapes() const;
  double flops() const;
  std::string algo() const;  // what autotune chose
  int copies() const { return copies_; }

  // Operands of copy 0, shape s, for correctness checks: A [m_padded, k], B [n, k], D [m_padded, n].
  const void* a(int s) const;
  const void* b(int s) const;
  const void* d(int s) const;
  int64_t padded_m(int s) const;

 private:
  DType impl_dtype() const;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int copies_ = 1;
};

}  // namespace loom::bench
