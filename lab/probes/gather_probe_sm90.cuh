// `loom gather-probe`: how fast one CTA per SM can gather activation rows by token from L2, the
// way a GEMM that reads no expert-sorted copy must, and whether the shared memory the CTA reserves
// (and so the L1 left beside it) limits that.
//
// The data is a T=8192, K=2048 e4m3 code matrix (16 MiB, L2-resident after the first pass) and a
// list of random token rows. Each CTA walks 128-row tiles of the list, K block by K block (128
// bytes of each row per block, as a GEMM stage takes them), either
//   - by cp.async (16 bytes per thread and copy) into a 4-slot ring of 16 KiB tiles in shared
//     memory, three blocks in flight; or
//   - by 16-byte loads into a 3-block register ring (gemm_fp8_regs' way), each block consumed
//     when the ring wraps; or
//   - by TMA, one {128-byte, 1-row} box per row and block (128-byte swizzle), issued by one warp's
//     lanes into a 4-slot ring: the gather a tokens-on-N GEMM would use without the cp.async
//     copies' per-thread issue cost.
// The kernel reserves 72, 144 or 200 KiB of dynamic shared memory (the ring inside it), and at 72
// KiB asks for the smallest and the largest shared-memory carve-out (so the L1 beside it is ~156
// or ~28 KiB). Reported: bytes gathered per second over the whole device.
#pragma once

#include <string>

namespace loom::bench {

struct GatherProbeOptions {
  int tiles_per_cta = 32;  // 128-row tiles per CTA, each over K = 2048 (16 blocks)
  int repeats = 5;         // launches per variant; the median is reported
};

// Prints progress to `log`; returns the table.
std::string run_gather_probe(const GatherProbeOptions& opt, std::ostream& log);

}  // namespace loom::bench
