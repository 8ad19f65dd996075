// Grouped FP8 GEMM for batches of tens of rows per expert with every expert hit
// (GemmFp8Config::resident_rows): weight rows on the MMA's M side (64 per consumer warpgroup, 128
// per weight tile), an expert's token rows on its N side, and those rows resident in shared memory
// over all of K while the expert's whole weight matrix streams past them. Each weight tile is read
// once per expert chunk and each activation row once per expert, and no MMA is wider than the
// chunk's rows rounded up to 16.
//
// Unit: (expert, chunk of at most resident_rows_capacity(K) rows); an expert with more rows takes
// several chunks, each of which streams the expert's weights again. The first round of units goes
// by block index, the rest from a global queue (GemmFp8Config::dynamic) or round robin.
// Producer warpgroup:
//   - thread 0 streams each unit's N/128 x K/128 weight tiles by TMA through a 5-stage ring;
//   - warp 1 writes each unit's tokens, top-k weights and weight scales into a 2-slot record ring,
//     one unit ahead (it takes the queue's units);
//   - warps 2-3 gather the unit's token rows by cp.async into one shared-memory slot per K block
//     (128-byte swizzled as TMA would write them), with their activation scales. Slot kb is
//     refilled for the next unit as soon as the consumers' last weight block has read it.
//
// Per weight tile: four wgmma m64nWk32 (W in {16, 32, 48}) into a block accumulator, then
// final += block * weight_scale * activation_scale(column). After a weight block's K blocks, each
// consumer warpgroup puts topk_weight * final into a staging block of its own, one token per row,
// and adds each token's 64 outputs into out[token, :] by one bulk reduction (cp.reduce.async.bulk).
// Fast (atomic) combine only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/device_info.hpp"
#include "gemm/gemm_fp8.hpp"

namespace loom {

// The most rows of one expert a unit holds in shared memory over all of K (a multiple of 16, at
// most 48; 48 at K=2048), or 0 where the kernel cannot take N and K: K not a multiple of 128, too
// large to hold 16 rows, or a unit's weight scales (N/128 x K/128) more than its record holds.
int resident_rows_capacity(int64_t n, int64_t k);

// Throws loom::Error for what the kernel cannot take (store combine, N and K outside
// resident_rows_capacity, N not a multiple of 16, more than 512 experts, x_rows * K from 2^31,
// options of the other kernels) and on launch failure.
void launch_gemm_fp8_resident(const GemmFp8Params& p, const GemmFp8Config& cfg, const DeviceInfo& device,
                              cudaStream_t stream, bool pdl);

}  // namespace loom
