// One launch of a BF16 tokens-on-M instance from checked params (launch_gemm_bf16 checks them):
// its TMA descriptors and arguments. The launcher's, and the lab's variants' (lab/bf16_variants/):
// row_token (A by token: x is then the token-order rows [x_rows = T, K]) and out_rows (the output's
// rows, >= offsets[E]; 0: x_rows) are theirs only.
#pragma once

#include <cuda.h>

#include "common/tensor_map.hpp"
#include "gemm/gemm_bf16.hpp"
#include "gemm/kernel/bf16_tokens_on_m_kernel.cuh"
#include "gemm/kernel/bf16_weights_on_m_kernel.cuh"
#include "gemm/kernel/grouped_gemm_sm90.cuh"

namespace loom::gemm {

// The arguments both kernels take alike (their Args name these fields the same).
template <class Args>
Args bf16_args(const GemmBf16Params& p, int block_k) {
  Args a{};
  a.offsets = p.offsets;
  a.counts = nullptr;
  a.stride = 0;
  a.row_weight = p.row_weight;
  a.out = p.out;
  a.experts = p.experts;
  a.n = p.n;
  a.k = p.k;
  a.kblocks = (p.k + block_k - 1) / block_k;
  a.inter = p.inter;
  a.store_bf16 = p.store_bf16 ? 1 : 0;
  return a;
}

template <class K>
void launch_bf16_instance(const GemmBf16Params& p, int grid, cudaStream_t stream, bool pdl,
                          const int32_t* row_token = nullptr, int64_t out_rows = 0) {
  namespace tm = bf16_tokens_on_m;
  const bool act = p.epilogue == Bf16Epilogue::act;
  const bool tokens = row_token != nullptr;
  Bf16TokensOnMMaps maps{};
  if (!tokens)  // (by token the producer copies A by cp.async from x)
    maps.x = make_tensor_map_2d(p.x, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, uint64_t(p.x_rows), uint64_t(p.k),
                                uint64_t(p.k) * 2, tm::kBoxRows, tm::kBlockK, TmaSwizzle::b128);
  maps.w = make_tensor_map_2d(p.weights, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, uint64_t(p.experts) * p.n,
                              uint64_t(p.k), uint64_t(p.k) * 2, tm::kBoxRows, tm::kBlockK, TmaSwizzle::b128);
  if (K::kOutBytes > 0 && (act || p.store_bf16)) {
    const uint64_t rows = uint64_t(out_rows > 0 ? out_rows : p.x_rows), cols = uint64_t(act ? p.inter : p.n);
    maps.out = make_tensor_map_2d(p.out, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, rows, cols, cols * 2, 64,
                                  tm::kOutBoxCols, TmaSwizzle::b128);
  }
  auto a = bf16_args<Bf16TokensOnMArgs>(p, tm::kBlockK);
  a.col_blocks = act ? (p.inter + tm::kBoxRows - 1) / tm::kBoxRows : (p.n + tm::kTileCols - 1) / tm::kTileCols;
  a.row_token = row_token;
  a.x = tokens ? reinterpret_cast<const uint16_t*>(p.x) : nullptr;
  launch_grouped_gemm<K>(maps, a, grid, launch_smem_bytes<K>, stream, pdl);
}

// The weights-on-M (decode) kernel's launch: the same params.
template <class K>
void launch_bf16_wm_instance(const GemmBf16Params& p, int grid, cudaStream_t stream, bool pdl) {
  namespace wm = bf16_weights_on_m;
  const bool act = p.epilogue == Bf16Epilogue::act;
  Bf16WeightsOnMMaps maps{};
  maps.x = make_tensor_map_2d(p.x, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, uint64_t(p.x_rows), uint64_t(p.k),
                              uint64_t(p.k) * 2, wm::kChunk, wm::kBlockK, TmaSwizzle::b128);
  maps.w = make_tensor_map_2d(p.weights, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, uint64_t(p.experts) * p.n,
                              uint64_t(p.k), uint64_t(p.k) * 2, act ? wm::kActBoxRows : wm::kRowsBoxRows, wm::kBlockK,
                              TmaSwizzle::b128);
  auto a = bf16_args<Bf16WeightsOnMArgs>(p, wm::kBlockK);
  a.col_blocks = act ? (p.inter + wm::kActColumns - 1) / wm::kActColumns
                     : (p.n + wm::kRowsBoxRows - 1) / wm::kRowsBoxRows;
  launch_grouped_gemm<K>(maps, a, grid, launch_smem_bytes<K>, stream, pdl);
}

}  // namespace loom::gemm
