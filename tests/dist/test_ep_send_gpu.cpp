// Expert parallelism's send side on the GPU (dist/ep_send_sm90.cuh) against dist::send_layout_ref,
// no NCCL: the owner of every route, launch_dispatch over the ranks, then the packed segments in
// one part and in three (ep_send_row). Ids out of range (dropped) and a cap below one peer's count
// (overflow) are in every case; outputs are poisoned first.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "bench/device_buffer.hpp"
#include "dispatch/dispatch_sm90.cuh"
#include "dist/ep_routes_ref.hpp"
#include "dist/ep_send_sm90.cuh"
#include "gpu_test.hpp"
#include "test_seed.hpp"

namespace loom::dist {
namespace {

using bench::DeviceBuffer;

TEST(EpSendGpu, SegmentsEqualTheReferenceLayout) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  constexpr int T = 77, k = 4, E = 24, P = 4, H = 64;
  std::mt19937_64 rng(seed);
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
  for (uint16_t& h : hidden) h = uint16_t(rng());
  const SendLayout ref = send_layout_ref(pl, ids.data(), T, k);
  EpTables tab{};
  for (int e = 0; e < E; ++e) {
    tab.owner[e] = uint16_t(pl.owner[size_t(e)]);
    tab.local[e] = uint16_t(pl.local_index[size_t(e)]);
  }
  for (const int chunks : {1, 3}) {
    SCOPED_TRACE("chunks " + std::to_string(chunks));
    const int cap = 66;  // below rank 2's count, a multiple of both part counts
    ASSERT_GT(ref.counts[2], cap);
    DeviceBuffer d_ids = DeviceBuffer::from(ids), d_w = DeviceBuffer::from(w), d_h = DeviceBuffer::from(hidden);
    DeviceBuffer dest(ids.size() * 4), offsets(size_t(P + 1) * 4), route_row(ids.size() * 4),
        row_token(ids.size() * 4), row_weight(ids.size() * 4), slot_row(ids.size() * 4), status(sizeof(LayerStatus)),
        slices(dispatch_slice_count_bytes(T, k, P)), send_x(size_t(P * cap * H) * 2), send_ids(size_t(P * cap) * 4),
        send_w(size_t(P * cap) * 4), overflow(4);
    for (DeviceBuffer* b : {&dest, &offsets, &route_row, &slot_row, &send_x, &send_ids, &send_w, &overflow})
      test::fill(b->get(), 0x7f, b->bytes());
    EpSendParams sp;
    sp.hidden = d_h.as<uint16_t>();
    sp.ids = d_ids.as<int32_t>();
    sp.weights = d_w.as<float>();
    sp.dest = dest.as<int32_t>();
    sp.offsets = offsets.as<int32_t>();
    sp.route_row = route_row.as<int32_t>();
    sp.tokens = T;
    sp.topk = k;
    sp.hidden_dim = H;
    sp.experts = E;
    sp.ranks = P;
    sp.rows_per_peer = cap;
    sp.chunks = chunks;
    sp.send_x = send_x.as<uint16_t>();
    sp.send_ids = send_ids.as<int32_t>();
    sp.send_w = send_w.as<float>();
    sp.slot_row = slot_row.as<int32_t>();
    sp.overflow = overflow.as<uint32_t>();
    test::Stream stream;
    launch_ep_owner(tab, sp, stream.get());
    DispatchParams dp;
    dp.topk_ids = sp.dest;
    dp.topk_weights = sp.weights;
    dp.tokens = T;
    dp.topk = k;
    dp.experts = P;
    dp.offsets = offsets.as<int32_t>();
    dp.route_row = route_row.as<int32_t>();
    dp.row_token = row_token.as<int32_t>();
    dp.row_weight = row_weight.as<float>();
    dp.status = status.as<LayerStatus>();
    dp.slice_counts = slices.as<int32_t>();
    launch_dispatch(dp, stream.get(), false);
    launch_ep_pack_rows(tab, sp, stream.get());
    launch_ep_pad_segments(sp, stream.get());
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream.get()));

    const auto g_off = offsets.to_host<int32_t>();
    for (int q = 0; q <= P; ++q) ASSERT_EQ(g_off[size_t(q)], ref.offsets[size_t(q)]) << "offset " << q;
    uint32_t over = 0;
    for (int q = 0; q < P; ++q) over += uint32_t(std::max<int64_t>(0, ref.counts[size_t(q)] - cap));
    EXPECT_EQ(overflow.to_host<uint32_t>()[0], over);
    const auto g_slot = slot_row.to_host<int32_t>();
    const auto g_x = send_x.to_host<uint16_t>();
    const auto g_ids = send_ids.to_host<int32_t>();
    const auto g_w = send_w.to_host<float>();
    std::vector<int> filled(size_t(P * cap), 0);
    for (int s = 0; s < T * k; ++s) {
      const int32_t pos = ref.position[size_t(s)];
      int32_t want = -1;
      if (pos >= 0) {
        const int q = pl.owner[size_t(ids[size_t(s)])];
        const int i = pos - int(ref.offsets[size_t(q)]);
        if (i < cap) want = ep_send_row(q, i, P, cap, chunks);
      }
      ASSERT_EQ(g_slot[size_t(s)], want) << "slot " << s;
      if (want < 0) continue;
      filled[size_t(want)] = 1;
      EXPECT_EQ(g_ids[size_t(want)], ref.local_expert[size_t(pos)]) << "slot " << s;
      EXPECT_EQ(g_w[size_t(want)], w[size_t(s)]) << "slot " << s;
      for (int h = 0; h < H; ++h)
        ASSERT_EQ(g_x[size_t(want) * H + size_t(h)], hidden[size_t(s / k) * H + size_t(h)]) << "slot " << s;
    }
    // Every other row is padding: id -1, weight 0; each sent row's place is distinct and in range.
    int sent = 0;
    for (int r = 0; r < P * cap; ++r) {
      sent += filled[size_t(r)];
      if (filled[size_t(r)]) continue;
      EXPECT_EQ(g_ids[size_t(r)], -1) << "row " << r;
      EXPECT_EQ(g_w[size_t(r)], 0.0f) << "row " << r;
    }
    int64_t want_sent = 0;
    for (int q = 0; q < P; ++q) want_sent += std::min<int64_t>(ref.counts[size_t(q)], cap);
    EXPECT_EQ(sent, want_sent);
  }
}

}  // namespace
}  // namespace loom::dist
