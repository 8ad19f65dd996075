// The FP8 grouped GEMM alone, on inputs laid out by the CPU references (dispatch, quantise): every
// activation source (gathered by token from token order, an expert-sorted copy, token-order codes
// in A-fragment order loaded into registers, token rows resident in shared memory) and both
// epilogues against grouped_gemm_ref + combine_ref, per row.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <vector>

#include "bench/device_buffer.hpp"
#include "common/bf16.hpp"
#include "common/device_info.hpp"
#include "common/rng.hpp"
#include "dispatch/dispatch_ref.hpp"
#include "gemm/gemm_fp8.hpp"
#include "gemm/select/choose.hpp"
#include "gemm/gemm_ref.hpp"
#include "gpu_test.hpp"
#include "contract/device_layout.hpp"
#include "pipeline/layer_ref.hpp"
#include "quant/quant_ref.hpp"
#include "test_seed.hpp"
#include "workload/workload.hpp"

namespace loom {
namespace {

using bench::DeviceBuffer;

struct GemmCase {
  int64_t tokens, hidden, inter, experts, topk;
  const char* dist;
  // > 0: the weights are an ffn w13 of I = segment (inter = 2 segment), gate and up rows each in
  // their own 128-row blocks (GemmFp8Params::segment_rows).
  int64_t segment = 0;
};

void run_case(const GemmCase& c, CombineMode mode, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "T=" << c.tokens << " K=" << c.hidden << " N=" << c.inter << " E=" << c.experts
                                  << " k=" << c.topk << " " << c.dist << (mode == CombineMode::atomic ? " atomic" : " store")
                                  << (c.segment ? " segments of " : "") << (c.segment ? std::to_string(c.segment) : ""));
  ASSERT_TRUE(c.segment == 0 || c.inter == 2 * c.segment);
  const Shape s{c.tokens, c.hidden, c.inter, c.experts, c.topk, Mode::single, DType::fp8};
  const LayerWeights w =
      c.segment ? make_weights(Shape{c.tokens, c.hidden, c.segment, c.experts, c.topk, Mode::ffn, DType::fp8}, seed)
                : make_weights(s, seed);
  const Routes routes = make_routes(s, Routing{}, parse_distribution(c.dist), seed + 1);
  const std::vector<bf16> hidden = make_hidden(s, seed + 2);
  const Dispatch d = dispatch_ref(routes.topk.ids.data(), s.tokens, s.topk, s.experts);
  const int64_t R = s.routes(), Tp = padded_rows(s.tokens), Rp = padded_rows(R), K = s.hidden, N = s.inter,
                KB = quant_blocks(K);

  // Activations, quantised once per token by the reference, in both layouts the GEMM reads (scales
  // MN-major): token order (x), and the expert-sorted copy (a_sorted). Rows no token or route owns
  // hold NaN codes and scales. The reference's sorted rows (a_rows) are what the GEMM must see.
  std::vector<uint8_t> tq(size_t(s.tokens * K));
  std::vector<float> ts(size_t(s.tokens * KB));
  quantize_1x128_ref(hidden.data(), s.tokens, K, tq.data(), ts.data());
  std::vector<uint8_t> x(size_t(Tp * K), 0x7f), a_sorted(size_t(Rp * K), 0x7f);
  std::vector<float> x_scales(size_t(KB * Tp), NAN), x_scale_quads(size_t(scale_floats(KB, Tp)), NAN),
      a_scales(size_t(KB * Rp), NAN), a_scale_quads(size_t(scale_floats(KB, Rp)), NAN);
  std::copy(tq.begin(), tq.end(), x.begin());
  for (int64_t t = 0; t < s.tokens; ++t)
    for (int64_t g = 0; g < KB; ++g) {
      x_scales[size_t(g * Tp + t)] = ts[size_t(t * KB + g)];
      x_scale_quads[size_t(scale_index(ScaleLayout::row_quads, g, t, Tp))] = ts[size_t(t * KB + g)];
    }
  std::vector<uint8_t> a_rows(size_t(R * K));
  std::vector<float> a_row_scales(size_t(R * KB));
  std::vector<int32_t> row_token(size_t(R), -1);
  std::vector<float> row_weight(size_t(R), NAN);
  for (int64_t route = 0; route < R; ++route) {
    const int32_t row = d.route_row[size_t(route)];
    if (row < 0) continue;
    const int64_t t = route / s.topk;
    std::copy_n(&tq[size_t(t * K)], K, &a_rows[size_t(row * K)]);
    std::copy_n(&tq[size_t(t * K)], K, &a_sorted[size_t(row * K)]);
    for (int64_t g = 0; g < KB; ++g) {
      a_row_scales[size_t(row * KB + g)] = ts[size_t(t * KB + g)];
      a_scales[size_t(g * Rp + row)] = ts[size_t(t * KB + g)];
      a_scale_quads[size_t(scale_index(ScaleLayout::row_quads, g, row, Rp))] = ts[size_t(t * KB + g)];
    }
    row_token[size_t(row)] = int32_t(t);
    row_weight[size_t(row)] = routes.topk.weights[size_t(route)];
  }

  // Reference: the grouped GEMM in double, weighted and summed per token in slot order.
  const int64_t rows = d.offsets.back();
  std::vector<double> y(size_t(rows * N));
  ActivationRows ar;
  ar.dtype = DType::fp8;
  ar.rows = rows;
  ar.cols = K;
  ar.q = a_rows.data();
  ar.scales = a_row_scales.data();
  grouped_gemm_ref(ar, d.offsets.data(), w.w1_view(), y.data());
  std::vector<double> ref;
  if (mode == CombineMode::atomic) {
    ref.resize(size_t(s.tokens * N));
    combine_ref(y.data(), N, d, routes.topk, ref.data());
  } else {  // each sorted row holds weight * (x . W^T)
    ref.resize(size_t(rows * N));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t n = 0; n < N; ++n) ref[size_t(r * N + n)] = double(row_weight[size_t(r)]) * y[size_t(r * N + n)];
  }

  DeviceBuffer dw = DeviceBuffer::from(w.w1_q), dws = DeviceBuffer::from(w.w1_scales);
  // The token-order codes again in wgmma A-fragment order, for the kernel that loads them into
  // registers (whole 128-groups only).
  std::vector<uint8_t> x_frag(x.size(), 0x7f);
  const bool frag_ok = K % 128 == 0 && K >= kRegsRing * 128 && K <= kRegsMaxK;  // what the register-loaded kernel takes
  if (frag_ok) to_fragment_order(x.data(), Tp, K, x_frag.data());
  // ... and the expert-sorted copy in fragment order (the ffn intermediate's layout).
  std::vector<uint8_t> a_frag(a_sorted.size(), 0x7f);
  if (frag_ok) to_fragment_order(a_sorted.data(), Rp, K, a_frag.data());
  DeviceBuffer dx = DeviceBuffer::from(x), dxs = DeviceBuffer::from(x_scales), dxf = DeviceBuffer::from(x_frag),
               dxsq = DeviceBuffer::from(x_scale_quads);
  DeviceBuffer da = DeviceBuffer::from(a_sorted), daf = DeviceBuffer::from(a_frag), das = DeviceBuffer::from(a_scales),
               dasq = DeviceBuffer::from(a_scale_quads);
  DeviceBuffer doff = DeviceBuffer::from(d.offsets), dtok = DeviceBuffer::from(row_token),
               dwt = DeviceBuffer::from(row_weight);
  const int64_t out_rows = mode == CombineMode::atomic ? s.tokens : R;
  DeviceBuffer dout(size_t(out_rows * N) * 4);
  DeviceBuffer dqueue(2 * sizeof(int32_t));
  LOOM_CUDA_CHECK(cudaMemset(dqueue.get(), 0, dqueue.bytes()));
  // The hit list a fused small-batch kernel would write: {count}, then (expert, first row, rows).
  std::vector<int32_t> hits = hit_list_ref(d.offsets);
  hits.resize(size_t(s.experts + 1) * 4, -1);  // entries past the count: stale, never read
  DeviceBuffer dhits = DeviceBuffer::from(hits);
  bool with_hit_list = false;
  bool frag_scale_quads = false;  // the register-loaded kernel reads either scale layout
  GemmFp8Params p;
  p.weights = dw.as<uint8_t>();
  p.weight_scales = dws.as<float>();
  p.offsets = doff.as<int32_t>();
  p.row_token = dtok.as<int32_t>();
  p.row_weight = dwt.as<float>();
  p.out = dout.as<float>();
  p.experts = int(s.experts);
  p.n = int(N);
  p.k = int(K);
  p.segment_rows = int(c.segment);
  p.combine = mode;
  const DeviceInfo dev = *query_device();
  auto launch = [&](const GemmConfig& cfg, bool pdl = false) {
    const bool frag = x_source(cfg) == XSource::token_fragments;
    const bool sorted_frag = x_source(cfg) == XSource::sorted_fragments;
    const bool gather = x_source(cfg) == XSource::gather_by_token || frag;
    p.x = sorted_frag ? daf.as<uint8_t>() : frag ? dxf.as<uint8_t>() : gather ? dx.as<uint8_t>() : da.as<uint8_t>();
    // Sorted rows under the hand-off epilogue read their scales in row quads; token fragments in
    // either layout; sorted fragments in row quads (as the ffn intermediate's kernel writes them).
    const auto* wmc = std::get_if<WeightsOnMConfig>(&cfg);
    const bool quads = (wmc && wmc->handoff) || (frag && frag_scale_quads) || sorted_frag;
    p.x_scale_layout = quads ? ScaleLayout::row_quads : ScaleLayout::group_major;
    p.x_scales = gather ? (quads ? dxsq.as<float>() : dxs.as<float>()) : quads ? dasq.as<float>() : das.as<float>();
    p.x_rows = gather ? Tp : Rp;
    // Atomic mode accumulates into zeros; store mode must overwrite every valid row (poison it).
    LOOM_CUDA_CHECK(cudaMemset(dout.get(), mode == CombineMode::atomic ? 0 : 0xff, dout.bytes()));
    p.work_queue = uses_work_queue(cfg) ? dqueue.as<int32_t>() : nullptr;
    p.hit_list = with_hit_list ? dhits.as<int4>() : nullptr;
    launch_gemm_fp8(p, cfg, dev, nullptr, pdl);
    LOOM_CUDA_CHECK(cudaGetLastError());
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());
    // The dynamic walk leaves its queue zero for the next launch.
    const std::vector<int32_t> queue = dqueue.to_host<int32_t>();
    EXPECT_EQ(queue[0], 0) << key(cfg);
    EXPECT_EQ(queue[1], 0) << key(cfg);
    return dout.to_host<float>();
  };

  // Resident token rows (weights on M, an expert's rows in shared memory over all of K, in chunks of
  // at most resident_rows_capacity), round robin and from the queue, with and without PDL.
  auto run_resident = [&](bool pdl, const char* routes) {
    if (resident_rows_capacity(N, K) == 0 || c.segment % 128) return;  // plain 128-row blocks only
    ResidentConfig cfg;
    cfg.weights_evict_first = pdl;
    cfg.dynamic = pdl;
    SCOPED_TRACE(key(cfg) + ", " + routes);
    const std::vector<float> res = launch(cfg, pdl);
    const ErrorStats e = relative_error(res.data(), ref.data(), out_rows, N);
    EXPECT_LE(e.overall, 2e-3);
    EXPECT_LE(e.worst_row, 1e-2) << "worst token row " << e.worst_row_index;
  };

  GemmProblem problem;
  problem.tokens = s.tokens;
  problem.topk = s.topk;
  problem.experts = s.experts;
  problem.n = N;
  problem.k = K;
  problem.deterministic = mode == CombineMode::store;
  problem.allow_tokens_on_m = false;  // the weights-on-M variants and walks below start from its choice
  WeightsOnMConfig chosen = std::get<WeightsOnMConfig>(choose_gemm_config(problem, dev));
  std::vector<float> got, got_default;
  // Both activation sources and both epilogues (sorted rows). Every kernel instantiation runs:
  // gathered batches (chunks of at most 32 rows, so experts with more rows take several), sorted
  // rows with either epilogue.
  struct Variant {
    XSource source;
    bool handoff;
  };
  for (const auto& [source, handoff] : {Variant{XSource::gather_by_token, false},
                                        Variant{XSource::sorted_rows, false}, Variant{XSource::sorted_rows, true}}) {
    WeightsOnMConfig cfg = chosen;
    const bool sorted = source == XSource::sorted_rows;
    cfg.rows = sorted ? WmRows::sorted : WmRows::gather;
    cfg.balanced = cfg.balanced && !sorted;
    cfg.dynamic = sorted;  // as the chooser pairs them
    cfg.handoff = handoff;
    cfg.x_evict_first = cfg.x_evict_first && sorted;
    cfg.warm_up = false;
    SCOPED_TRACE(key(cfg));
    got = launch(cfg);
    if (source == XSource::gather_by_token) got_default = got;
    const ErrorStats e = relative_error(got.data(), ref.data(), out_rows, N);
    EXPECT_LE(e.overall, 2e-3);
    EXPECT_LE(e.worst_row, 1e-2) << "worst " << (mode == CombineMode::atomic ? "token" : "sorted") << " row "
                                 << e.worst_row_index;
  }
  // Token rows on M, loaded into A-fragment registers (its own kernel), both tile shapes, with and
  // without PDL, round robin and with the dynamic tail, scales group-major and in row quads.
  if (frag_ok)
    for (const bool wide : {false, true})
    for (const bool pdl : {false, true})
    for (const bool dynamic : {false, true})
    for (const bool quads : {false, true}) {
      if (wide && K % 256 != 0) continue;  // wide tiles take an even number of K blocks
      TokensOnMConfig cfg;
      cfg.wide = wide;
      cfg.dynamic = dynamic;
      cfg.store = mode == CombineMode::store;
      frag_scale_quads = quads;
      SCOPED_TRACE(key(cfg) + (quads ? ", scales in row quads" : ", scales group-major"));
      got = launch(cfg, pdl);
      const ErrorStats e = relative_error(got.data(), ref.data(), out_rows, N);
      EXPECT_LE(e.overall, 2e-3);
      EXPECT_LE(e.worst_row, 1e-2) << "worst " << (mode == CombineMode::atomic ? "token" : "sorted") << " row "
                                   << e.worst_row_index;
    }
  // Token rows on M read by sorted row (the ffn intermediate's instances: A from the expert-sorted
  // copy in fragment order, the combine by token), both tile shapes.
  if (frag_ok)
    for (const bool wide : {false, true}) {
      if (wide && K % 256 != 0) continue;
      TokensOnMConfig cfg;
      cfg.wide = wide;
      cfg.sorted = true;
      cfg.store = mode == CombineMode::store;
      SCOPED_TRACE(key(cfg));
      got = launch(cfg, true);
      const ErrorStats e = relative_error(got.data(), ref.data(), out_rows, N);
      EXPECT_LE(e.overall, 2e-3);
      EXPECT_LE(e.worst_row, 1e-2) << "worst " << (mode == CombineMode::atomic ? "token" : "sorted") << " row "
                                   << e.worst_row_index;
    }
  // Expert bins (what the routing fills for the fast combine): each expert's rows in a bin of its
  // own, stride beyond the most rows, in a shuffled order; the slots past a bin's count hold token 0
  // with a NaN weight, which would poison the output if the kernel read them. Read by the
  // register-loaded kernel and by the gathering one (its chunk walk: an expert's rows in chunks of
  // at most 32, each chunk its own unit).
  if (mode == CombineMode::atomic) {
    const int stride = int(s.tokens) + 3;
    std::vector<int32_t> counts(size_t(s.experts) * kBinCountStride, -1), bin_token(size_t(s.experts * stride), 0);
    std::vector<float> bin_weight(size_t(s.experts * stride), NAN);
    Rng shuffle(seed + 3);
    for (int64_t e = 0; e < s.experts; ++e) {
      const int32_t first = d.offsets[size_t(e)], n = d.offsets[size_t(e + 1)] - first;
      counts[size_t(e) * kBinCountStride] = n;  // the words between counters: -1, never read
      std::vector<int32_t> order(static_cast<size_t>(n));
      for (int32_t i = 0; i < n; ++i) order[size_t(i)] = i;
      for (int32_t i = n - 1; i > 0; --i) std::swap(order[size_t(i)], order[size_t(shuffle.below(uint64_t(i) + 1))]);
      for (int32_t i = 0; i < n; ++i) {
        bin_token[size_t(e * stride + i)] = row_token[size_t(first + order[size_t(i)])];
        bin_weight[size_t(e * stride + i)] = row_weight[size_t(first + order[size_t(i)])];
      }
    }
    DeviceBuffer dcounts = DeviceBuffer::from(counts), dbtok = DeviceBuffer::from(bin_token),
                 dbwt = DeviceBuffer::from(bin_weight);
    p.offsets = nullptr;
    p.expert_counts = dcounts.as<int32_t>();
    p.expert_stride = stride;
    p.row_token = dbtok.as<int32_t>();
    p.row_weight = dbwt.as<float>();
    for (const bool wide : {false, true}) {
      if (!frag_ok || (wide && K % 256 != 0)) continue;
      TokensOnMConfig cfg;
      cfg.wide = wide;
      cfg.dynamic = true;
      frag_scale_quads = wide;  // both layouts, as the pipeline's token fragments take row quads
      SCOPED_TRACE(key(cfg) + ", expert bins" + (wide ? ", scales in row quads" : ""));
      got = launch(cfg, true);
      const ErrorStats e = relative_error(got.data(), ref.data(), out_rows, N);
      EXPECT_LE(e.overall, 2e-3);
      EXPECT_LE(e.worst_row, 1e-2) << "worst token row " << e.worst_row_index;
    }
    // Gathering: round robin or balanced shares, with PDL (the dry walk before the wait over the
    // first chunks) and without.
    for (const bool balanced : {false, true})
      for (const bool pdl : {false, true}) {
        WeightsOnMConfig cfg = chosen;
        cfg.rows = WmRows::bins;
        cfg.dense = false;
        cfg.split_k = 1;
        cfg.dynamic = false;
        cfg.handoff = false;
        cfg.x_evict_first = false;
        cfg.balanced = balanced;
        cfg.warm_up = true;
        SCOPED_TRACE(key(cfg) + ", expert bins");
        got = launch(cfg, pdl);
        const ErrorStats e = relative_error(got.data(), ref.data(), out_rows, N);
        EXPECT_LE(e.overall, 2e-3);
        EXPECT_LE(e.worst_row, 1e-2) << "worst token row " << e.worst_row_index;
      }
    for (const bool pdl : {false, true}) run_resident(pdl, "expert bins");
    p.offsets = doff.as<int32_t>();
    p.expert_counts = nullptr;
    p.expert_stride = 0;
    p.row_token = dtok.as<int32_t>();
    p.row_weight = dwt.as<float>();
    run_resident(true, "offsets");
  }
  // Route rows in bf16 (GemmFp8Params::store_bf16, the ffn layer's deterministic GEMM 2): the same
  // run's fp32 rows, each rounded to nearest even, bit for bit, in every epilogue that stores rows.
  if (mode == CombineMode::store) {
    std::vector<GemmConfig> configs;
    for (const bool handoff : {false, true}) {
      WeightsOnMConfig cfg = chosen;
      cfg.rows = WmRows::sorted;
      cfg.balanced = false;
      cfg.dynamic = true;
      cfg.handoff = handoff;
      cfg.warm_up = false;
      configs.push_back(cfg);
    }
    if (frag_ok)
      for (const bool sorted : {false, true}) {
        TokensOnMConfig cfg;
        cfg.sorted = sorted;
        cfg.store = true;
        configs.push_back(cfg);
      }
    for (const GemmConfig& cfg : configs) {
      SCOPED_TRACE(key(cfg) + ", bf16 route rows");
      frag_scale_quads = false;
      const std::vector<float> f32 = launch(cfg, true);
      p.store_bf16 = true;
      const std::vector<float> raw = launch(cfg, true);
      p.store_bf16 = false;
      std::vector<uint16_t> b16(size_t(R * N));
      std::memcpy(b16.data(), raw.data(), b16.size() * 2);
      int64_t bad = 0;
      for (int64_t i = 0; i < R * N; ++i) bad += b16[size_t(i)] != float_to_bf16(f32[size_t(i)]).bits;
      EXPECT_EQ(bad, 0) << "bf16 route rows other than the fp32 rows rounded";
    }
  }
  // Every unit walk (dense / compact, round robin / balanced shares / dynamic queue) and split-K
  // setting computes the same product.
  if (mode == CombineMode::atomic) {
    const std::vector<double> base(got_default.begin(), got_default.end());
    struct Walk {
      bool dense;
      int split;
      bool balanced, dynamic;
    };
    for (const auto& [dense, split, balanced, dynamic] :
         {Walk{true, 1, false, false}, Walk{false, 1, false, false}, Walk{false, 3, false, false},
          Walk{false, 1, true, false}, Walk{true, 1, true, false}, Walk{true, 1, false, true},
          Walk{false, 1, false, true}, Walk{false, 3, false, true}}) {
      WeightsOnMConfig cfg = chosen;
      cfg.rows = dynamic ? WmRows::sorted : WmRows::gather;
      cfg.dense = dense;
      cfg.split_k = split;
      cfg.balanced = balanced;
      cfg.dynamic = dynamic;
      cfg.handoff = dynamic;
      cfg.x_evict_first = cfg.x_evict_first && dynamic;
      // Compact walks also from a hit list (as after the fused small-batch kernel). PDL launches:
      // gathered batches with a hit list or a dense walk then run the producer's dry walk before
      // the wait (WeightsOnMConfig::warm_up), which must leave no trace in the result.
      for (const bool hit_list : {false, true}) {
        if (hit_list && dense) continue;
        with_hit_list = hit_list;
        cfg.warm_up = !dynamic && (dense || hit_list);
        const std::vector<float> again = launch(cfg, true);
        const ErrorStats e = relative_error(again.data(), base.data(), s.tokens, N);
        EXPECT_LE(e.overall, 1e-5) << key(cfg) << (hit_list ? ", hit list" : "");
      }
      with_hit_list = false;
    }
  }
}

// Each test's cases: the full list in a plain run; under compute-sanitizer (a kernel there runs
// hundreds of times slower) the same paths on smaller K, N and expert counts (`instrumented`).
struct ModeCase {
  GemmCase shape;
  CombineMode mode;
};
void run_cases(const std::vector<ModeCase>& full, const std::vector<ModeCase>& instrumented, uint64_t seed) {
  for (const ModeCase& c : test::sanitizer().empty() ? full : instrumented) run_case(c.shape, c.mode, seed);
}
constexpr CombineMode kAtomic = CombineMode::atomic, kStore = CombineMode::store;

TEST(GemmFp8Gpu, SeedShapeBothEpilogues) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  run_cases({{{128, 2048, 512, 256, 8, "random"}, kAtomic}, {{128, 2048, 512, 256, 8, "random"}, kStore}},
            {{{64, 512, 256, 16, 8, "random"}, kAtomic}, {{64, 512, 256, 16, 8, "random"}, kStore}}, seed);
}

TEST(GemmFp8Gpu, ChunkWidthsFromOneToManyRowsPerExpert) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  // 1..16 rows (width 16), 17..32, 33..64, > 128 (two chunks) and hot / concentrated skew; 512
  // experts: the chunk walk's 16 groups of 32 over 12 warps (warps 0-3 take two), and hot experts
  // with several chunks each.
  run_cases({{{1, 2048, 512, 8, 1, "balanced"}, kAtomic},
             {{40, 2048, 512, 8, 4, "balanced"}, kAtomic},      // 20 rows each
             {{100, 2048, 512, 16, 8, "balanced"}, kAtomic},    // 50 rows each
             {{150, 2048, 512, 16, 8, "balanced"}, kStore},     // 75 rows: one 128-wide chunk
             {{300, 1024, 256, 8, 2, "concentrated"}, kAtomic}, // 300 rows: 128+128+44
             {{128, 2048, 512, 256, 8, "hot:0.9"}, kStore},
             {{128, 2048, 512, 256, 8, "zipf:1.2"}, kAtomic},
             {{200, 512, 256, 512, 8, "hot:0.9"}, kAtomic}},
            {{{1, 512, 256, 8, 1, "balanced"}, kAtomic},
             {{40, 512, 256, 8, 4, "balanced"}, kAtomic},
             {{100, 384, 256, 16, 8, "balanced"}, kAtomic},
             {{150, 384, 256, 16, 8, "balanced"}, kStore},
             {{300, 384, 128, 8, 2, "concentrated"}, kAtomic},
             {{64, 256, 128, 512, 8, "hot:0.9"}, kAtomic}},
            seed);
}

TEST(GemmFp8Gpu, RowTilesOfManyRowsPerExpert) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  // Experts with ~64 and ~256 rows (the tiles of the register-loaded kernel: 128 rows, a last one
  // with one or both warpgroups partly or wholly empty; or 64 rows x two weight blocks), skew, N
  // ending in a partial 128-block, an odd number of weight blocks (a wide tile's second block past N).
  run_cases({{{2048, 2048, 512, 256, 8, "random"}, kAtomic},
             {{1000, 1024, 336, 16, 4, "random"}, kAtomic},
             {{1000, 1024, 336, 16, 4, "zipf:1.2"}, kStore},
             {{1000, 2048, 512, 32, 8, "random"}, kStore},
             {{1000, 1024, 208, 16, 4, "zipf:1.2"}, kAtomic},
             {{600, 7168, 256, 8, 2, "concentrated"}, kAtomic}},
            {{{500, 512, 336, 8, 2, "random"}, kAtomic},
             {{500, 512, 336, 8, 2, "zipf:1.2"}, kStore},
             {{500, 512, 208, 8, 2, "zipf:1.2"}, kAtomic}},
            seed);
}

TEST(GemmFp8Gpu, PartialBlocksAndWideShapes) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  const std::vector<ModeCase> small{
      {{17, 192, 80, 8, 2, "random"}, kAtomic},  // K and N end in partial 128-blocks
      {{17, 320, 208, 8, 2, "random"}, kStore},
      // Chunks of 128, 128 and 44 rows with partial K and N blocks.
      {{300, 320, 208, 8, 2, "concentrated"}, kStore},
      {{300, 192, 80, 8, 2, "concentrated"}, kAtomic},
      // K of 3, 5 and 6 whole blocks for the register-loaded kernel: its row quads of scales end
      // short (a unit's last quad of 3, 1 and 2 blocks), its ring rotates (3 and 5), 6 takes wide
      // tiles too.
      {{200, 384, 144, 8, 2, "random"}, kAtomic},
      {{150, 640, 208, 8, 2, "concentrated"}, kAtomic},
      {{150, 768, 80, 8, 2, "random"}, kStore},
      // K of 6, 7 and 9 blocks with tiles of at most 64 rows beside whole ones (zipf): the
      // activation ring's slots rotate from unit to unit (7, 9), and tiles with padding rows
      // zero-fill them.
      {{200, 768, 208, 8, 2, "random"}, kAtomic},
      {{180, 896, 336, 8, 3, "zipf:1.2"}, kAtomic},
      {{200, 1152, 208, 8, 2, "random"}, kAtomic}};
  std::vector<ModeCase> full = small;
  full.push_back({{3, 7168, 4096, 64, 2, "random"}, kAtomic});  // wide: 56 K blocks, 32 N blocks
  run_cases(full, small, seed);
}

// ffn w13 with I not a multiple of 128: N = 2I in two segments (gate, up), each cut into its own
// 128-row blocks, the last one partial (its rows past the segment are loaded, never stored); every
// weights-on-M and tokens-on-M variant, chunks and row tiles from 1 to ~250 rows per expert.
TEST(GemmFp8Gpu, GateAndUpSegmentsOfPartialBlocks) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  const std::vector<ModeCase> small{{{17, 256, 384, 8, 2, "random", 192}, kStore},
                                    {{300, 512, 160, 8, 2, "concentrated", 80}, kAtomic},
                                    {{500, 512, 640, 8, 2, "zipf:1.2", 320}, kStore}};
  std::vector<ModeCase> full = small;
  full.push_back({{300, 512, 384, 8, 2, "concentrated", 192}, kAtomic});
  full.push_back({{2048, 1024, 640, 16, 8, "random", 320}, kStore});
  full.push_back({{2048, 2048, 384, 64, 8, "zipf:1.2", 192}, kAtomic});
  run_cases(full, small, seed);
}

}  // namespace
}  // namespace loom
