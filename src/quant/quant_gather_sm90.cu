#include "quant/quant_gather_sm90.cuh"

#include <algorithm>
#include <cstdint>
#include <string>

#include "diag/chain_trace.cuh"
#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "loom/types.hpp"
#include "ptx/pdl.cuh"

#include "quant/quant_gather_device.cuh"

namespace loom {
namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) quant_gather_kernel(const QuantGatherParams p) {
  if (threadIdx.x == 0) LOOM_TRACE(kQuantStart);
  // Lets the next kernel start launching; it waits for this grid's completion itself.
  ptx::pdl_launch_dependents();
  quant_detail::prefetch_first_units(p, (uint64_t(blockIdx.x) * kThreads + threadIdx.x) >> 5);
  // Before any global access: route_row comes from the dispatch kernel, and the buffers written
  // here may still be read by a kernel of the previous run.
  ptx::pdl_wait();
  if (threadIdx.x == 0) LOOM_TRACE(kQuantWaited);
  quant_detail::quant_gather_body(p, (uint64_t(blockIdx.x) * kThreads + threadIdx.x) >> 5,
                                  (uint64_t(gridDim.x) * kThreads) >> 5, int64_t(blockIdx.x) * kThreads + threadIdx.x,
                                  int64_t(gridDim.x) * kThreads);
  if (threadIdx.x == 0) LOOM_TRACE(kQuantEnd);
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

}  // namespace

int64_t quant_gather_threads(const QuantGatherParams& p) {
  const int64_t units = int64_t(p.tokens) * ((int64_t(p.hidden_dim) + 127) / 128);
  const int64_t zero4 = p.zero_out ? int64_t(p.tokens) * p.zero_cols / 4 : 0;
  return std::max(units * quant_detail::kLanesPerUnit, (zero4 + 7) / 8);
}

void check_quant_gather(const QuantGatherParams& p) {
  static const std::string who = "quant_gather: ";
  if (p.tokens < 0) throw Error(who + "tokens must be >= 0, got " + std::to_string(p.tokens));
  if (p.tokens == 0) return;
  if (p.hidden_dim <= 0 || p.hidden_dim % 16 != 0)
    throw Error(who + "hidden_dim must be a positive multiple of 16, got " + std::to_string(p.hidden_dim));
  if (p.topk <= 0) throw Error(who + "topk must be positive, got " + std::to_string(p.topk));
  if (p.padded_rows <= 0 || p.padded_rows % 4 != 0)
    throw Error(who + "padded_rows must be a positive multiple of 4, got " + std::to_string(p.padded_rows));
  if ((!p.hidden && !p.codes) || !p.a_sorted || !p.a_scales || (p.codes && !p.code_scales))
    throw Error(who + "null buffer");
  if (p.codes && (reinterpret_cast<uintptr_t>(p.codes) & 15u))
    throw Error(who + "pre-quantised codes must be 16-byte aligned");
  if (!p.route_row && p.padded_rows < p.tokens)
    throw Error(who + "token order needs padded_rows >= tokens, got " + std::to_string(p.padded_rows));
  if (!aligned16(p.hidden) || !aligned16(p.a_sorted)) throw Error(who + "hidden and a_sorted must be 16-byte aligned");
  if (p.fragment_order && (p.route_row || p.hidden_dim % 128 != 0))
    throw Error(who + "the A-fragment code order is for token order with hidden_dim a multiple of 128");
  if (p.zero_out && (p.zero_cols < 0 || !aligned16(p.zero_out)))
    throw Error(who + "zero_out must be 16-byte aligned with zero_cols >= 0");
  if (p.zero_word_count < 0 || (p.zero_word_count > 0 && !p.zero_words))
    throw Error(who + "zero_word_count needs zero_words");
  const int64_t groups = (int64_t(p.hidden_dim) + 127) / 128;
  const int64_t units = int64_t(p.tokens) * groups;
  if (int64_t(p.tokens) * p.topk > INT32_MAX || units > INT32_MAX) throw Error(who + "problem too large");
}

void launch_quant_gather(const QuantGatherParams& p, cudaStream_t stream, bool pdl) {
  check_quant_gather(p);
  if (p.tokens == 0) return;

  // A grid-stride loop covers anything beyond the cap.
  int64_t blocks = (quant_gather_threads(p) + kThreads - 1) / kThreads;
  if (blocks > (int64_t(1) << 20)) blocks = int64_t(1) << 20;
  launch_kernel(quant_gather_kernel, dim3(unsigned(blocks)), dim3(kThreads), 0, stream, pdl, p);
}

}  // namespace loom
