#include "dist/ep_routes_ref.hpp"

#include <algorithm>
#include <string>

#include "loom/types.hpp"

namespace loom::dist {

SendLayout send_layout_ref(const Placement& p, const int32_t* ids, int64_t tokens, int64_t topk) {
  if (tokens < 0 || topk < 1) throw Error("send_layout_ref: tokens must be >= 0 and topk >= 1");
  const int64_t routes = tokens * topk;
  SendLayout s;
  s.counts.assign(size_t(p.ranks), 0);
  s.position.assign(size_t(routes), -1);
  for (int64_t r = 0; r < routes; ++r) {
    const int32_t e = ids[r];
    if (e < 0 || e >= p.experts) {
      ++s.dropped;
      continue;
    }
    ++s.counts[size_t(p.owner[size_t(e)])];
  }
  s.offsets.assign(size_t(p.ranks) + 1, 0);
  for (int q = 0; q < p.ranks; ++q) s.offsets[size_t(q) + 1] = s.offsets[size_t(q)] + s.counts[size_t(q)];
  const int64_t rows = s.offsets.back();
  s.slot.resize(size_t(rows));
  s.local_expert.resize(size_t(rows));
  std::vector<int64_t> next(s.offsets.begin(), s.offsets.end() - 1);
  for (int64_t r = 0; r < routes; ++r) {  // slot order within each destination
    const int32_t e = ids[r];
    if (e < 0 || e >= p.experts) continue;
    const int64_t row = next[size_t(p.owner[size_t(e)])]++;
    s.slot[size_t(row)] = int32_t(r);
    s.local_expert[size_t(row)] = p.local_index[size_t(e)];
    s.position[size_t(r)] = int32_t(row);
  }
  return s;
}

TokenSendLayout send_tokens_ref(const Placement& p, const int32_t* ids, int64_t tokens, int64_t topk) {
  if (tokens < 0 || topk < 1) throw Error("send_tokens_ref: tokens must be >= 0 and topk >= 1");
  TokenSendLayout s;
  s.counts.assign(size_t(p.ranks), 0);
  s.return_row.assign(size_t(tokens * topk), -1);
  auto owner_of = [&](int64_t slot) {
    const int32_t e = ids[slot];
    return e < 0 || e >= p.experts ? -1 : p.owner[size_t(e)];
  };
  std::vector<int64_t> routes_to(size_t(p.ranks), 0);  // routes to each rank so far, slot order
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<char> sends(size_t(p.ranks), 0);
    for (int64_t j = 0; j < topk; ++j) {
      const int q = owner_of(t * topk + j);
      if (q < 0) {
        ++s.dropped;
        continue;
      }
      sends[size_t(q)] = 1;
      s.return_row[size_t(t * topk + j)] = int32_t(routes_to[size_t(q)]++);
    }
    for (int q = 0; q < p.ranks; ++q) s.counts[size_t(q)] += sends[size_t(q)];
  }
  s.offsets.assign(size_t(p.ranks) + 1, 0);
  for (int q = 0; q < p.ranks; ++q) s.offsets[size_t(q) + 1] = s.offsets[size_t(q)] + s.counts[size_t(q)];
  s.token.resize(size_t(s.offsets.back()));
  s.local_ids.assign(size_t(s.offsets.back() * topk), -1);
  std::vector<int64_t> next(s.offsets.begin(), s.offsets.end() - 1);
  for (int64_t t = 0; t < tokens; ++t) {  // token order within each destination
    std::vector<int64_t> row(size_t(p.ranks), -1);
    for (int64_t j = 0; j < topk; ++j) {
      const int q = owner_of(t * topk + j);
      if (q < 0) continue;
      if (row[size_t(q)] < 0) {
        row[size_t(q)] = next[size_t(q)]++;
        s.token[size_t(row[size_t(q)])] = int32_t(t);
      }
      s.local_ids[size_t(row[size_t(q)] * topk + j)] = p.local_index[size_t(ids[t * topk + j])];
    }
  }
  return s;
}

TokenSegments token_segments_ref(const Placement& p, const int32_t* ids, int64_t tokens, int64_t topk,
                                 int64_t tokens_per_peer, int64_t rows_per_peer, int chunks) {
  if (tokens < 0 || topk < 1 || chunks < 1 || tokens_per_peer < 0 || rows_per_peer < 0 ||
      tokens_per_peer % chunks || rows_per_peer % chunks)
    throw Error("token_segments_ref: T >= 0, k >= 1 and caps that are whole multiples of the parts");
  const int P = p.ranks;
  const int64_t rows = P * tokens_per_peer, per_part = rows_per_peer / chunks, per_tok = tokens_per_peer / chunks;
  TokenSegments s;
  s.token.assign(size_t(rows), -1);
  s.ids.assign(size_t(rows * topk), -1);
  s.slot.assign(s.ids.size(), -1);
  s.ret.assign(s.ids.size(), -1);
  s.slot_row.assign(size_t(tokens * topk), -1);
  s.token_slot_row.assign(s.slot_row.size(), -1);
  s.tokens_to.assign(size_t(P), 0);
  std::vector<int64_t> next_ret(size_t(P * chunks), 0);  // routes so far per (rank, part), slot order
  for (int64_t t = 0; t < tokens; ++t)
    for (int q = 0; q < P; ++q) {
      int64_t row = -1, c = 0;
      for (int64_t j = 0; j < topk; ++j) {
        const int64_t slot = t * topk + j;
        const int32_t e = ids[slot];
        if (e < 0 || e >= p.experts) {
          if (q == 0) ++s.dropped;
          continue;
        }
        if (p.owner[size_t(e)] != q) continue;
        if (row < 0) {  // the token's first route to q: its position among q's tokens
          const int64_t i = s.tokens_to[size_t(q)]++;
          if (i >= tokens_per_peer) {
            row = rows;  // not sent
          } else {
            c = i % chunks;
            row = ((c * P + q) * per_tok) + i / chunks;
            s.token[size_t(row)] = int32_t(t);
            s.token_slot_row[size_t(slot)] = int32_t(row);
          }
        }
        if (row == rows) {
          ++s.overflow;
          continue;
        }
        const int64_t pos = next_ret[size_t(q * chunks + c)]++;
        if (pos >= per_part) {
          ++s.overflow;
          continue;
        }
        const size_t at = size_t(row * topk + j);
        s.ids[at] = p.local_index[size_t(e)];
        s.slot[at] = int32_t(slot);
        s.ret[at] = int32_t(pos);
        s.slot_row[size_t(slot)] = int32_t((c * P + q) * per_part + pos);
      }
    }
  return s;
}

std::vector<int32_t> owner_return_rows_ref(const int32_t* local_ids, int64_t rows, int64_t topk) {
  if (rows < 0 || topk < 1) throw Error("owner_return_rows_ref: rows must be >= 0 and topk >= 1");
  std::vector<int32_t> out(size_t(rows * topk), -1);
  int32_t next = 0;
  for (int64_t i = 0; i < rows * topk; ++i)
    if (local_ids[i] >= 0) out[size_t(i)] = next++;
  return out;
}

RecvLayout recv_layout_ref(const std::vector<int64_t>& counts_from) {
  RecvLayout l;
  l.offsets.assign(counts_from.size() + 1, 0);
  for (size_t q = 0; q < counts_from.size(); ++q) {
    if (counts_from[q] < 0) throw Error("recv_layout_ref: a negative row count from rank " + std::to_string(q));
    l.offsets[q + 1] = l.offsets[q] + counts_from[q];
  }
  return l;
}

std::vector<double> combine_ref(const SendLayout& s, const std::vector<float>& returned, int64_t tokens,
                                int64_t topk, int64_t hidden) {
  if (int64_t(s.position.size()) != tokens * topk || int64_t(returned.size()) != s.offsets.back() * hidden)
    throw Error("combine_ref: the send layout, the returned rows and T k H disagree");
  std::vector<double> out(size_t(tokens * hidden), 0.0);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < topk; ++j) {  // slot order: the summation order is part of the contract
      const int32_t row = s.position[size_t(t * topk + j)];
      if (row < 0) continue;
      for (int64_t n = 0; n < hidden; ++n)
        out[size_t(t * hidden + n)] += double(returned[size_t(int64_t(row) * hidden + n)]);
    }
  return out;
}

LayerWeights slice_experts(const LayerWeights& w, const std::vector<int32_t>& experts) {
  const Shape& s = w.shape;
  if (s.mode != Mode::ffn) throw Error("slice_experts: ffn weights only");
  LayerWeights out;
  out.shape = s;
  out.shape.experts = int64_t(experts.size());
  out.shape.topk = 1;  // a local run takes one route a row
  // Every weight array holds its experts one after another: an expert's part is size / E.
  auto take = [&](const auto& from, auto& to) {
    const int64_t per = int64_t(from.size()) / s.experts;
    to.clear();
    for (const int32_t e : experts) {
      if (e < 0 || e >= s.experts) throw Error("slice_experts: expert " + std::to_string(e) + " out of range");
      to.insert(to.end(), from.begin() + e * per, from.begin() + (e + 1) * per);
    }
  };
  if (s.dtype == DType::fp8) {
    take(w.w1_q, out.w1_q);
    take(w.w2_q, out.w2_q);
    take(w.w1_scales, out.w1_scales);
    take(w.w2_scales, out.w2_scales);
  } else {
    take(w.w1, out.w1);
    take(w.w2, out.w2);
  }
  return out;
}

std::vector<std::vector<double>> ep_world_ref(const LayerWeights& w, const EpConfig& base,
                                              const std::vector<std::vector<bf16>>& hidden,
                                              const std::vector<TopK>& topk) {
  const int P = base.size;
  const int64_t H = w.shape.hidden, k = w.shape.topk;
  if (int(hidden.size()) != P || int(topk.size()) != P)
    throw Error("ep_world_ref: one hidden and one top-k per rank");
  std::vector<Placement> place;
  std::vector<SendLayout> send;
  for (int r = 0; r < P; ++r) {
    EpConfig c = base;
    c.rank = r;
    c.first_expert = c.expert_count = -1;
    place.push_back(make_placement(w.shape.experts, c));
    if (topk[size_t(r)].topk != k || int64_t(hidden[size_t(r)].size()) != topk[size_t(r)].tokens * H)
      throw Error("ep_world_ref: rank " + std::to_string(r) + "'s hidden or top-k does not match the layer");
    send.push_back(send_layout_ref(place.back(), topk[size_t(r)].ids.data(), topk[size_t(r)].tokens, k));
  }
  // Each owner: its received rows (by source rank, in each sender's order), run on its experts.
  std::vector<std::vector<float>> returned(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r) returned[size_t(r)].resize(size_t(send[size_t(r)].offsets.back() * H));
  for (int o = 0; o < P; ++o) {
    std::vector<int64_t> counts_from(static_cast<size_t>(P));
    for (int q = 0; q < P; ++q) counts_from[size_t(q)] = send[size_t(q)].counts[size_t(o)];
    const RecvLayout recv = recv_layout_ref(counts_from);
    const int64_t rows = recv.rows();
    if (rows == 0) continue;
    std::vector<bf16> x(size_t(rows * H));
    TopK local;
    local.tokens = rows;
    local.topk = 1;
    local.ids.resize(size_t(rows));
    local.weights.resize(size_t(rows));
    for (int q = 0; q < P; ++q) {
      const SendLayout& s = send[size_t(q)];
      for (int64_t i = 0; i < counts_from[size_t(q)]; ++i) {
        const int64_t srow = s.offsets[size_t(o)] + i, rrow = recv.offsets[size_t(q)] + i;
        const int32_t slot = s.slot[size_t(srow)];
        std::copy_n(hidden[size_t(q)].begin() + (slot / k) * H, H, x.begin() + rrow * H);
        local.ids[size_t(rrow)] = s.local_expert[size_t(srow)];
        local.weights[size_t(rrow)] = topk[size_t(q)].weights[size_t(slot)];
      }
    }
    const LayerResult y = layer_ref(slice_experts(w, place[size_t(o)].local_experts), x.data(), local, nullptr, true);
    // Back to each sender, where it sent the rows.
    for (int q = 0; q < P; ++q)
      for (int64_t i = 0; i < counts_from[size_t(q)]; ++i) {
        const int64_t srow = send[size_t(q)].offsets[size_t(o)] + i, rrow = recv.offsets[size_t(q)] + i;
        for (int64_t n = 0; n < H; ++n)
          returned[size_t(q)][size_t(srow * H + n)] = float(y.out[size_t(rrow * H + n)]);
      }
  }
  std::vector<std::vector<double>> out;
  for (int r = 0; r < P; ++r)
    out.push_back(combine_ref(send[size_t(r)], returned[size_t(r)], topk[size_t(r)].tokens, k, H));
  return out;
}

}  // namespace loom::dist
