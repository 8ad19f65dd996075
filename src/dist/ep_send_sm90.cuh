// Expert parallelism's send side on the device (issue 49), bit for bit dist/ep_routes_ref's
// layout: the owner of every route, then (after launch_dispatch over the P ranks as "experts",
// which gives each route its position among the routes to its owner, stable in slot order) the
// send segments, rows_per_peer rows per peer:
//   launch_ep_owner        dest[s] = owner of ids[s], -1 for an id outside [0, E)
//   launch_ep_pack_rows    each sent route's hidden row, local expert id and weight into its
//                          destination's segment; slot_row[s] = its row there, -1 if not sent
//   launch_ep_pad_segments the rows of each segment past its count: id -1, weight 0 (the owner's
//                          dispatch drops them); overflow = routes beyond the cap
// Plain launches on one stream (no PDL); no global scratch, nothing to clear first.
// Host-includable: plain declarations only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "loom/types.hpp"

namespace loom::dist {

// The placement as a kernel parameter (2 KiB): no device allocation, nothing to upload, so a run
// stays capturable.
struct EpTables {
  uint16_t owner[kGpuMaxExperts];
  uint16_t local[kGpuMaxExperts];
};

// Where position i of peer q's segment lies in the send buffer: with C chunks the buffer is
// [C][P][rows_per_peer / C] rows and position i is row i / C of chunk i mod C, so the routes of a
// partly filled segment spread evenly over the chunks (C = 1: row q rows_per_peer + i).
__host__ __device__ inline int ep_send_row(int q, int i, int ranks, int rows_per_peer, int chunks) {
  const int per_chunk = rows_per_peer / chunks;
  return ((i % chunks) * ranks + q) * per_chunk + i / chunks;
}

struct EpSendParams {
  const uint16_t* hidden = nullptr;      // [T, H] bf16
  const int32_t* ids = nullptr;          // [T, k] global expert ids
  const float* weights = nullptr;        // [T, k]
  int32_t* dest = nullptr;               // [T, k] owner rank or -1 (launch_ep_owner writes it)
  const int32_t* offsets = nullptr;      // [P + 1] launch_dispatch's over dest
  const int32_t* route_row = nullptr;    // [T, k] launch_dispatch's: position among the owner's routes
  int tokens = 0, topk = 0, hidden_dim = 0, experts = 0, ranks = 0, rows_per_peer = 0;
  int chunks = 1;                        // C, dividing rows_per_peer (ep_send_row)
  uint16_t* send_x = nullptr;            // [C, P, rows_per_peer / C, H] bf16
  int32_t* send_ids = nullptr;           // [C, P, rows_per_peer / C] local expert ids
  float* send_w = nullptr;               // [C, P, rows_per_peer / C]
  int32_t* slot_row = nullptr;           // [T, k] the route's row in the send segments, -1 if not sent
  uint32_t* overflow = nullptr;          // routes beyond rows_per_peer (one plain store)
};

// Each throws loom::Error on a bad shape or a null pointer; T = 0 enqueues nothing but the
// segments' padding (every row of every segment is then padding).
void launch_ep_owner(const EpTables& t, const EpSendParams& p, cudaStream_t stream);
void launch_ep_pack_rows(const EpTables& t, const EpSendParams& p, cudaStream_t stream);
void launch_ep_pad_segments(const EpSendParams& p, cudaStream_t stream);

}  // namespace loom::dist
