// Grouped FP8 GEMM for batches where experts have tens of rows or more (XSource::
// token_fragments): token rows on the MMA's M side, weight rows on its N side, and no
// expert-sorted copy of the activations to write first.
//
// Tile: 128 of an expert's rows (two consumer warpgroups of 64) x 128 weight rows, over all of K;
// or, wide (GemmFp8Config::wide_tiles), 64 rows x 256 weight rows, each consumer warpgroup one
// 128-row weight block of the same 64 rows (a K block then fills two ring stages).
// Units (row tile, weight block) go round robin, the last round's worth from a global queue
// (GemmFp8Config::dynamic). Producer warpgroup: warp 0 streams the weight tiles by TMA into a
// 4-stage ring; warp 1 walks the units (it fetches the queue's) and loads each unit's row tokens,
// top-k weights and weight scales into a ring of unit records two units ahead, from which warp 0
// takes the queue's units; warp 2 loads each stage's activation scales of the tile's rows (L1-cached
// loads) into the stage; warp 3 is the combine in atomic mode (below). Each consumer thread copies
// its two rows' bytes for a K block from the token-order codes (the quantiser lays them out in
// wgmma A-fragment order: fragment_word, device_layout.hpp) by cp.async into its own chunks of a
// shared-memory ring, three K blocks ahead (two in wide tiles), one group
// per block, and regroups a block's chunks into A-fragment registers when it computes on it (a slot
// is refilled as soon as its block's MMAs are issued); the next unit's first blocks are copied
// during this unit's last.
//
// Per 128-wide K block: four wgmma m64n128k32 (A from registers) into a block accumulator, then
// final += block * weight_scale * activation_scale(row) once the block's MMAs complete; the other
// warpgroup's MMAs run meanwhile. Epilogue, atomic mode: each consumer warpgroup puts topk_weight
// * final into a shared-memory block, and warp 3 adds every row into out[token, :] by one bulk
// reduction (cp.reduce.async.bulk .add.f32) while the warpgroup goes on to its next unit. Store
// mode: y[row, n] = topk_weight * final from registers.
#pragma once

#include <cuda_runtime.h>

#include <ostream>

#include "common/device_info.hpp"
#include "gemm/gemm_fp8.hpp"

namespace loom {

// Throws loom::Error for what the kernel cannot take (K not a multiple of 128, below 384 or above
// 8192, N not a multiple of 16, more than 512 experts, x_rows * K from 2^31, options of the other
// kernel) and on launch failure.
void launch_gemm_fp8_regs(const GemmFp8Params& p, const GemmFp8Config& cfg, const DeviceInfo& device,
                          cudaStream_t stream, bool pdl);

// The phase profile (a build configured with -DLOOM_PHASE_PROFILE=ON; `loom bench --phase-profile`):
// the kernel adds the cycles each role spends per phase (waits, MMAs, promotion, epilogue) into
// device counters. reset zeroes them; print reads them (synchronous) and prints per-CTA and per-K-block
// means for a run of `kblocks` K blocks. Without the option both do nothing.
bool gemm_regs_phase_profile_built();
void gemm_regs_phase_profile_reset();
void gemm_regs_phase_profile_print(std::ostream& log, int kblocks);

}  // namespace loom
