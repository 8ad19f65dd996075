// The BF16 grouped GEMM's host entry: checks, TMA descriptors, arguments, launch.
#include <cuda.h>

#include <string>

#include "common/tensor_map.hpp"
#include "gemm/gemm_bf16.hpp"
#include "gemm/instances/instances.cuh"

namespace loom {

void launch_gemm_bf16(const GemmBf16Params& p, const DeviceInfo& device, cudaStream_t stream, bool pdl) {
  namespace tm = gemm::bf16_tokens_on_m;
  static const std::string who = "bf16 GEMM (tokens on M): ";
  const bool act = p.epilogue == Bf16Epilogue::act;
  if (p.n <= 0 || p.k <= 0 || p.n % 16 || p.k % 16)
    throw Error(who + "N and K must be positive multiples of 16, got N=" + std::to_string(p.n) +
                ", K=" + std::to_string(p.k));
  if (act && (p.inter <= 0 || p.n != 2 * p.inter))
    throw Error(who + "the SiLU*up epilogue runs w13: N = 2 inter, got N=" + std::to_string(p.n) + ", inter=" +
                std::to_string(p.inter));
  if (p.experts <= 0 || p.experts > kGpuMaxExperts)
    throw Error(who + "experts must be in [1, " + std::to_string(kGpuMaxExperts) + "]");
  if (!p.weights || !p.x || !p.offsets || !p.out) throw Error(who + "null device pointer");
  if (int64_t(p.experts) * p.n >= (int64_t(1) << 31) || p.x_rows <= 0 || p.x_rows >= (int64_t(1) << 31))
    throw Error(who + "sizes exceed the kernel's 32-bit coordinates");
  if (reinterpret_cast<uintptr_t>(p.weights) % 16 || reinterpret_cast<uintptr_t>(p.x) % 16 ||
      reinterpret_cast<uintptr_t>(p.out) % 8)
    throw Error(who + "weights and rows must be 16-byte aligned, the output 8-byte aligned");
  gemm::Bf16TokensOnMMaps maps{};
  maps.x = make_tensor_map_2d(p.x, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, uint64_t(p.x_rows), uint64_t(p.k),
                              uint64_t(p.k) * 2, tm::kBoxRows, tm::kBlockK, TmaSwizzle::b128);
  maps.w = make_tensor_map_2d(p.weights, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, uint64_t(p.experts) * p.n,
                              uint64_t(p.k), uint64_t(p.k) * 2, tm::kBoxRows, tm::kBlockK, TmaSwizzle::b128);
  gemm::Bf16TokensOnMArgs a{};
  a.offsets = p.offsets;
  a.counts = nullptr;
  a.stride = 0;
  a.row_weight = p.row_weight;
  a.out = p.out;
  a.experts = p.experts;
  a.n = p.n;
  a.k = p.k;
  a.kblocks = (p.k + tm::kBlockK - 1) / tm::kBlockK;
  a.col_blocks = act ? (p.inter + tm::kBoxRows - 1) / tm::kBoxRows : (p.n + tm::kTileCols - 1) / tm::kTileCols;
  a.inter = p.inter;
  a.store_bf16 = p.store_bf16 ? 1 : 0;
  // Persistent: one CTA per SM; the row tiles are known only on the device.
  using namespace gemm;
  if (act)
    launch_grouped_gemm<Sm90Bf16TmAct>(maps, a, device.sm_count, launch_smem_bytes<Sm90Bf16TmAct>, stream, pdl);
  else
    launch_grouped_gemm<Sm90Bf16TmRows>(maps, a, device.sm_count, launch_smem_bytes<Sm90Bf16TmRows>, stream, pdl);
}

}  // namespace loom
