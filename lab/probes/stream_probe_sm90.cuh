// `loom stream-probe`: how fast one CTA per SM streams the seed workload's expert weights from HBM
// by TMA into a shared-memory ring when nothing consumes them (a consumer warp frees each stage as
// soon as it lands): the ceiling of the GEMMs' weight stream, apart from their MMA loops.
//
// The data is 256 MiB (the qwen35-single weight array's size) viewed as rows of `pitch` bytes, in
// two copies read by turns so every launch starts with none of its bytes in L2. Units are
// `unit_rows` consecutive rows, dealt round robin to the CTAs, as gemm_fp8_regs deals them.
// Variants (those whose ring fits the geometry's stages):
//   - the GEMMs' boxes: unit_rows x 128 bytes (one K block, 128-byte swizzle), K blocks in order,
//     at several ring depths, issued one stage at a time or in pairs, one or two CTAs per SM, with
//     the K blocks rotated, whole units prefetched into L2 ahead, and each L2 fetch promotion;
//   - 1-D bulk copies of a stage's bytes (a unit's rows are contiguous);
//   - the speed-of-light reader (`loom bench`'s floor: 16-byte loads or bulk copies), its fastest
//     configuration, over the same bytes.
// Reported: median microseconds of a launch and bytes per second over the whole device.
#pragma once

#include <ostream>
#include <string>

namespace loom::bench {

struct StreamProbeOptions {
  int repeats = 20;  // timed launches per variant (copies by turns); the median is reported
  // The bytes' geometry: rows of `pitch` bytes (a multiple of 128), units of `unit_rows` rows (8 to
  // 256, a multiple of 8), boxes of unit_rows x 128 bytes. Default: the FP8 GEMMs' (K = 2048 e4m3,
  // 128-row units); the BF16 layer's are 6144 (w13, K = 3072 bf16) and 3072 (w2) bytes.
  int64_t pitch = 2048;
  int unit_rows = 128;
};

// Prints progress to `log`; returns the table.
std::string run_stream_probe(const StreamProbeOptions& opt, std::ostream& log);

}  // namespace loom::bench
