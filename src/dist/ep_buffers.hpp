// What one rank reserves for expert parallelism's dispatch and combine (issue 49). Row counts are
// known only on the device (graph capture), so every peer gets fixed segments in each buffer,
// written without knowing the other peers' counts. The token form: a token travels once to each
// rank that owns one of its experts; each route's output comes back as its own row.
//
//   send       [P][tokens_per_peer] token rows, by destination (this rank's tokens)
//   recv       [P][tokens_per_peer] token rows, by source (tokens routed to this rank's experts)
//   out_local  [P][rows_per_peer] bf16 [H] outputs of the routes received, by source, to send back
//   out_back   [P][rows_per_peer] bf16 [H] outputs of this rank's routes, by owner
//
// A token row carries the activations (BF16: H values; FP8: H codes and ceil(H/128) fp32 scales)
// and, for each of its k slots, the local expert id (int32, -1 where another rank owns the
// expert), the top-k weight (fp32) and the return row (int32), each part 16-byte aligned. Both
// caps are tunable: by default twice a balanced share, ceil(2 T k / P) rounded up to 16, at most
// T tokens and T k routes (which no routing exceeds). Routes past a cap are not sent; the run
// counts them in its status (EpStatus::overflow_routes), so none is lost silently. With C > 1
// parts each cap is rounded up to C times a multiple of 4 (each part holds cap / C rows a peer,
// their ids and weights 16-byte aligned).
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
  int64_t tokens_per_peer = 0;  // token rows a rank sends one peer; 0: the default cap
  int64_t rows_per_peer = 0;    // route rows one peer returns; 0: the default cap
  int chunks = 1;               // C in [1, kMaxChunks]
};

constexpr int kMaxChunks = 8;

struct Buffers {
  int64_t tokens_per_peer = 0, rows_per_peer = 0;  // the caps, rounded to whole parts
  int64_t row_bytes = 0;         // one token row
  int64_t return_row_bytes = 0;  // one returned row (bf16 [H])
  size_t send = 0, recv = 0, out_local = 0, out_back = 0;
  size_t total() const { return send + recv + out_local + out_back; }
};

int64_t default_rows_per_peer(int64_t tokens, int64_t topk, int ranks);
int64_t default_tokens_per_peer(int64_t tokens, int64_t topk, int ranks);  // the same, at most T

// Throws loom::Error on an invalid spec (sizes out of range, a cap below zero or above T tokens or
// T k routes).
Buffers buffer_bytes(const BufferSpec& spec);

}  // namespace loom::dist
