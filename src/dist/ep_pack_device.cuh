// Device side of the send side's packing (ep_send_sm90.cuh), shared by ep_pack_tokens (the layout
// from the owner kernel and the dispatch, in global memory) and ep_send_small (the layout each CTA
// builds in shared memory), so both write the same bits. A layout policy L answers, for route s
// of token t = s / k:
//   L.dest(s)            its owner rank, -1 when the id is out of range
//   L.carries(s)         whether s is the token's first slot owned by dest(s) (it carries the row)
//   L.position(s, q)     the token's position among the tokens to rank q (token order), for the
//                        slot that carries it
//   L.count(q)           the tokens to rank q (sent or not)
//   L::kPackCountsOverflow  with token returns, whether the pack adds the routes it cannot send
//                        to a zeroed overflow count
#pragma once

#include <cstdint>

#include "dist/ep_send_sm90.cuh"
#include "quant/quant_gather_device.cuh"

namespace loom::dist::pack_detail {

constexpr int kThreads = 256, kWarps = kThreads / 32;

// One bf16 row as the layer's 1x128 codes and scales (the quantise stage's own arithmetic,
// quant_gather_device.cuh, so the owner computes on the bits its own quantisation would make):
// each pass, octet o of the warp takes group g + o, each lane 16 values. Every lane runs every
// pass (octet shuffles); lanes past the row's end load zeros, which leave the amax as it is.
__device__ __forceinline__ void quantise_row(const EpSendParams& p, const uint16_t* x, uint8_t* codes, float* scales,
                                             int lane) {
  using namespace quant_detail;
  const int groups = (p.hidden_dim + 127) / 128, chunks = p.hidden_dim / 16;
  const int octet = lane / kLanesPerUnit, sub = lane % kLanesPerUnit;
  for (int g0 = 0; g0 < groups; g0 += kUnitsPerWarp) {
    const int g = g0 + octet, c = g * kLanesPerUnit + sub;  // this lane's 16-value chunk
    const bool active = g < groups && c < chunks;
    uint4 raw0 = make_uint4(0u, 0u, 0u, 0u), raw1 = raw0;
    if (active) {
      const uint4* src = reinterpret_cast<const uint4*>(x) + 2 * c;
      raw0 = src[0];
      raw1 = src[1];
    }
    const UnitCodes u = quantize_raw(raw0, raw1);
    if (active) reinterpret_cast<uint4*>(codes)[c] = u.codes;
    if (sub == 0 && g < groups) scales[g] = u.scale;
  }
}

// Route s, by a whole warp: the warp of the slot that carries the token's row to its owner writes
// the row and all the token's slots there (lane j: slot j); the warp of a dropped route writes its
// slot_row; the others return. Lane-uniform branches only (the row copy and the ballot need the
// whole warp).
template <class L>
__device__ __forceinline__ void pack_route(const EpTables& t, const EpSendParams& p, const L& lay, int s, int lane) {
  const int32_t q = lay.dest(s);
  if (q < 0) {
    if (lane == 0) p.slot_row[s] = -1;
    return;
  }
  if (!lay.carries(s)) return;  // another slot of this token carries its row to q
  const int t0 = s - s % p.topk, i = lay.position(s, q);
  const bool mine = lane < p.topk && lay.dest(t0 + lane) == q;
  if (i >= p.tokens_per_peer) {  // the token is beyond q's token cap: none of its routes to q is sent
    if (mine) p.slot_row[t0 + lane] = -1;
    // Token returns have no bucket for these routes: the warp counts them (ep_owner zeroed the
    // count), unless the layout counts them itself (ep_send_small).
    const unsigned n = __popc(__ballot_sync(0xffffffffu, mine));
    if (L::kPackCountsOverflow && p.token_returns && lane == 0) atomicAdd(p.overflow, n);
    return;
  }
  const int row = ep_send_row(q, i, p.ranks, p.tokens_per_peer, p.chunks), c = i % p.chunks;
  const bool self = q == p.self_rank;  // straight into the receive buffers' same rows
  if (lane < p.topk) {
    const int s_j = t0 + lane;
    const int64_t r = int64_t(row) * p.topk + lane;
    if (p.token_returns) {  // no route cap; the token's row comes back once, on its first slot to q
      (self ? p.recv_ids : p.send_ids)[r] = mine ? int32_t(t.local[p.ids[s_j]]) : -1;
      (self ? p.recv_w : p.send_w)[r] = mine ? p.weights[s_j] : 0.0f;
      if (mine) p.slot_row[s_j] = s_j == s ? row + (self ? p.ranks * p.tokens_per_peer : 0) : -1;
    } else {
      const int per_part = p.rows_per_peer / p.chunks, b = q * p.chunks + c;
      const int pos = mine ? p.ret_row[s_j] - p.ret_offsets[b] : per_part;
      const bool sent = pos < per_part;  // else beyond the return cap: the owner skips the slot
      (self ? p.recv_ids : p.send_ids)[r] = sent ? int32_t(t.local[p.ids[s_j]]) : -1;
      (self ? p.recv_w : p.send_w)[r] = sent ? p.weights[s_j] : 0.0f;
      (self ? p.recv_ret : p.send_ret)[r] = sent ? pos : -1;
      if (mine) p.slot_row[s_j] = sent ? (c * p.ranks + q) * per_part + pos : -1;
    }
  }
  const int64_t token = s / p.topk;
  if (p.fp8_rows) {
    quantise_row(p, p.hidden + token * p.hidden_dim, (self ? p.recv_x : p.send_x) + int64_t(row) * p.hidden_dim,
                 (self ? p.recv_scales : p.send_scales) + int64_t(row) * ((p.hidden_dim + 127) / 128), lane);
    return;
  }
  const uint4* src = reinterpret_cast<const uint4*>(p.hidden + token * p.hidden_dim);
  uint4* dst = reinterpret_cast<uint4*>((self ? p.recv_x : p.send_x) + int64_t(row) * 2 * p.hidden_dim);
  for (int v = lane; v < p.hidden_dim / 8; v += 32) dst[v] = src[v];
}

// Slot j of the token rows [C][P][tokens_per_peer / C][k]: past its rank's count it gets id -1,
// weight 0 (return row -1), so the owner computes and returns nothing there.
template <class L>
__device__ __forceinline__ void pad_slot(const EpSendParams& p, const L& lay, int j) {
  if (j >= p.ranks * p.tokens_per_peer * p.topk) return;
  // Row r of the buffer [C][P][tokens_per_peer / C] is position i of peer q's segment (ep_send_row).
  const int r = j / p.topk, per_chunk = p.tokens_per_peer / p.chunks, c = r / (p.ranks * per_chunk);
  const int q = (r / per_chunk) % p.ranks, i = (r % per_chunk) * p.chunks + c;
  if (i >= lay.count(q)) {
    const bool self = q == p.self_rank;
    (self ? p.recv_ids : p.send_ids)[j] = -1;
    (self ? p.recv_w : p.send_w)[j] = 0.0f;
    if (!p.token_returns) (self ? p.recv_ret : p.send_ret)[j] = -1;
  }
}

}  // namespace loom::dist::pack_detail
