#include "dist/ep_buffers.hpp"

#include <algorithm>
#include <string>

#include "dist/placement.hpp"
#include "quant/quant_ref.hpp"

namespace loom::dist {
namespace {

int64_t align16(int64_t b) { return (b + 15) / 16 * 16; }

}  // namespace

int64_t default_rows_per_peer(int64_t tokens, int64_t topk, int ranks) {
  const int64_t routes = tokens * topk;
  const int64_t twice_share = (2 * routes + ranks - 1) / ranks;
  return std::min(routes, (twice_share + 15) / 16 * 16);
}

int64_t default_tokens_per_peer(int64_t tokens, int64_t topk, int ranks) {
  return std::min(tokens, default_rows_per_peer(tokens, topk, ranks));
}

Buffers buffer_bytes(const BufferSpec& s) {
  if (s.ranks < 1 || s.ranks > kMaxRanks)
    throw Error("expert parallelism: ranks must be in [1, " + std::to_string(kMaxRanks) + "], got " +
                std::to_string(s.ranks));
  if (s.tokens < 0 || s.tokens > kMaxTokens || s.topk < 1 || s.topk > kMaxExperts || s.hidden < kWidthAlign ||
      s.hidden > kMaxWidth || s.hidden % kWidthAlign)
    throw Error("expert parallelism: buffers for T=" + std::to_string(s.tokens) + " k=" + std::to_string(s.topk) +
                " H=" + std::to_string(s.hidden) + " are outside loom's limits");
  const int64_t routes = s.tokens * s.topk;
  if (s.rows_per_peer < 0 || s.rows_per_peer > std::max<int64_t>(routes, 1))
    throw Error("expert parallelism: rows_per_peer must be in [0, T k = " + std::to_string(routes) + "], got " +
                std::to_string(s.rows_per_peer));
  if (s.tokens_per_peer < 0 || s.tokens_per_peer > std::max<int64_t>(s.tokens, 1))
    throw Error("expert parallelism: tokens_per_peer must be in [0, T = " + std::to_string(s.tokens) + "], got " +
                std::to_string(s.tokens_per_peer));
  if (s.chunks < 1 || s.chunks > kMaxChunks)
    throw Error("expert parallelism: chunks must be in [1, " + std::to_string(kMaxChunks) + "], got " +
                std::to_string(s.chunks));
  // In parts, each part's rows of a peer a multiple of 4, so every part's ids and weights (4 bytes
  // a slot) start 16-byte aligned, as the local run's inputs must.
  auto whole_parts = [&](int64_t cap) {
    if (s.chunks == 1) return cap;
    const int64_t per_part = (cap + s.chunks - 1) / s.chunks;
    return s.chunks * ((per_part + 3) / 4 * 4);
  };
  Buffers b;
  b.tokens_per_peer = whole_parts(s.tokens_per_peer > 0 ? s.tokens_per_peer
                                                        : default_tokens_per_peer(s.tokens, s.topk, s.ranks));
  b.rows_per_peer = whole_parts(s.rows_per_peer > 0 ? s.rows_per_peer
                                                    : default_rows_per_peer(s.tokens, s.topk, s.ranks));
  const int64_t values =
      s.dtype == DType::fp8 ? align16(s.hidden) + align16(4 * quant_blocks(s.hidden)) : align16(2 * s.hidden);
  b.row_bytes = values + align16(12 * s.topk);  // + each slot's local id, weight and return row
  b.return_row_bytes = align16(2 * s.hidden);
  b.send = b.recv = size_t(s.ranks) * size_t(b.tokens_per_peer) * size_t(b.row_bytes);
  b.out_local = b.out_back = size_t(s.ranks) * size_t(b.rows_per_peer) * size_t(b.return_row_bytes);
  return b;
}

}  // namespace loom::dist
