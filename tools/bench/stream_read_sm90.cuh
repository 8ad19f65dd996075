// Streaming read of segments of device memory (16-byte loads or bulk copies): the memory speed of
// light (reads exactly the bytes a decode MoE must move) and the L2 flush between timed runs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace loom::bench {

// Up to two groups of equally sized segments, e.g. w13 and w2 of the routed experts. Segment s of
// group g starts at base + seg_ids[s] * stride and is `bytes` long.
struct ReadGroup {
  const void* base = nullptr;
  int64_t stride = 0;  // bytes between consecutive segment ids (multiple of 16)
  int64_t bytes = 0;   // bytes per segment (multiple of 16)
};

// Two readers: 16-byte loads (threads x unroll in flight per CTA), or, with bulk_stages > 0, 1-D
// bulk copies (TMA) of up to 16 KiB into a ring of that many shared-memory stages, which four
// consumer warps hash and free (`threads` and `unroll` unused). The bulk reader is the faster one
// on large passes (`loom stream-probe`), so the speed of light sweeps both.
struct ReadConfig {
  int ctas_per_sm = 8;
  int threads = 512;
  int unroll = 4;  // 1, 2, 4 or 8 independent 16-byte loads per thread in flight
  int bulk_stages = 0;  // 0: the load reader; 4, 6, 8 or 12: the bulk reader's ring depth
  int bulk_run = 1;  // bulk reader: consecutive chunks dealt to a CTA at a time; 0: one span per CTA
  std::string str() const;
};

struct ReadArgs {
  ReadGroup group[2];
  int groups = 1;
  const int32_t* seg_ids = nullptr;  // device [segments]
  int64_t segments = 0;
  uint32_t* sink = nullptr;  // device word, written only if the data hashes to an impossible value
  bool checksum = false;     // tests: XOR of every 32-bit word read is accumulated into *sink
  int64_t total_bytes() const { return segments * (group[0].bytes + (groups > 1 ? group[1].bytes : 0)); }
};

// Enqueues one pass over every byte of every segment. Throws loom::Error on a bad config.
void launch_stream_read(const ReadArgs& args, const ReadConfig& cfg, int sm_count, cudaStream_t stream);

}  // namespace loom::bench
