// `loom stream-probe`: how fast one CTA per SM streams the seed workload's expert weights from HBM
// by TMA into a shared-memory ring when nothing consumes them (a consumer warp frees each stage as
// soon as it lands): the ceiling of the GEMMs' weight stream, apart from their MMA loops.
//
// The data is the qwen35-single weight array (E=256, N=512, K=2048 e4m3: 256 MiB), in two copies
// read by turns so every launch starts with none of its bytes in L2. Units are (expert, 128 weight
// rows) in expert order, dealt round robin to the CTAs, as gemm_fp8_regs deals them. Variants:
//   - the GEMMs' boxes: 128 rows x 128 bytes (one K block, 128-byte swizzle), K blocks in order,
//     at several ring depths, issued one stage at a time or in pairs, one or two CTAs per SM, with
//     the K blocks rotated, whole units prefetched into L2 ahead, and each L2 fetch promotion;
//   - 1-D bulk copies of 16 KiB (a unit's 256 KiB are contiguous: eight whole rows per copy);
//   - the speed-of-light reader (`loom bench`'s floor: 16-byte loads or bulk copies), its fastest
//     configuration, over the same bytes.
// Reported: median microseconds of a launch and bytes per second over the whole device.
#pragma once

#include <ostream>
#include <string>

namespace loom::bench {

struct StreamProbeOptions {
  int repeats = 20;  // timed launches per variant (copies by turns); the median is reported
};

// Prints progress to `log`; returns the table.
std::string run_stream_probe(const StreamProbeOptions& opt, std::ostream& log);

}  // namespace loom::bench
