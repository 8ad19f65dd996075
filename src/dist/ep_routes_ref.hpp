// CPU reference of expert parallelism's data movement (issue 49): where each route of a rank is
// sent, where the received rows sit on their owner, and the combine of the returned rows in slot
// order. The device dispatch and combine (to come: they need several GPUs to run) are checked
// against it; ep_world_ref runs all P ranks on the CPU and equals the one-GPU layer's reference.
//
// Order: a rank's send rows are grouped by destination rank (ascending), within one in slot order
// t k + j; a rank's received rows are grouped by source rank (ascending), each group in the
// sender's order. The owner returns each row's output in its received position, so the sender
// finds slot (t, j)'s output where it sent the route.
#pragma once

#include <cstdint>
#include <vector>

#include "dist/placement.hpp"
#include "pipeline/layer_ref.hpp"
#include "route/route_ref.hpp"

namespace loom::dist {

struct SendLayout {
  std::vector<int64_t> counts;         // [P] rows this rank sends to each rank (itself included)
  std::vector<int64_t> offsets;        // [P + 1] exclusive scan of counts
  std::vector<int32_t> slot;           // [rows] each send row's route slot t k + j
  std::vector<int32_t> local_expert;   // [rows] its expert's index on the destination rank
  std::vector<int32_t> position;       // [T k] each slot's send row, -1 where the id is out of range
  int64_t dropped = 0;                 // routes with an id outside [0, E): not sent, counted
};

// ids: [T, k] global expert ids of this rank's tokens.
SendLayout send_layout_ref(const Placement& p, const int32_t* ids, int64_t tokens, int64_t topk);

// The token form (the next device form, journal session 49): each token goes once to each rank
// that owns one of its experts, with its k slots' local expert ids, -1 in the slots that rank does
// not own; the owner returns one row per route. A rank's send rows are grouped by destination
// (ascending), within one in token order.
struct TokenSendLayout {
  std::vector<int64_t> counts;     // [P] tokens this rank sends to each rank
  std::vector<int64_t> offsets;    // [P + 1]
  std::vector<int32_t> token;      // [rows] each send row's token
  std::vector<int32_t> local_ids;  // [rows, k] each slot's local expert on the destination, or -1
  // [T k] each route's row in its owner's return segment: its place among this rank's routes to
  // that owner in slot order (SendLayout::position minus the owner's offset); -1 when dropped.
  std::vector<int32_t> return_row;
  int64_t dropped = 0;
};
TokenSendLayout send_tokens_ref(const Placement& p, const int32_t* ids, int64_t tokens, int64_t topk);

// The owner's side of one source's segment: rows token rows of k local ids (-1 = not this rank's);
// each valid slot, in row order and slot order within a row, takes the next return row. [rows, k],
// -1 where the slot is not valid. For every route this equals the sender's return_row, with no
// count exchanged: the invariant the token form rests on.
std::vector<int32_t> owner_return_rows_ref(const int32_t* local_ids, int64_t rows, int64_t topk);

// The token form's send buffers as the device writes them (dist/ep_send_sm90.cuh), caps and parts
// included: token i to rank q (token order) is sent when i < tokens_per_peer, in part i mod C at
// row ep_send_row(q, i, P, tokens_per_peer, C); the routes of rank q's tokens in part c take
// return rows in slot order, those past rows_per_peer / C not sent (nor computed: id -1).
struct TokenSegments {
  std::vector<int32_t> token;     // [P tokens_per_peer] each send row's token, -1 = padding
  std::vector<int32_t> ids;       // [P tokens_per_peer, k] local expert ids, -1 = none
  std::vector<int32_t> slot;      // [P tokens_per_peer, k] the route slot t k + j behind each id, -1
  std::vector<int32_t> ret;       // [P tokens_per_peer, k] the return row in the part's segment, -1
  std::vector<int32_t> slot_row;  // [T k] the route's row in the return buffer [C][P][rows_per_peer / C]
  // [T k] when the owners sum (token returns): on the token's first slot to each rank its send row
  // (the row its sum comes back to), -1 on the other slots and when the token is not sent.
  std::vector<int32_t> token_slot_row;
  std::vector<int64_t> tokens_to; // [P] tokens with a route to each rank (sent or not)
  int64_t overflow = 0;           // routes with an owner but not sent
  int64_t dropped = 0;            // ids outside [0, E)
};
TokenSegments token_segments_ref(const Placement& p, const int32_t* ids, int64_t tokens, int64_t topk,
                                 int64_t tokens_per_peer, int64_t rows_per_peer, int chunks);

// A rank's received rows: counts_from[q] rows from rank q, at offsets[q].
struct RecvLayout {
  std::vector<int64_t> offsets;  // [P + 1]
  int64_t rows() const { return offsets.back(); }
};
RecvLayout recv_layout_ref(const std::vector<int64_t>& counts_from);

// ffn out [T, H] (double, before the final rounding) from the returned rows [send rows, H], each
// already weight x row rounded to bf16 (the deterministic combine's rule, docs/numerics.md): per
// token, its k rows summed in slot order; a dropped route adds nothing.
std::vector<double> combine_ref(const SendLayout& s, const std::vector<float>& returned, int64_t tokens,
                                int64_t topk, int64_t hidden);

// The experts of `experts` (global ids, in local order) of an ffn layer's weights, as a layer of
// that many experts.
LayerWeights slice_experts(const LayerWeights& w, const std::vector<int32_t>& experts);

// All P ranks of an ffn layer on the CPU: rank r holds hidden[r] [T_r, H] and its routes topk[r]
// (global ids); each sends its routes to their owners, each owner runs its local experts on the
// rows it received (layer_ref, one route a row, route rows rounded to bf16), returns the outputs,
// and each sender combines them. Returns every rank's out [T_r, H] before the final rounding.
std::vector<std::vector<double>> ep_world_ref(const LayerWeights& w, const EpConfig& base,
                                              const std::vector<std::vector<bf16>>& hidden,
                                              const std::vector<TopK>& topk);

}  // namespace loom::dist
