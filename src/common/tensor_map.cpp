#include "common/tensor_map.hpp"

#include <cuda_runtime.h>

#include <mutex>
#include <string>

#include "loom/types.hpp"

namespace loom {

namespace {
using EncodeFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                              const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                              CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeFn encode_fn() {
  static EncodeFn fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) ==
            cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<EncodeFn>(p);
  });
  if (!fn) throw Error("cuTensorMapEncodeTiled is not available from the CUDA driver");
  return fn;
}
}  // namespace

CUtensorMap make_tensor_map_2d(const void* base, CUtensorMapDataType dtype, int elem_bytes, uint64_t rows,
                               uint64_t cols, uint64_t row_stride_bytes, uint32_t box_rows, uint32_t box_cols,
                               TmaSwizzle swizzle, TmaL2Promotion promotion) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {row_stride_bytes};
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encode_fn()(&map, dtype, 2, const_cast<void*>(base), dims, strides, box, elem_strides,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE,
                                 swizzle == TmaSwizzle::b128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                                 promotion == TmaL2Promotion::none   ? CU_TENSOR_MAP_L2_PROMOTION_NONE
                                 : promotion == TmaL2Promotion::b64  ? CU_TENSOR_MAP_L2_PROMOTION_L2_64B
                                 : promotion == TmaL2Promotion::b128 ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B
                                                                     : CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw Error("cuTensorMapEncodeTiled rejected a " + std::to_string(rows) + "x" + std::to_string(cols) +
                " tensor with box " + std::to_string(box_rows) + "x" + std::to_string(box_cols) + " (CUresult " +
                std::to_string(int(r)) + ")");
  return map;
}

}  // namespace loom
