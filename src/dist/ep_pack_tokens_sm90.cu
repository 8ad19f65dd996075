// Each (token, owner) pair's row into the owner's segment, with its k slots' local ids, weights and
// return rows, every route's slot_row, and the padding of every segment past its rank's count
// (ep_send_sm90.cuh). One launch, two kinds of block, 256 threads each:
//   blocks [0, pack)        a warp per route; the warp of the slot that carries the token's row to
//                           its owner does the work for all the token's slots owned there (lane j:
//                           slot j) and copies (or quantises) the row, the warp of a dropped route
//                           writes its slot_row; the rest return
//   blocks [pack, pack+pad) a thread per (segment row, slot): rows past the rank's count get ids -1,
//                           weight 0 (return row -1), so the owner computes and returns nothing there
// The two write disjoint rows (positions below and at or past a rank's count), so they need no order.
#include <algorithm>

#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "dist/ep_send_sm90.cuh"
#include "ptx/pdl.cuh"
#include "quant/quant_gather_device.cuh"

namespace loom::dist {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;

// One bf16 row as the layer's 1x128 codes and scales (the quantise stage's own arithmetic,
// quant_gather_device.cuh, so the owner computes on the bits its own quantisation would make):
// each pass, octet o of the warp takes group g + o, each lane 16 values. Every lane runs every
// pass (octet shuffles); lanes past the row's end load zeros, which leave the amax as it is.
__device__ void quantise_row(const EpSendParams& p, const uint16_t* x, uint8_t* codes, float* scales, int lane) {
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

__device__ void pack_route(const EpTables& t, const EpSendParams& p, int s, int lane) {
  const int32_t q = p.dest[s];
  if (q < 0) {
    if (lane == 0) p.slot_row[s] = -1;
    return;
  }
  if (p.mark[s] != q) return;  // another slot of this token carries its row to q
  const int t0 = s - s % p.topk, i = p.tok_row[s] - p.tok_offsets[q];
  const bool mine = lane < p.topk && p.dest[t0 + lane] == q;
  if (i >= p.tokens_per_peer) {  // the token is beyond q's token cap: none of its routes to q is sent
    if (mine) p.slot_row[t0 + lane] = -1;
    // Token returns have no bucket for these routes: the warp counts them (ep_owner zeroed the
    // count). The whole warp is here: its lanes share s.
    const unsigned n = __popc(__ballot_sync(0xffffffffu, mine));
    if (p.token_returns && lane == 0) atomicAdd(p.overflow, n);
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

__device__ void pad_slot(const EpSendParams& p, int j) {
  if (j == 0 && !p.token_returns) {
    // Routes whose token was beyond a token cap (bucket P C), and routes beyond a return cap.
    const int buckets = p.ranks * p.chunks, per_part = p.rows_per_peer / p.chunks;
    uint32_t over = uint32_t(p.ret_offsets[buckets + 1] - p.ret_offsets[buckets]);
    for (int b = 0; b < buckets; ++b) over += uint32_t(max(0, p.ret_offsets[b + 1] - p.ret_offsets[b] - per_part));
    *p.overflow = over;
  }
  if (j >= p.ranks * p.tokens_per_peer * p.topk) return;
  // Row r of the buffer [C][P][tokens_per_peer / C] is position i of peer q's segment (ep_send_row).
  const int r = j / p.topk, per_chunk = p.tokens_per_peer / p.chunks, c = r / (p.ranks * per_chunk);
  const int q = (r / per_chunk) % p.ranks, i = (r % per_chunk) * p.chunks + c;
  if (i >= p.tok_offsets[q + 1] - p.tok_offsets[q]) {
    const bool self = q == p.self_rank;
    (self ? p.recv_ids : p.send_ids)[j] = -1;
    (self ? p.recv_w : p.send_w)[j] = 0.0f;
    if (!p.token_returns) (self ? p.recv_ret : p.send_ret)[j] = -1;
  }
}

__global__ void ep_pack_tokens_kernel(const __grid_constant__ EpTables t, const EpSendParams p, int pack_blocks) {
  // Launched with PDL: let the next kernel launch, then wait for the previous one's writes
  // before any global access.
  ptx::pdl_launch_dependents();
  ptx::pdl_wait();
  const int b = int(blockIdx.x);
  if (b < pack_blocks) {
    const int s = b * kWarps + int(threadIdx.x) / 32;
    if (s < p.tokens * p.topk) pack_route(t, p, s, int(threadIdx.x) % 32);
  } else {
    pad_slot(p, (b - pack_blocks) * kThreads + int(threadIdx.x));
  }
}

}  // namespace

void launch_ep_pack_tokens(const EpTables& t, const EpSendParams& p, cudaStream_t stream, bool pdl) {
  const int routes = p.tokens * p.topk, slots = p.ranks * p.tokens_per_peer * p.topk;
  const int pack = (routes + kWarps - 1) / kWarps, pad = std::max(1, (slots + kThreads - 1) / kThreads);
  launch_kernel(ep_pack_tokens_kernel, dim3(unsigned(pack + pad)), dim3(kThreads), 0, stream, pdl, t, p, pack);
}

}  // namespace loom::dist
