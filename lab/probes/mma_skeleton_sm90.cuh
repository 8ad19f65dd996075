// `loom skeleton`: the K-block loop of a block-scaled FP8 GEMM with every global access taken out,
// to measure what the loop's own synchronisation and promotion let the tensor pipe do.
//
// One CTA per SM runs `kblocks` 128-byte-wide K blocks (128 e4m3, or 64 bf16) per consumer warpgroup over a ring of 4 stages
// (a producer thread cycles the stages' full / empty mbarriers as the real kernels' TMA producer
// does, without copying anything). Per K block a consumer warpgroup waits for its stage, issues
// its four wgmma m64n128k32 (A from registers, regrouped as gemm_fp8_regs does, or from shared
// memory), waits for them, frees the stage and (optionally) promotes the block accumulator into a
// final one with two per-row scales read from shared memory. Variants: two or three consumer
// warpgroups, an n256 tile, the next block's operands before the promotion, and two block
// accumulators with the next block's MMAs issued before the wait; and tokens on the MMA's N side
// (weights on M, the resident-rows GEMM's orientation) at widths 48-80, promoted by column, with
// one or four weight blocks per K block; and bf16 operands (m64n128k16 from shared memory, four per
// 64-element K block, no promotion: the BF16 layer's loop) (run_skeleton lists them).
// Operands are fixed tiles: the figure is the loop, not the data.
//
// Reported per variant: SM cycles per K block per warpgroup (tokens on N: per weight tile, one
// weight block's K block), and the tensor pipe's share, i.e. the
// cycles of the MMAs alone (m64nNk32 at 4096 e4m3 multiply-adds per SM per cycle = N/2 cycles)
// over the cycles taken.
#pragma once

#include <iosfwd>
#include <string>

namespace loom::bench {

struct SkeletonOptions {
  int kblocks = 4096;  // K blocks per consumer warpgroup
  int repeats = 5;     // launches per variant; the median is reported
};

// Prints progress to `log`; returns the table.
std::string run_skeleton(const SkeletonOptions& opt, std::ostream& log);

}  // namespace loom::bench
