// Expert parallelism's send side on the GPU (dist/ep_send_sm90.cuh) against dist::token_segments_ref,
// no NCCL: the token rows with their slots' ids, weights and return rows, padding, every route's
// return row and the overflow, in one part and in three, with caps below a rank's tokens and
// routes and with caps nothing reaches, and with one rank's segment written in place into the
// receive buffers (its own); the FP8 rows, as the codes and scales of the layer's quantisation;
// and with token returns (the owners sum: no route scratch given, one return row per token and
// owner, the return-row buffers left untouched). Ids out of range (dropped) in every case; outputs are poisoned first.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "bench/device_buffer.hpp"
#include "common/bf16.hpp"
#include "dispatch/dispatch_sm90.cuh"
#include "dist/ep_routes_ref.hpp"
#include "dist/ep_send_sm90.cuh"
#include "gpu_test.hpp"
#include "quant/quant_ref.hpp"
#include "test_seed.hpp"

namespace loom::dist {
namespace {

using bench::DeviceBuffer;

TEST(EpSendGpu, SegmentsEqualTheReferenceLayout) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  constexpr int k = 4, E = 24, P = 4, H = 656;  // FP8: 6 groups, the last of 16
  std::mt19937_64 rng(seed);
  // T = 77: token returns take the one-launch form (ep_send_small); T = 700: the three launches.
  for (const int T : {77, 700}) {
    SCOPED_TRACE("T " + std::to_string(T));
    EpConfig cfg;
    cfg.size = P;
    cfg.expert_rank.resize(E);
    for (int e = 0; e < E; ++e) cfg.expert_rank[size_t(e)] = int32_t(rng() % P);  // a map, not blocks
    cfg.expert_rank[0] = 0;  // every rank owns one expert at least
    cfg.expert_rank[1] = 1;
    cfg.expert_rank[2] = 2;
    cfg.expert_rank[3] = 3;
    const Placement pl = make_placement(E, cfg);
    std::vector<int32_t> ids(size_t(T * k));
    std::vector<float> w(ids.size());
    std::vector<uint16_t> hidden(size_t(T * H));
    for (size_t s = 0; s < ids.size(); ++s) {
      const uint64_t r = rng() % 100;
      // Rank 2's experts take a third of the routes (its count beyond the cap); a few ids out of range.
      ids[s] = r < 3 ? (r == 0 ? -1 : E + int32_t(r)) : r < 36 ? 2 : int32_t(rng() % E);
      w[s] = float(rng() % 1000) / 1000.0f + 0.001f;
    }
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (uint16_t& h : hidden) h = float_to_bf16(normal(rng)).bits;
    // FP8 rows: what the layer's quantisation makes of each token (the bytes the sender must send).
    std::vector<bf16> hidden_bf16(hidden.size());
    for (size_t i = 0; i < hidden.size(); ++i) hidden_bf16[i] = bf16{hidden[i]};
    constexpr int G = (H + 127) / 128;
    std::vector<uint8_t> want_codes(hidden.size());
    std::vector<float> want_scales(size_t(T * G));
    quantize_1x128_ref(hidden_bf16.data(), T, H, want_codes.data(), want_scales.data());
    EpTables tab{};
    for (int e = 0; e < E; ++e) {
      tab.owner[e] = uint16_t(pl.owner[size_t(e)]);
      tab.local[e] = uint16_t(pl.local_index[size_t(e)]);
    }
    struct Case {
      int chunks, tokens_per_peer, rows_per_peer, self;
      bool fp8;            // the rows as codes and scales
      bool token_returns;  // the owners sum: one row back per token row, no route cap
    };
    for (const Case cs : {Case{1, 40, 66, -1, false, false}, Case{3, 48, 66, 2, false, false},
                          Case{3, 78, 309, 1, false, false}, Case{3, 48, 66, 2, true, false},
                          Case{1, 40, 40 * k, -1, false, true}, Case{3, 48, 48 * k, 2, true, true},
                          Case{3, 78, 78 * k, 1, false, true}}) {
      const int C = cs.chunks, tcap = cs.tokens_per_peer, rcap = cs.rows_per_peer;
      const bool tr = cs.token_returns;
      SCOPED_TRACE("parts " + std::to_string(C) + " caps " + std::to_string(tcap) + "/" + std::to_string(rcap) +
                   " self " + std::to_string(cs.self) + (cs.fp8 ? " fp8" : " bf16") + (tr ? " token returns" : ""));
      const TokenSegments ref = token_segments_ref(pl, ids.data(), T, k, tcap, rcap, C);
      if (tcap < T) {
        ASSERT_GT(ref.tokens_to[2], tcap);  // the tight caps bind
      } else {
        EXPECT_EQ(ref.overflow, 0);
      }
      EXPECT_GT(ref.dropped, 0);
      const size_t R = ids.size(), rows = size_t(P * tcap);
      DeviceBuffer d_ids = DeviceBuffer::from(ids), d_w = DeviceBuffer::from(w), d_h = DeviceBuffer::from(hidden);
      DeviceBuffer dest(R * 4), mark(R * 4), tok_off(size_t(P + 2) * 4), tok_row(R * 4), bucket(R * 4),
          ret_off(size_t(P * C + 2) * 4), ret_row(R * 4), row_token(R * 4), row_weight(R * 4),
          slices(ep_send_slice_count_bytes(T, k, P, C)), scratch(sizeof(LayerStatus)), status(sizeof(LayerStatus)),
          send_x(rows * H * 2), send_ids(rows * k * 4), send_w(rows * k * 4), send_ret(rows * k * 4),
          slot_row(R * 4), overflow(4), recv_x(rows * H * 2), recv_ids(rows * k * 4), recv_w(rows * k * 4),
          recv_ret(rows * k * 4), send_scales(rows * G * 4), recv_scales(rows * G * 4);
      for (DeviceBuffer* b : {&status, &send_x, &send_ids, &send_w, &send_ret, &slot_row, &overflow, &recv_x, &recv_ids,
                              &recv_w, &recv_ret})
        test::fill(b->get(), 0x7f, b->bytes());
      EpSendParams sp;
      sp.hidden = d_h.as<uint16_t>();
      sp.ids = d_ids.as<int32_t>();
      sp.weights = d_w.as<float>();
      sp.tokens = T;
      sp.topk = k;
      sp.hidden_dim = H;
      sp.experts = E;
      sp.ranks = P;
      sp.chunks = C;
      sp.tokens_per_peer = tcap;
      sp.rows_per_peer = rcap;
      sp.token_returns = tr;
      sp.dest = dest.as<int32_t>();
      sp.mark = mark.as<int32_t>();
      sp.tok_offsets = tok_off.as<int32_t>();
      sp.tok_row = tok_row.as<int32_t>();
      // The route returns' scratch: with token returns it must not be needed (null).
      sp.bucket = tr ? nullptr : bucket.as<int32_t>();
      sp.ret_offsets = tr ? nullptr : ret_off.as<int32_t>();
      sp.ret_row = tr ? nullptr : ret_row.as<int32_t>();
      sp.row_token = row_token.as<int32_t>();
      sp.row_weight = row_weight.as<float>();
      sp.slice_counts = slices.as<int32_t>();
      sp.scratch_status = tr ? nullptr : scratch.as<LayerStatus>();
      sp.status = status.as<LayerStatus>();
      sp.send_x = send_x.as<uint8_t>();
      if (cs.fp8) {
        sp.fp8_rows = true;
        sp.send_scales = send_scales.as<float>();
        sp.recv_scales = recv_scales.as<float>();
      }
      sp.send_ids = send_ids.as<int32_t>();
      sp.send_w = send_w.as<float>();
      sp.send_ret = tr ? nullptr : send_ret.as<int32_t>();
      sp.slot_row = slot_row.as<int32_t>();
      sp.overflow = overflow.as<uint32_t>();
      sp.self_rank = cs.self;
      sp.recv_x = recv_x.as<uint8_t>();
      sp.recv_ids = recv_ids.as<int32_t>();
      sp.recv_w = recv_w.as<float>();
      sp.recv_ret = tr ? nullptr : recv_ret.as<int32_t>();
      EXPECT_EQ(ep_send_small_fits(sp), tr && T == 77);
      test::Stream stream;
      launch_ep_send(tab, sp, stream.get());
      LOOM_CUDA_CHECK(cudaStreamSynchronize(stream.get()));

      EXPECT_EQ(overflow.to_host<uint32_t>()[0], uint32_t(ref.overflow));
      EXPECT_EQ(status.to_host<LayerStatus>()[0].dropped_routes, uint32_t(ref.dropped));
      std::vector<int32_t> want_slot_row = ref.slot_row;
      if (tr) {  // the token's send row; this rank's own are read after the P tcap returned rows
        want_slot_row = ref.token_slot_row;
        for (int32_t& r : want_slot_row)
          if (r >= 0 && (r / (tcap / C)) % P == cs.self) r += P * tcap;
      }
      EXPECT_TRUE(slot_row.to_host<int32_t>() == want_slot_row) << "the routes' return rows differ";
      const auto s_x = send_x.to_host<uint16_t>(), r_x = recv_x.to_host<uint16_t>();
      const auto s_q = send_x.to_host<uint8_t>(), r_q = recv_x.to_host<uint8_t>();
      const auto s_sc = send_scales.to_host<float>(), r_sc = recv_scales.to_host<float>();
      const auto s_ids = send_ids.to_host<int32_t>(), r_ids = recv_ids.to_host<int32_t>();
      const auto s_w = send_w.to_host<float>(), r_w = recv_w.to_host<float>();
      const auto s_ret = send_ret.to_host<int32_t>(), r_ret = recv_ret.to_host<int32_t>();
      int sent_rows = 0;
      for (size_t r = 0; r < rows; ++r) {
        // The self rank's segment is in the receive buffers; the other buffer's rows stay poisoned.
        const bool self = int(r / size_t(tcap / C)) % P == cs.self;
        const auto& g_x = self ? r_x : s_x;
        const auto& g_ids = self ? r_ids : s_ids;
        const auto& g_w = self ? r_w : s_w;
        const auto& g_ret = self ? r_ret : s_ret;
        EXPECT_EQ((self ? s_ids : r_ids)[r * k], 0x7f7f7f7f) << "row " << r << " written to the wrong buffer";
        for (int j = 0; j < k; ++j) {
          const size_t a = r * k + size_t(j);
          ASSERT_EQ(g_ids[a], ref.ids[a]) << "row " << r << " slot " << j;
          if (tr) {
            ASSERT_EQ(g_ret[a], 0x7f7f7f7f) << "row " << r << " slot " << j << ": return rows written";
          } else {
            ASSERT_EQ(g_ret[a], ref.ret[a]) << "row " << r << " slot " << j;
          }
          ASSERT_EQ(g_w[a], ref.slot[a] < 0 ? 0.0f : w[size_t(ref.slot[a])]) << "row " << r << " slot " << j;
        }
        const int32_t t = ref.token[r];
        if (t < 0) continue;  // padding: its values are not read
        ++sent_rows;
        if (cs.fp8) {  // H codes a row, then its scales in their own buffer
          const auto& g_q = self ? r_q : s_q;
          const auto& g_sc = self ? r_sc : s_sc;
          for (int h = 0; h < H; ++h)
            ASSERT_EQ(g_q[r * H + size_t(h)], want_codes[size_t(t) * H + size_t(h)]) << "row " << r << " code " << h;
          for (int g = 0; g < G; ++g) ASSERT_EQ(g_sc[r * G + size_t(g)], want_scales[size_t(t) * G + size_t(g)]);
          continue;
        }
        for (int h = 0; h < H; ++h)
          ASSERT_EQ(g_x[r * H + size_t(h)], hidden[size_t(t) * H + size_t(h)]) << "row " << r;
      }
      int64_t want_rows = 0;
      for (int q = 0; q < P; ++q) want_rows += std::min<int64_t>(ref.tokens_to[size_t(q)], tcap);
      EXPECT_EQ(sent_rows, want_rows);
    }
  }
}

}  // namespace
}  // namespace loom::dist
