// launch_ep_send (ep_send_sm90.cuh): the send side's checks, then its kernels and dispatches in
// order on one stream, chained with PDL.
#include <algorithm>
#include <string>

#include "common/cuda_check.hpp"
#include "dispatch/dispatch_sm90.cuh"
#include "dist/ep_send_sm90.cuh"

namespace loom::dist {

size_t ep_send_slice_count_bytes(int64_t max_tokens, int64_t topk, int ranks, int chunks) {
  return std::max(dispatch_slice_count_bytes(max_tokens, topk, ranks + 1),
                  dispatch_slice_count_bytes(max_tokens, topk, int64_t(ranks) * chunks + 1));
}

void launch_ep_send(const EpTables& t, const EpSendParams& p, cudaStream_t stream) {
  if (p.tokens < 0 || p.topk < 1 || p.topk > kGpuMaxTopk || p.experts < 1 || p.experts > kGpuMaxExperts ||
      p.ranks < 1 || p.chunks < 1 || p.hidden_dim < 8 || p.hidden_dim % 8)
    throw Error("ep_send: T >= 0, k in [1, " + std::to_string(kGpuMaxTopk) + "], E in [1, " +
                std::to_string(kGpuMaxExperts) + "], P >= 1, C >= 1 and H a positive multiple of 8");
  if (p.tokens_per_peer < 0 || p.rows_per_peer < 0 || p.tokens_per_peer % p.chunks || p.rows_per_peer % p.chunks)
    throw Error("ep_send: tokens_per_peer and rows_per_peer must be >= 0 and multiples of the parts");
  if (p.token_returns && int64_t(p.rows_per_peer) != int64_t(p.tokens_per_peer) * p.topk)
    throw Error("ep_send: token returns take rows_per_peer = tokens_per_peer k (no route cap)");
  if (p.ranks * p.chunks + 1 > kGpuMaxExperts) throw Error("ep_send: P C + 1 buckets beyond the dispatch's experts");
  const void* need[] = {p.dest,   p.mark,    p.tok_offsets, p.tok_row,  p.row_token, p.row_weight,
                        p.status, p.send_x,  p.send_ids,    p.send_w,   p.slot_row,  p.overflow};
  for (const void* ptr : need)
    if (!ptr) throw Error("ep_send: null device pointer");
  // Route returns only: the routes' (rank, part) buckets and return rows.
  const void* need_routes[] = {p.bucket, p.ret_offsets, p.ret_row, p.scratch_status, p.send_ret};
  for (const void* ptr : need_routes)
    if (!ptr && !p.token_returns) throw Error("ep_send: null device pointer for the route returns");
  if (p.tokens > 0 && (!p.hidden || !p.ids || !p.weights)) throw Error("ep_send: null hidden, ids or weights");
  const bool fp8 = p.fp8_rows;
  if (p.self_rank >= p.ranks ||
      (p.self_rank >= 0 && (!p.recv_x || !p.recv_ids || !p.recv_w || (!p.token_returns && !p.recv_ret) ||
                            (fp8 && !p.recv_scales))))
    throw Error("ep_send: self_rank must be -1 or a rank with the receive buffers given");
  if (fp8 && p.hidden_dim % 16) throw Error("ep_send: FP8 rows need H a multiple of 16");
  if (fp8 && !p.send_scales) throw Error("ep_send: FP8 rows need send_scales");
  if (reinterpret_cast<uintptr_t>(p.hidden) % 16 || reinterpret_cast<uintptr_t>(p.send_x) % 16 ||
      reinterpret_cast<uintptr_t>(p.recv_x) % 16)
    throw Error("ep_send: hidden and the send rows must be 16-byte aligned");
  if (p.tokens == 0) {  // no routes: every count zero, every row padding
    LOOM_CUDA_CHECK(cudaMemsetAsync(p.tok_offsets, 0, size_t(p.ranks + 2) * 4, stream));
    if (!p.token_returns)
      LOOM_CUDA_CHECK(cudaMemsetAsync(p.ret_offsets, 0, size_t(p.ranks * p.chunks + 2) * 4, stream));
    LOOM_CUDA_CHECK(cudaMemsetAsync(p.status, 0, sizeof(LayerStatus), stream));
    LOOM_CUDA_CHECK(cudaMemsetAsync(p.overflow, 0, sizeof(uint32_t), stream));
    launch_ep_pack_tokens(t, p, stream, true);
    return;
  }
  if (ep_send_small_fits(p)) {  // the layout in each CTA's shared memory: one launch
    launch_ep_send_small(t, p, stream, true);
    return;
  }
  launch_ep_owner(t, p, stream, true);
  DispatchParams dp;  // the (token, rank) pairs, as P "experts" and one more for the other slots
  dp.topk_ids = p.mark;
  dp.topk_weights = p.weights;
  dp.nan_flags = p.nan_flags;
  dp.tokens = p.tokens;
  dp.topk = p.topk;
  dp.experts = p.ranks + 1;
  dp.offsets = p.tok_offsets;
  dp.route_row = p.tok_row;
  dp.row_token = p.row_token;
  dp.row_weight = p.row_weight;
  dp.status = p.status;  // dropped = marks of -1 = ids out of range
  dp.slice_counts = p.slice_counts;
  launch_dispatch(dp, stream, true);
  if (!p.token_returns) {
    launch_ep_buckets(p, stream, true);
    dp.topk_ids = p.bucket;  // the routes by (rank, part), and one more bucket for the unsent
    dp.nan_flags = nullptr;
    dp.experts = p.ranks * p.chunks + 1;
    dp.offsets = p.ret_offsets;
    dp.route_row = p.ret_row;
    dp.status = p.scratch_status;
    launch_dispatch(dp, stream, true);
  }
  launch_ep_pack_tokens(t, p, stream, true);
}

}  // namespace loom::dist
