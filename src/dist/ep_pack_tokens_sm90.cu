// Each (token, owner) pair's row into the owner's segment, with its k slots' local ids, weights and
// return rows, and every route's slot_row (ep_send_sm90.cuh). A warp per route; the warp of the
// slot that carries the token's row to its owner does the work for all the token's slots owned
// there (lane j: slot j), the warp of a dropped route writes its slot_row; the rest return.
#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "dist/ep_send_sm90.cuh"
#include "ptx/pdl.cuh"

namespace loom::dist {
namespace {

__global__ void ep_pack_tokens_kernel(const __grid_constant__ EpTables t, const EpSendParams p) {
  // Launched with PDL: let the next kernel launch, then wait for the previous one's writes
  // before any global access.
  ptx::pdl_launch_dependents();
  ptx::pdl_wait();
  const int warps = int(blockDim.x) / 32;
  const int s = int(blockIdx.x) * warps + int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (s >= p.tokens * p.topk) return;
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
    return;
  }
  const int row = ep_send_row(q, i, p.ranks, p.tokens_per_peer, p.chunks), c = i % p.chunks;
  const int per_part = p.rows_per_peer / p.chunks, b = q * p.chunks + c;
  const bool self = q == p.self_rank;  // straight into the receive buffers' same rows
  if (lane < p.topk) {
    const int s_j = t0 + lane;
    const int pos = mine ? p.ret_row[s_j] - p.ret_offsets[b] : per_part;
    const bool sent = pos < per_part;  // else beyond the return cap: the owner skips the slot
    const int64_t r = int64_t(row) * p.topk + lane;
    (self ? p.recv_ids : p.send_ids)[r] = sent ? int32_t(t.local[p.ids[s_j]]) : -1;
    (self ? p.recv_w : p.send_w)[r] = sent ? p.weights[s_j] : 0.0f;
    (self ? p.recv_ret : p.send_ret)[r] = sent ? pos : -1;
    if (mine && p.token_returns)  // the token's row comes back once, on its first slot to q
      p.slot_row[s_j] = s_j == s ? row + (self ? p.ranks * p.tokens_per_peer : 0) : -1;
    else if (mine)
      p.slot_row[s_j] = sent ? (c * p.ranks + q) * per_part + pos : -1;
  }
  const int64_t token = s / p.topk;
  const bool fp8 = p.quant_codes != nullptr;
  const int row_bytes = fp8 ? p.hidden_dim : 2 * p.hidden_dim;
  const uint4* src = fp8 ? reinterpret_cast<const uint4*>(p.quant_codes + token * p.hidden_dim)
                         : reinterpret_cast<const uint4*>(p.hidden + token * p.hidden_dim);
  uint4* dst = reinterpret_cast<uint4*>((self ? p.recv_x : p.send_x) + int64_t(row) * row_bytes);
  for (int v = lane; v < row_bytes / 16; v += 32) dst[v] = src[v];
  if (fp8) {  // the row's scales, token-major on the wire (the quantisation's are group-major)
    const int groups = (p.hidden_dim + 127) / 128;
    float* scales = (self ? p.recv_scales : p.send_scales) + int64_t(row) * groups;
    for (int g = lane; g < groups; g += 32) scales[g] = p.quant_scales[int64_t(g) * p.quant_rows + token];
  }
}

}  // namespace

void launch_ep_pack_tokens(const EpTables& t, const EpSendParams& p, cudaStream_t stream, bool pdl) {
  const int routes = p.tokens * p.topk;
  if (routes == 0) return;
  constexpr int kThreads = 256, kWarps = kThreads / 32;
  const dim3 grid(unsigned((routes + kWarps - 1) / kWarps));
  launch_kernel(ep_pack_tokens_kernel, grid, dim3(kThreads), 0, stream, pdl, t, p);
}

}  // namespace loom::dist
