#include "quant/silu_mul_quant_sm90.cuh"

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "loom/types.hpp"
#include "ptx/pdl.cuh"
#include "quant/quant_gather_device.cuh"

namespace loom {
namespace {

using quant_detail::kLanesPerUnit;
using quant_detail::kUnitsPerWarp;
constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) silu_mul_quant_kernel(const SiluMulQuantParams p) {
  ptx::pdl_launch_dependents();
  // Before any global access: h and offsets come from the kernels before this one, and the
  // buffers written here may still be read by the previous run's GEMM 2.
  ptx::pdl_wait();
  const int64_t tid = int64_t(blockIdx.x) * kThreads + threadIdx.x, nth = int64_t(gridDim.x) * kThreads;
  // As quant_detail::clear_output does for the quantiser (kept apart: its kernels' code stays as measured).
  if (p.zero_words != nullptr && tid < p.zero_word_count) p.zero_words[tid] = 0;
  if (p.zero_out != nullptr) {
    const int64_t n4 = p.zero_count / 4;
    float4* z4 = reinterpret_cast<float4*>(p.zero_out);
    for (int64_t i = tid; i < n4; i += nth) z4[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int64_t i = n4 * 4 + tid; i < p.zero_count; i += nth) p.zero_out[i] = 0.0f;
  }

  const int I = p.inter;
  const uint32_t groups = uint32_t(I + 127) / 128u;
  const int64_t rows = min(int64_t(__ldcg(p.offsets + p.experts)), p.padded_rows);
  const uint64_t units = rows > 0 ? uint64_t(rows) * groups : 0u;
  const int lane = int(threadIdx.x & 31u), sub = lane & (kLanesPerUnit - 1);
  const uint64_t warp = uint64_t(tid) >> 5, warps = uint64_t(nth) >> 5;
  // Warp-uniform trip count: quantize_values shuffles across the whole warp.
  for (uint64_t base = warp * kUnitsPerWarp; base < units; base += warps * kUnitsPerWarp) {
    const uint64_t unit = base + uint64_t(lane / kLanesPerUnit);
    const bool unit_ok = unit < units;
    const int64_t row = unit_ok ? int64_t(unit / groups) : 0;
    const uint32_t g = unit_ok ? uint32_t(unit - uint64_t(row) * groups) : 0u;
    // The unit's 8 lanes read its 32 float4 of gate (and of up) as float4 8j + sub, j = 0..3: each
    // load instruction takes whole 32-byte sectors, which a streaming load must (a sector half read
    // is fetched again from HBM for its other half). x[4j .. 4j+3]: columns 128g + 32j + 4sub + 0..3;
    // columns past I (a last partial group; I is a multiple of 16) are 0, amax-neutral.
    const int64_t col0 = int64_t(g) * 128 + 4 * sub;
    float x[16];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t col = col0 + 32 * j;
      if (unit_ok && col < I) {
        const float4 gv = __ldcs(reinterpret_cast<const float4*>(p.h + row * 2 * I + col));  // read once
        const float4 uv = __ldcs(reinterpret_cast<const float4*>(p.h + row * 2 * I + I + col));
        x[4 * j + 0] = quant_detail::silu_mul(gv.x, uv.x);
        x[4 * j + 1] = quant_detail::silu_mul(gv.y, uv.y);
        x[4 * j + 2] = quant_detail::silu_mul(gv.z, uv.z);
        x[4 * j + 3] = quant_detail::silu_mul(gv.w, uv.w);
        if (p.act != nullptr)
          *reinterpret_cast<float4*>(p.act + row * I + col) = make_float4(x[4 * j], x[4 * j + 1], x[4 * j + 2], x[4 * j + 3]);
      } else {
        x[4 * j + 0] = x[4 * j + 1] = x[4 * j + 2] = x[4 * j + 3] = 0.0f;
      }
    }
    const quant_detail::UnitCodes q = quant_detail::quantize_values<false>(x);
    // Word j of the codes holds columns 32j + 4sub .. + 3 of the group: word 8j + sub of its row
    // (fragment order: fragment_word of it).
    uint32_t* group = reinterpret_cast<uint32_t*>(p.codes + row * I + int64_t(g) * 128);
    const uint32_t words[4] = {q.codes.x, q.codes.y, q.codes.z, q.codes.w};
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (unit_ok && col0 + 32 * j < I) group[p.fragment_order ? fragment_word(8 * j + sub) : 8 * j + sub] = words[j];
    if (unit_ok && sub == 0) p.scales[scale_index(p.scale_layout, g, row, p.padded_rows)] = q.scale;
  }
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

}  // namespace

void check_silu_mul_quant(const SiluMulQuantParams& p) {
  static const std::string who = "silu_mul_quant: ";
  if (p.padded_rows < 0 || p.padded_rows % 4 != 0)
    throw Error(who + "padded_rows must be a multiple of 4, got " + std::to_string(p.padded_rows));
  if (p.zero_count < 0 || (p.zero_count > 0 && (!p.zero_out || !aligned16(p.zero_out))))
    throw Error(who + "zero_count needs a 16-byte aligned zero_out");
  if (p.zero_word_count < 0 || (p.zero_word_count > 0 && !p.zero_words))
    throw Error(who + "zero_word_count needs zero_words");
  if (p.padded_rows == 0) return;
  if (p.inter <= 0 || p.inter % 16 != 0)
    throw Error(who + "inter must be a positive multiple of 16, got " + std::to_string(p.inter));
  if (p.experts <= 0) throw Error(who + "experts must be positive, got " + std::to_string(p.experts));
  if (!p.h || !p.offsets || !p.codes || !p.scales) throw Error(who + "null buffer");
  if (!aligned16(p.h) || !aligned16(p.codes) || (p.act && !aligned16(p.act)))
    throw Error(who + "h, codes and act must be 16-byte aligned");
  if (p.fragment_order && p.inter % 128 != 0)
    throw Error(who + "the A-fragment code order takes whole 128-groups: inter a multiple of 128, got " +
                std::to_string(p.inter));
  if (p.padded_rows * ((int64_t(p.inter) + 127) / 128) > INT32_MAX) throw Error(who + "problem too large");
}

void launch_silu_mul_quant(const SiluMulQuantParams& p, int sm_count, cudaStream_t stream, bool pdl) {
  check_silu_mul_quant(p);
  if (sm_count <= 0) throw Error("silu_mul_quant: sm_count must be positive, got " + std::to_string(sm_count));
  const int64_t units = p.padded_rows * ((int64_t(p.inter) + 127) / 128);
  const int64_t threads = std::max({units * kLanesPerUnit, (p.zero_count + 3) / 4, int64_t(p.zero_word_count)});
  if (threads == 0) return;
  const int64_t blocks = std::min<int64_t>((threads + kThreads - 1) / kThreads, int64_t(8) * sm_count);
  launch_kernel(silu_mul_quant_kernel, dim3(unsigned(blocks)), dim3(kThreads), 0, stream, pdl, p);
}

}  // namespace loom
