// What one rank reserves for expert parallelism's dispatch and combine (issue 49). Row counts are
// known only on the device (graph capture), so every peer gets a fixed segment of rows_per_peer
// rows in each buffer, written without knowing the other peers' counts.
//
//   send       [P][rows_per_peer] dispatched rows, by destination (this rank's routes)
//   recv       [P][rows_per_peer] dispatched rows, by source (the routes to this rank's experts)
//   out_local  [P][rows_per_peer] bf16 [H] outputs of the received rows, by source, to send back
//   out_back   [P][rows_per_peer] bf16 [H] outputs returned to this rank, by destination
//   counts     [P] rows sent to each peer and [P] received from each peer (int64)
//
// A dispatched row carries the activations (FP8: H codes and ceil(H/128) fp32 scales; BF16: H
// values), its local expert id (int32) and its top-k weight (fp32), each part 16-byte aligned.
// rows_per_peer is a tunable cap: by default twice a balanced share, ceil(2 T k / P) rounded up to
// 16 rows and at most T k (which no routing can exceed). Routes beyond a peer's cap are not sent;
// the run counts them in its status (EpStatus::overflow_routes), so none is lost silently. With C > 1
// chunks the cap is rounded up to C times a multiple of 4 (each chunk holds rows_per_peer / C rows
// a peer, their ids and weights 16-byte aligned).
#pragma once

#include <cstddef>
#include <cstdint>

#include "loom/types.hpp"

namespace loom::dist {

struct BufferSpec {
  int64_t tokens = 0;  // the most tokens one rank's run carries (T)
  int64_t topk = 0;
  int64_t hidden = 0;
  DType dtype = DType::fp8;
  int ranks = 1;
  int64_t rows_per_peer = 0;  // 0: the default cap
  int chunks = 1;             // C in [1, kMaxChunks]
};

constexpr int kMaxChunks = 8;

struct Buffers {
  int64_t rows_per_peer = 0;
  int64_t row_bytes = 0;         // one dispatched row
  int64_t return_row_bytes = 0;  // one returned row (bf16 [H])
  size_t send = 0, recv = 0, out_local = 0, out_back = 0, counts = 0;
  size_t total() const { return send + recv + out_local + out_back + counts; }
};

int64_t default_rows_per_peer(int64_t tokens, int64_t topk, int ranks);

// Throws loom::Error on an invalid spec (sizes out of range, a cap below zero or above T k).
Buffers buffer_bytes(const BufferSpec& spec);

}  // namespace loom::dist
