// Expert parallelism's send and return sides on the device (issue 49), in the token form: each
// token travels once to each rank that owns one of its experts, with its k slots' local expert
// ids (-1 in the slots that rank does not own), weights and return rows; the owner sends back one
// row per route (or, with token_returns, one per token row: its routes there summed). Bit for bit
// dist::token_segments_ref. Rows travel in bf16, or for an FP8 layer as the codes and 1x128 scales
// the owner would make of them. launch_ep_send enqueues, in order:
//   ep_owner        dest[s] = owner of ids[s] (-1 out of range); mark[s] = dest[s] on the first
//                   slot of token t with that owner, P on its other slots, -1 when dropped
//   launch_dispatch over the marks as P + 1 "experts": each token's position among the tokens to
//                   a rank (token order), the per-rank token counts, the status (dropped routes,
//                   NaN tokens)
//   ep_buckets      route returns only: bucket[s] = q C + (the token's position mod C), or P C
//                   when the token is beyond the rank's token cap (its routes are not sent)
//   launch_dispatch route returns only, over the buckets: each route's position among the routes
//                   of its (rank, part) in slot order, its return row there
//   ep_pack_tokens  the token rows (FP8: quantised as they are packed), their ids, weights and
//                   return rows; slot_row[s] = where route s's output comes back, -1 if it is
//                   not sent; in the same launch the token rows past a rank's count (ids -1,
//                   weight 0, return -1) and the overflow (routes not sent: their token beyond
//                   the token cap or they beyond the return cap; with token returns ep_owner
//                   zeroes it and the pack adds to it)
// and on the owner, after its local plan ran the received rows up to the weighted route rows:
//   ep_return_rows  each route's weighted row into its return row.
// A rank's own segments go straight to where NCCL would have put them (self_rank, self_source).
// One stream, chained with PDL (each kernel waits before its first global access); no global
// scratch to clear first. With token returns (the default layer) that is three launches: ep_owner,
// the dispatch (one kernel up to 1024 routes, two past), ep_pack_tokens; and for a small batch
// (ep_send_small_fits) one, ep_send_small, whose every CTA builds the batch's token layout in
// shared memory and packs its share from it.
// Host-includable: plain declarations only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "contract/device_layout.hpp"
#include "loom/types.hpp"

namespace loom::dist {

// The placement as a kernel parameter (2 KiB): no device allocation, nothing to upload, so a run
// stays capturable.
struct EpTables {
  uint16_t owner[kGpuMaxExperts];
  uint16_t local[kGpuMaxExperts];
};

// Where position i of peer q's segment lies in a buffer of C parts, [C][P][per_peer / C] rows:
// row i / C of part i mod C, so a partly filled segment spreads evenly over the parts (C = 1: row
// q per_peer + i). Token rows (per_peer = tokens_per_peer) and return rows (rows_per_peer) alike.
__host__ __device__ inline int ep_send_row(int q, int i, int ranks, int per_peer, int chunks) {
  const int per_chunk = per_peer / chunks;
  return ((i % chunks) * ranks + q) * per_chunk + i / chunks;
}

struct EpSendParams {
  const uint16_t* hidden = nullptr;    // [T, H] bf16
  const int32_t* ids = nullptr;        // [T, k] global expert ids
  const float* weights = nullptr;      // [T, k]
  const uint8_t* nan_flags = nullptr;  // [T] or nullptr: counted into status
  int tokens = 0, topk = 0, hidden_dim = 0, experts = 0, ranks = 0;
  int chunks = 1;           // C, dividing both caps
  int tokens_per_peer = 0;  // token rows a rank sends one peer
  int rows_per_peer = 0;    // route rows one peer returns
  // Scratch, [T k] each unless said: written before read within one launch_ep_send.
  int32_t* dest = nullptr;
  int32_t* mark = nullptr;
  int32_t* tok_offsets = nullptr;  // [P + 2]
  int32_t* tok_row = nullptr;
  int32_t* bucket = nullptr;       // bucket, ret_*, scratch_status: route returns only
  int32_t* ret_offsets = nullptr;  // [P C + 2]
  int32_t* ret_row = nullptr;
  int32_t* row_token = nullptr;    // the dispatches' sorted-row outputs, unused here
  float* row_weight = nullptr;
  int32_t* slice_counts = nullptr;  // ep_send_slice_count_bytes
  LayerStatus* scratch_status = nullptr;
  // FP8 rows: each sent row is the layer's 1x128 quantisation of the token (codes in send_x, its
  // scales in send_scales), made as it is packed.
  bool fp8_rows = false;
  // Outputs.
  LayerStatus* status = nullptr;  // nan_tokens, dropped_routes (ids outside [0, E))
  uint8_t* send_x = nullptr;      // [C, P, tokens_per_peer / C] rows of H bf16 (2H bytes), or H codes
  float* send_scales = nullptr;   // FP8: [C, P, tokens_per_peer / C, ceil(H/128)] the rows' scales
  int32_t* send_ids = nullptr;    // [C, P, tokens_per_peer / C, k] local expert ids, -1 = none
  float* send_w = nullptr;        // [C, P, tokens_per_peer / C, k], 0 where the id is -1
  int32_t* send_ret = nullptr;    // [C, P, tokens_per_peer / C, k] the route's row in its part's return
                                  // segment from this rank, -1 where the id is -1; route returns only
  int32_t* slot_row = nullptr;    // [T, k] the route's row in the return buffer [C, P, rows_per_peer / C]
  uint32_t* overflow = nullptr;   // routes not sent
  // The owner returns one row per token row (its routes there summed), not one per route:
  // slot_row[s] of a token's first slot to a rank is that token row (plus P tokens_per_peer for
  // this rank's own, which are read from the owner's output that follows the returned rows), -1
  // on its other slots. rows_per_peer must then be tokens_per_peer k (no route cap). The routes'
  // return rows are not made: no buckets, no second dispatch, send_ret and recv_ret untouched.
  bool token_returns = false;
  // This rank (-1: none): its own segment goes straight into the receive buffers, whose segment
  // from itself has the same rows, so no copy of it travels through NCCL.
  int self_rank = -1;
  uint8_t* recv_x = nullptr;
  float* recv_scales = nullptr;
  int32_t* recv_ids = nullptr;
  float* recv_w = nullptr;
  int32_t* recv_ret = nullptr;
};

// Bytes of EpSendParams::slice_counts for batches of up to max_tokens tokens.
size_t ep_send_slice_count_bytes(int64_t max_tokens, int64_t topk, int ranks, int chunks);

// The whole send side. Throws loom::Error on a bad shape or a null pointer before any launch;
// T = 0 clears the counts and pads every row (the segments still travel).
void launch_ep_send(const EpTables& t, const EpSendParams& p, cudaStream_t stream);

// Its kernels, each alone (launch_ep_send checks the parameters once for all of them). pdl: launched
// with programmatic dependent launch; every kernel here waits for its predecessor before any global
// access.
void launch_ep_owner(const EpTables& t, const EpSendParams& p, cudaStream_t stream, bool pdl);
void launch_ep_buckets(const EpSendParams& p, cudaStream_t stream, bool pdl);
void launch_ep_pack_tokens(const EpTables& t, const EpSendParams& p, cudaStream_t stream, bool pdl);  // and pads

// The one-launch form: token returns, 1 <= T k <= kEpSendSmallRoutes, P <= 64 and the layout
// (8 T + 2 T P + T k bytes) within kEpSendSmallSmem. Bit for bit the three launches' outputs.
constexpr int kEpSendSmallRoutes = 1024;
constexpr size_t kEpSendSmallSmem = 40 * 1024;
bool ep_send_small_fits(const EpSendParams& p);
void launch_ep_send_small(const EpTables& t, const EpSendParams& p, cudaStream_t stream, bool pdl);

struct EpReturnParams {
  const int32_t* recv_ret = nullptr;   // [rows, k] one part's received return rows (-1: none)
  const int32_t* route_row = nullptr;  // [rows, k] the local run's row of each slot in y
  const uint16_t* y = nullptr;         // the local run's weighted route rows, bf16 [*, H]
  int rows = 0, topk = 0, hidden_dim = 0;
  int tokens_per_source = 0;  // received rows per source rank in this part: row r came from r / it
  int rows_per_source = 0;    // return rows per source rank in this part
  uint16_t* out = nullptr;    // [P, rows_per_source, H] this part's return segments
  // The source that is this rank (-1: none): its rows go straight to where the return lands,
  // self_out (the same rows of this part's returned segments), not through NCCL.
  int self_source = -1;
  uint16_t* self_out = nullptr;
};
void launch_ep_return_rows(const EpReturnParams& p, cudaStream_t stream, bool pdl);

}  // namespace loom::dist
