// The fused BF16 -> FP8 quantise + gather kernel against quantize_1x128_ref gathered on the host:
// codes and scales bit for bit in every sorted row a route targets, poison left untouched everywhere
// else (nothing written out of place), and the fast combine's output cleared to +0; and the same
// from pre-quantised rows (their codes and scales copied into the layout).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "common/bf16.hpp"
#include "common/cuda_check.hpp"
#include "common/rng.hpp"
#include "dispatch/dispatch_ref.hpp"
#include "bench/device_buffer.hpp"
#include "gpu_test.hpp"
#include "loom/types.hpp"
#include "contract/device_layout.hpp"
#include "quant/quant_gather_sm90.cuh"
#include "quant/quant_ref.hpp"
#include "test_seed.hpp"
#include "workload/workload.hpp"

namespace loom {
namespace {

constexpr uint8_t kCodePoison = 0x7f;
constexpr uint32_t kNaNBits = 0x7fc00000u;  // scales and zero_out poison

using DevBuf = bench::DeviceBuffer;
using test::Stream;

// Overwrites group g of row `row` (elements [c0, c1)) with one of the awkward contents the kernel
// must reproduce exactly. Kind 0..7; anything else leaves make_hidden's normal values.
void inject_group(std::vector<bf16>& h, int64_t row, int64_t H, int64_t g, int kind, Rng& rng) {
  const int64_t c0 = g * kQuantBlock, c1 = std::min(H, c0 + kQuantBlock);
  bf16* x = h.data() + row * H;
  auto pick = [&] { return c0 + int64_t(rng.below(uint64_t(c1 - c0))); };
  auto sign = [&] { return rng.below(2) ? 0x8000u : 0u; };
  switch (kind) {
    case 0:  // all zeros, both signs: amax 0 -> the 1e-10 floor; codes 0x00 / 0x80
      for (int64_t c = c0; c < c1; ++c) x[c].bits = uint16_t(sign());
      break;
    case 1:  // a few NaNs (quiet, "signalling" payload, negative) among normal values: ignored by amax, code 0x7f
      for (int i = 0; i < 3; ++i) {
        const uint16_t nans[3] = {0x7fc0, 0xffc0, 0x7f81};
        x[pick()].bits = nans[i];
      }
      break;
    case 2:  // huge magnitudes up to bf16's largest finite value (3.39e38)
      for (int64_t c = c0; c < c1; ++c) x[c] = float_to_bf16(float(rng.normal() * 1e37));
      x[pick()].bits = uint16_t(0x7f7f | sign());
      break;
    case 3:  // tiny: bf16 subnormals and the smallest normals; amax < 1e-10, so the floor wins
      for (int64_t c = c0; c < c1; ++c)
        x[c].bits = uint16_t(sign() | (rng.below(2) ? rng.below(0x80) : 0x0080 + rng.below(0x80)));
      break;
    case 4:  // amax just around the floor (1e-10): some groups above it, some below
      for (int64_t c = c0; c < c1; ++c) x[c] = float_to_bf16(float(rng.normal() * 4e-11));
      break;
    case 5:  // an infinity: scale = inf, finite values -> +-0, the inf itself -> NaN code
      x[pick()].bits = uint16_t(0x7f80 | sign());
      break;
    case 6:  // all NaN: amax 0 (floor), every code 0x7f
      for (int64_t c = c0; c < c1; ++c) x[c].bits = uint16_t(0x7fc0 | sign());
      break;
    case 7:  // wide dynamic range inside one group: most codes subnormal or zero
      for (int64_t c = c0; c < c1; ++c) x[c] = float_to_bf16(float(rng.normal() * std::ldexp(1.0, -int(rng.below(40)))));
      x[pick()] = float_to_bf16(float(1000.0 * (sign() ? -1 : 1)));
      break;
    default:
      break;
  }
}

struct Case {
  int T, H, k, E;
  int64_t zero_cols;  // < 0: no zero_out buffer
  Distribution dist;
  bool pdl;
  bool token_order = false;  // route_row = nullptr: row t = token t (what the pipeline runs)
  ScaleLayout scale_layout = ScaleLayout::group_major;  // row_quads: sorted rows only
  bool fragment_order = false;  // token order, H % 128 == 0: codes in wgmma A-fragment order
  bool pre_quantised = false;   // the reference's codes and scales given (QuantGatherParams::codes)
};

std::string describe(const Case& c) {
  std::ostringstream s;
  s << "T=" << c.T << " H=" << c.H << " k=" << c.k << " E=" << c.E << " zero_cols=" << c.zero_cols
    << " dist=" << to_string(c.dist) << " pdl=" << c.pdl << (c.token_order ? " token-order" : " gathered")
    << (c.scale_layout == ScaleLayout::row_quads ? " scales in row quads" : " scales group-major")
    << (c.fragment_order ? " codes in fragment order" : "") << (c.pre_quantised ? " pre-quantised" : "");
  return s.str();
}

// Routes with some dropped: out-of-range expert ids (negative and >= E) on random routes, and every
// route of one token when T >= 3.
Dispatch make_dispatch(const Case& c, uint64_t seed) {
  Shape shape;
  shape.tokens = c.T;
  shape.hidden = c.H;
  shape.inter = 16;
  shape.experts = c.E;
  shape.topk = c.k;
  Routes routes = make_routes(shape, Routing{}, c.dist, seed);
  std::vector<int32_t> ids = routes.topk.ids;
  Rng rng(seed, 77);
  for (auto& id : ids)
    if (rng.below(8) == 0) id = rng.below(2) ? -1 : c.E + int32_t(rng.below(3));
  if (c.T >= 3)
    for (int j = 0; j < c.k; ++j) ids[size_t((c.T / 2) * c.k + j)] = -1;
  return dispatch_ref(ids.data(), c.T, c.k, c.E);
}

void run_case(const Case& c, uint64_t seed) {
  SCOPED_TRACE(describe(c));
  const int64_t T = c.T, H = c.H, k = c.k;
  const int64_t G = quant_blocks(H);
  const int64_t R_pad = c.token_order ? padded_rows(T) : padded_rows(T * k);

  Shape shape;
  shape.tokens = T;
  shape.hidden = H;
  shape.inter = 16;
  shape.experts = c.E;
  shape.topk = k;
  std::vector<bf16> hidden = make_hidden(shape, seed);
  Rng rng(seed, 99);
  // The first units cycle through every awkward kind (offset by the case so small shapes see them
  // all across cases); after that one group in four is awkward.
  for (int64_t u = 0; u < T * G; ++u) {
    const int kind = u < 8 ? int((u + seed) % 8) : (rng.below(4) == 0 ? int(rng.below(8)) : -1);
    inject_group(hidden, u / G, H, u % G, kind, rng);
  }
  const Dispatch d = make_dispatch(c, seed);

  // Host expectation: quantise every token once, copy to each of its sorted rows (token order: to
  // row t; the padding rows keep their poison).
  std::vector<uint8_t> q_ref(size_t(T * H));
  std::vector<float> s_ref(size_t(T * G));
  quantize_1x128_ref(hidden.data(), T, H, q_ref.data(), s_ref.data());
  const std::vector<uint8_t> q_plain = q_ref;  // what a pre-quantised source gives, token-major
  if (c.fragment_order) {
    std::vector<uint8_t> plain = q_ref;
    to_fragment_order(plain.data(), T, H, q_ref.data());
  }
  std::vector<uint8_t> want_a(size_t(R_pad * H), kCodePoison);
  std::vector<uint32_t> want_s(size_t(scale_floats(G, R_pad)), kNaNBits);
  for (int64_t r = 0; r < (c.token_order ? T : T * k); ++r) {
    const int32_t row = c.token_order ? int32_t(r) : d.route_row[size_t(r)];
    if (row < 0) continue;
    const int64_t t = c.token_order ? r : r / k;
    std::memcpy(want_a.data() + row * H, q_ref.data() + t * H, size_t(H));
    for (int64_t g = 0; g < G; ++g)
      std::memcpy(&want_s[size_t(scale_index(c.scale_layout, g, row, R_pad))], &s_ref[size_t(t * G + g)], 4);
  }

  // Device buffers, outputs poisoned.
  DevBuf d_hidden(hidden.size() * 2), d_route(d.route_row.size() * 4), d_a(want_a.size()), d_s(want_s.size() * 4);
  const int64_t zc = c.zero_cols < 0 ? 0 : c.zero_cols;
  DevBuf d_zero(size_t(T * zc) * 4);
  d_hidden.upload(hidden);
  d_route.upload(d.route_row);
  d_a.upload(std::vector<uint8_t>(want_a.size(), kCodePoison));
  d_s.upload(std::vector<uint32_t>(want_s.size(), kNaNBits));
  d_zero.upload(std::vector<uint32_t>(size_t(T * zc), kNaNBits));
  DevBuf d_codes(q_plain.size()), d_code_scales(s_ref.size() * 4);
  d_codes.upload(q_plain);
  d_code_scales.upload(s_ref);

  QuantGatherParams p;
  p.hidden = c.pre_quantised ? nullptr : d_hidden.as<uint16_t>();
  if (c.pre_quantised) {  // copied into the layout: the same bytes as quantised here
    p.codes = d_codes.as<uint8_t>();
    p.code_scales = d_code_scales.as<float>();
  }
  p.route_row = c.token_order ? nullptr : d_route.as<int32_t>();
  p.tokens = c.T;
  p.hidden_dim = c.H;
  p.topk = c.k;
  p.padded_rows = R_pad;
  p.a_sorted = d_a.as<uint8_t>();
  p.a_scales = d_s.as<float>();
  p.scale_layout = c.scale_layout;
  p.fragment_order = c.fragment_order;
  p.zero_out = c.zero_cols < 0 ? nullptr : d_zero.as<float>();
  p.zero_cols = zc;
  // The words to zero (the GEMM's work queue in the pipeline), poisoned.
  bench::DeviceBuffer d_words(2 * sizeof(int32_t));
  d_words.upload(std::vector<uint32_t>(2, kNaNBits));
  p.zero_words = d_words.as<int32_t>();
  p.zero_word_count = 2;
  Stream stream;
  launch_quant_gather(p, stream.get(), c.pdl);
  stream.sync();

  // Codes, byte for byte; the first mismatch explained.
  const std::vector<uint8_t> got_a = d_a.to_host<uint8_t>();
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got_a.size(); ++i)
    if (got_a[i] != want_a[i] && bad++ == 0) first = int64_t(i);
  if (bad) {
    const int64_t row = first / H, col = first % H;
    const int32_t route = c.token_order ? (row < T ? int32_t(row * k) : -1)
                                        : row < int64_t(d.row_route.size()) ? d.row_route[size_t(row)] : -1;
    std::ostringstream s;
    s << bad << " code bytes differ; first at sorted row " << row << " col " << col << ": got 0x" << std::hex
      << int(got_a[size_t(first)]) << " want 0x" << int(want_a[size_t(first)]) << std::dec;
    if (route >= 0) {
      const int64_t t = route / k;
      s << " (token " << t << ", input bf16 0x" << std::hex << hidden[size_t(t * H + col)].bits << std::dec
        << ", scale " << s_ref[size_t(t * G + col / kQuantBlock)] << ")";
    } else {
      s << " (row targeted by no route: must keep its poison)";
    }
    ADD_FAILURE() << s.str();
  }

  // Scales, bit for bit (NaN poison included).
  const std::vector<uint32_t> got_s = d_s.to_host<uint32_t>();
  bad = 0;
  first = -1;
  for (size_t i = 0; i < got_s.size(); ++i)
    if (got_s[i] != want_s[i] && bad++ == 0) first = int64_t(i);
  if (bad) {
    float gf, wf;
    std::memcpy(&gf, &got_s[size_t(first)], 4);
    std::memcpy(&wf, &want_s[size_t(first)], 4);
    const bool quads = c.scale_layout == ScaleLayout::row_quads;
    const int64_t group = quads ? first / (4 * R_pad) * 4 + first % 4 : first / R_pad,
                  row = quads ? first / 4 % R_pad : first % R_pad;
    ADD_FAILURE() << bad << " scales differ; first at group " << group << " row " << row << ": got " << gf << " (0x"
                  << std::hex << got_s[size_t(first)] << ") want " << wf << " (0x" << want_s[size_t(first)] << ")";
  }

  EXPECT_EQ(d_words.to_host<int32_t>(), std::vector<int32_t>(2, 0)) << "zero_words not cleared";
  // zero_out: every word +0.
  if (p.zero_out) {
    const std::vector<uint32_t> got_z = d_zero.to_host<uint32_t>();
    int64_t nonzero = 0;
    for (uint32_t w : got_z) nonzero += w != 0u;
    EXPECT_EQ(nonzero, 0) << "zero_out words not cleared to +0 (of " << got_z.size() << ")";
  }
}

TEST(QuantGatherGpu, MatchesReferenceBitForBit) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  const int Hs[] = {16, 80, 192, 320, 2048, 7168, 8192};
  const int Ts[] = {1, 3, 17, 128, 1000};
  const int ks[] = {8, 1, 3, 10, 20, 2, 16, 9};
  const int64_t zero_cols[] = {2048, -1, 18, 80, 7168, 4, 1};
  const Distribution dists[] = {Distribution{DistKind::random, 0, {}}, Distribution{DistKind::balanced, 0, {}},
                                Distribution{DistKind::zipf, 1.2, {}}};
  int n = 0;
  for (int H : Hs)
    for (int T : Ts) {
      Case c;
      c.T = T;
      c.H = H;
      c.k = ks[n % 8];
      if (int64_t(T) * H >= 1000 * 2048 && c.k > 8) c.k = 8;  // keeps the largest cases' buffers modest
      c.E = std::max(32, 2 * c.k);
      c.zero_cols = zero_cols[n % 7];
      c.dist = dists[n % 3];
      c.pdl = n % 2 == 0;
      c.token_order = n % 3 == 1;
      if (n % 4 >= 2) c.scale_layout = ScaleLayout::row_quads;
      // Token order with whole 128-groups: half in the A-fragment code order.
      if (c.token_order && H % 128 == 0 && n % 2 == 0) c.fragment_order = true;
      run_case(c, seed + uint64_t(n));
      if (HasFatalFailure()) return;
      // The same case from pre-quantised rows (expert parallelism's FP8 rows on the wire).
      c.pre_quantised = true;
      run_case(c, seed + uint64_t(n));
      ++n;
      if (HasFatalFailure()) return;
    }
}

// The serving shape: T=128, H=2048 (7168 too), k=8, E=256, launched with PDL back to back. Prints
// the mean time per launch; no threshold (timing belongs to the benchmark), but the result after
// many launches must still be exact.
TEST(QuantGatherGpu, TimingAtDecodeShape) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  for (int H : {2048, 7168}) {
    Case c{128, H, 8, 256, 2048, Distribution{DistKind::random, 0, {}}, true};
    run_case(c, seed);
    const int64_t T = c.T, k = c.k, G = quant_blocks(H), R_pad = padded_rows(T * k);
    DevBuf d_hidden(size_t(T * H) * 2), d_route(size_t(T * k) * 4), d_a(size_t(R_pad * H)), d_s(size_t(G * R_pad) * 4),
        d_zero(size_t(T * c.zero_cols) * 4);
    std::vector<int32_t> rr(size_t(T * k));
    for (size_t i = 0; i < rr.size(); ++i) rr[i] = int32_t(i);
    d_route.upload(rr);
    test::fill(d_hidden.as<void>(), 0x3c, size_t(T * H) * 2);
    QuantGatherParams p;
    p.hidden = d_hidden.as<uint16_t>();
    p.route_row = d_route.as<int32_t>();
    p.tokens = c.T;
    p.hidden_dim = H;
    p.topk = c.k;
    p.padded_rows = R_pad;
    p.a_sorted = d_a.as<uint8_t>();
    p.a_scales = d_s.as<float>();
    p.zero_out = d_zero.as<float>();
    p.zero_cols = c.zero_cols;
    Stream stream;
    const double us = mean_launch_us(stream, [&] { launch_quant_gather(p, stream.get(), true); });
    stream.sync();
    std::cout << "[ quant_gather ] T=128 H=" << H << " k=8 (+ clear 128x2048 fp32): " << us
              << " us per launch (back to back, PDL, warm L2)\n";
  }
}

// Host-side contract of the launcher: T = 0 enqueues nothing (no CUDA call at all, so this runs
// without a GPU), and bad shapes or misaligned pointers throw before any launch.
TEST(QuantGather, LauncherChecksShapes) {
  QuantGatherParams p;
  EXPECT_NO_THROW(launch_quant_gather(p, nullptr, true));  // T = 0, every pointer null
  auto fake = [](uintptr_t a) { return reinterpret_cast<void*>(a); };
  p.tokens = 4;
  p.hidden_dim = 256;
  p.topk = 2;
  p.padded_rows = 8;
  p.hidden = static_cast<const uint16_t*>(fake(0x10000));
  p.route_row = static_cast<const int32_t*>(fake(0x20000));
  p.a_sorted = static_cast<uint8_t*>(fake(0x30000));
  p.a_scales = static_cast<float*>(fake(0x40000));
  auto bad = [&](auto change) {
    QuantGatherParams q = p;
    change(q);
    EXPECT_THROW(launch_quant_gather(q, nullptr, false), Error);
  };
  bad([](QuantGatherParams& q) { q.tokens = -1; });
  bad([](QuantGatherParams& q) { q.hidden_dim = 24; });
  bad([](QuantGatherParams& q) { q.hidden_dim = 0; });
  bad([](QuantGatherParams& q) { q.topk = 0; });
  bad([](QuantGatherParams& q) { q.padded_rows = 6; });
  bad([](QuantGatherParams& q) { q.padded_rows = 0; });
  bad([](QuantGatherParams& q) {  // token order needs a row per token: 9 tokens, 8 rows
    q.route_row = nullptr;
    q.tokens = 9;
  });
  bad([](QuantGatherParams& q) { q.fragment_order = true; });  // fragment order is a token-order layout
  bad([](QuantGatherParams& q) {  // ... of whole 128-groups
    q.route_row = nullptr;
    q.hidden_dim = 192;
    q.fragment_order = true;
  });
  bad([&](QuantGatherParams& q) { q.hidden = static_cast<const uint16_t*>(fake(0x10008)); });
  bad([&](QuantGatherParams& q) { q.a_sorted = static_cast<uint8_t*>(fake(0x30004)); });
  bad([&](QuantGatherParams& q) {
    q.zero_out = static_cast<float*>(fake(0x50004));
    q.zero_cols = 16;
  });
}

}  // namespace
}  // namespace loom
