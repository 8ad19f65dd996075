// Host-side TMA descriptors (cuTensorMapEncodeTiled, reached through the runtime's driver entry
// point so nothing links libcuda directly).
#pragma once

#include <cuda.h>

#include <cstdint>

namespace loom {

enum class TmaSwizzle { none, b128 };
// How far L2 widens the DRAM fetch of a box row it misses on (CUtensorMapL2promotion). b256 is the
// usual choice; 128-byte box rows of a large stream read faster with b128 (`loom stream-probe`).
enum class TmaL2Promotion { none, b64, b128, b256 };

// A 2-D row-major tensor [rows, cols] of `elem_bytes` elements with row pitch `row_stride_bytes`,
// read in boxes of [box_rows, box_cols]. Out-of-bounds elements of a box read as zero.
// Throws loom::Error when the driver rejects the description.
CUtensorMap make_tensor_map_2d(const void* base, CUtensorMapDataType dtype, int elem_bytes, uint64_t rows,
                               uint64_t cols, uint64_t row_stride_bytes, uint32_t box_rows, uint32_t box_cols,
                               TmaSwizzle swizzle, TmaL2Promotion promotion = TmaL2Promotion::b256);

}  // namespace loom
