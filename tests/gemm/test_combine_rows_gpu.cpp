// The deterministic combine: out[t] = sum over slots j in order of y[route_row[t*k + j]], fp32.
// Checked three ways: bitwise against an fp32 host sum taken in the same slot order (one add at a
// time, starting from +0), within 1e-6 per row of a double-precision sum, and bitwise identical
// between two runs. The test also proves it would notice a wrong order: the reversed fp32 sum
// differs somewhere.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "common/bf16.hpp"
#include "common/cuda_check.hpp"
#include "common/rng.hpp"
#include "dispatch/dispatch_ref.hpp"
#include "gemm/combine_rows_sm90.cuh"
#include "bench/device_buffer.hpp"
#include "gpu_test.hpp"
#include "loom/types.hpp"
#include "test_seed.hpp"
#include "workload/workload.hpp"

namespace loom {
namespace {

constexpr uint32_t kNaNBits = 0x7fc00000u;

using DevBuf = bench::DeviceBuffer;
using test::Stream;

using test::bits;

struct Case {
  int T, N, k, E;
  Distribution dist;
};

std::string describe(const Case& c) {
  std::ostringstream s;
  s << "T=" << c.T << " N=" << c.N << " k=" << c.k << " E=" << c.E << " dist=" << to_string(c.dist);
  return s.str();
}

// Routes with some dropped (out-of-range ids on random routes, every route of one token when T >= 3).
Dispatch make_dispatch(const Case& c, uint64_t seed) {
  Shape shape;
  shape.tokens = c.T;
  shape.hidden = 16;
  shape.inter = c.N;
  shape.experts = c.E;
  shape.topk = c.k;
  const Routes routes = make_routes(shape, Routing{}, c.dist, seed);
  std::vector<int32_t> ids = routes.topk.ids;
  Rng rng(seed, 77);
  for (auto& id : ids)
    if (rng.below(8) == 0) id = rng.below(2) ? -1 : c.E;
  if (c.T >= 3)
    for (int j = 0; j < c.k; ++j) ids[size_t((c.T / 2) * c.k + j)] = -1;
  return dispatch_ref(ids.data(), c.T, c.k, c.E);
}

// y [R, N]: every row its own magnitude, log-uniform over 2^-12 .. 2^12, uniform values of both
// signs, a few exact zeros of either sign, so fp32 sums round differently in a different order.
std::vector<float> make_y(int64_t rows, int64_t cols, uint64_t seed) {
  std::vector<float> y(size_t(rows * cols));
  Rng rng(seed, 5);
  for (int64_t r = 0; r < rows; ++r) {
    const float mag = std::ldexp(1.0f, int(rng.below(25)) - 12);
    for (int64_t c = 0; c < cols; ++c) {
      const uint64_t b = rng.next();
      float v = mag * (float(int32_t(b & 0xffffffu) - 0x800000) * 0x1.0p-23f);
      if ((b >> 32) % 97 == 0) v = (b >> 40) & 1 ? -0.0f : 0.0f;
      y[size_t(r * cols + c)] = v;
    }
  }
  return y;
}

struct Totals {
  int64_t reversed_differs = 0;  // elements where the reversed fp32 order gives other bits
};

void run_case(const Case& c, uint64_t seed, Totals& totals) {
  SCOPED_TRACE(describe(c));
  const int64_t T = c.T, N = c.N, k = c.k;
  const Dispatch d = make_dispatch(c, seed);
  const int64_t R = d.offsets[size_t(c.E)];
  const std::vector<float> y = make_y(std::max<int64_t>(R, 1), N, seed);

  DevBuf d_y(y.size() * 4), d_route(d.route_row.size() * 4), d_out(size_t(T * N) * 4);
  d_y.upload(y);
  d_route.upload(d.route_row);
  const std::vector<uint32_t> poison(size_t(T * N), kNaNBits);

  CombineRowsParams p;
  p.y = d_y.as<float>();
  p.route_row = d_route.as<int32_t>();
  p.tokens = c.T;
  p.topk = c.k;
  p.cols = c.N;
  p.out = d_out.as<float>();
  Stream stream;
  std::vector<uint32_t> runs[2];
  for (int run = 0; run < 2; ++run) {
    d_out.upload(poison);
    launch_combine_rows(p, stream.get(), run == 0);
    stream.sync();
    runs[run] = d_out.to_host<uint32_t>();
  }
  EXPECT_TRUE(runs[0] == runs[1]) << "two runs differ bitwise";

  const std::vector<uint32_t>& got_bits = runs[0];
  int64_t bitwise_bad = 0, first_bad = -1;
  double worst_rel = 0;
  int64_t worst_row = -1;
  std::vector<float> f32(static_cast<size_t>(N)), rev(static_cast<size_t>(N));
  std::vector<double> f64(static_cast<size_t>(N));
  for (int64_t t = 0; t < T; ++t) {
    std::fill(f32.begin(), f32.end(), 0.0f);
    std::fill(rev.begin(), rev.end(), 0.0f);
    std::fill(f64.begin(), f64.end(), 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t row = d.route_row[size_t(t * k + j)];
      if (row < 0) continue;
      const float* yr = y.data() + int64_t(row) * N;
      for (int64_t n = 0; n < N; ++n) {
        f32[size_t(n)] = f32[size_t(n)] + yr[n];  // slot order, one fp32 add at a time
        f64[size_t(n)] += double(yr[n]);
      }
    }
    for (int64_t j = k - 1; j >= 0; --j) {
      const int32_t row = d.route_row[size_t(t * k + j)];
      if (row < 0) continue;
      const float* yr = y.data() + int64_t(row) * N;
      for (int64_t n = 0; n < N; ++n) rev[size_t(n)] = rev[size_t(n)] + yr[n];
    }
    double err2 = 0, ref2 = 0;
    for (int64_t n = 0; n < N; ++n) {
      const uint32_t g = got_bits[size_t(t * N + n)];
      if (g != bits(f32[size_t(n)]) && bitwise_bad++ == 0) first_bad = t * N + n;
      totals.reversed_differs += bits(rev[size_t(n)]) != bits(f32[size_t(n)]);
      float gf;
      std::memcpy(&gf, &g, 4);
      const double e = double(gf) - f64[size_t(n)];
      err2 += e * e;  // NaN poison left behind makes this NaN, caught below
      ref2 += f64[size_t(n)] * f64[size_t(n)];
    }
    const double rel = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
    if (!(rel <= worst_rel)) {
      worst_rel = std::isnan(rel) ? INFINITY : rel;
      worst_row = t;
    }
  }
  if (bitwise_bad) {
    const int64_t t = first_bad / N, n = first_bad % N;
    float gf;
    std::memcpy(&gf, &got_bits[size_t(first_bad)], 4);
    std::ostringstream s;
    s << bitwise_bad << " elements differ from the fp32 slot-order sum; first at token " << t << " col " << n
      << ": got " << gf << " (0x" << std::hex << got_bits[size_t(first_bad)] << std::dec << "), routes:";
    for (int64_t j = 0; j < k; ++j) {
      const int32_t row = d.route_row[size_t(t * k + j)];
      s << " " << row;
      if (row >= 0) s << "(" << y[size_t(int64_t(row) * N + n)] << ")";
    }
    ADD_FAILURE() << s.str();
  }
  EXPECT_LE(worst_rel, 1e-6) << "worst row " << worst_row << " against the double sum";

  // The bf16 output (the ffn layer's): the same fp32 sum, rounded to nearest even, bit for bit.
  DevBuf d_out16(size_t(T * N) * 2);
  d_out16.upload(std::vector<uint16_t>(size_t(T * N), 0x7fc1));  // NaN poison
  CombineRowsParams pb = p;
  pb.out = nullptr;
  pb.out_bf16 = d_out16.as<uint16_t>();
  launch_combine_rows(pb, stream.get(), true);
  stream.sync();
  const std::vector<uint16_t> b16 = d_out16.to_host<uint16_t>();
  int64_t bf16_bad = 0;
  for (int64_t i = 0; i < T * N; ++i) {
    float f;
    std::memcpy(&f, &got_bits[size_t(i)], 4);
    bf16_bad += b16[size_t(i)] != float_to_bf16(f).bits;
  }
  EXPECT_EQ(bf16_bad, 0) << "bf16 outputs other than the nearest-even rounding of the fp32 sum";

  // bf16 rows in (the ffn layer's deterministic GEMM 2 rounds its weighted rows): each widened
  // exactly, the same slot-order fp32 sum, the bf16 output bit for bit.
  std::vector<uint16_t> y16(y.size());
  for (size_t i = 0; i < y.size(); ++i) y16[i] = float_to_bf16(y[i]).bits;
  DevBuf d_y16(y16.size() * 2);
  d_y16.upload(y16);
  CombineRowsParams pr = pb;
  pr.y = nullptr;
  pr.y_bf16 = d_y16.as<uint16_t>();
  d_out16.upload(std::vector<uint16_t>(size_t(T * N), 0x7fc1));
  launch_combine_rows(pr, stream.get(), true);
  stream.sync();
  const std::vector<uint16_t> r16 = d_out16.to_host<uint16_t>();
  int64_t rows16_bad = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        const int32_t row = d.route_row[size_t(t * k + j)];
        if (row >= 0) acc = acc + bf16_to_float(bf16{y16[size_t(int64_t(row) * N + n)]});
      }
      rows16_bad += r16[size_t(t * N + n)] != float_to_bf16(acc).bits;
    }
  EXPECT_EQ(rows16_bad, 0) << "bf16 outputs from bf16 rows other than the rounded slot-order fp32 sum";
}

TEST(CombineRowsGpu, SlotOrderFp32SumBitwiseAndDeterministic) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  const int Ts[] = {1, 3, 17, 128, 1000};
  const int Ns[] = {16, 80, 2048, 7168};
  const int ks[] = {8, 1, 2, 3, 10, 20, 16, 5, 4};
  const Distribution dists[] = {Distribution{DistKind::random, 0, {}}, Distribution{DistKind::balanced, 0, {}},
                                Distribution{DistKind::zipf, 1.2, {}}};
  Totals totals;
  int n = 0;
  for (int N : Ns)
    for (int T : Ts) {
      Case c;
      c.T = T;
      c.N = N;
      c.k = ks[n % 9];
      if (int64_t(T) * N >= 1000 * 2048 && c.k > 8) c.k = 8;  // keeps y of the largest cases modest
      c.E = std::max(32, 2 * c.k);
      c.dist = dists[n % 3];
      run_case(c, seed + uint64_t(n), totals);
      ++n;
      if (HasFatalFailure()) return;
    }
  // Sensitivity: had the kernel summed in another order, the bitwise check would have seen it.
  EXPECT_GT(totals.reversed_differs, 0);
}

// The decode shape: T=128, k=8, N=2048 (single) and 7168 (ffn hidden), back to back with PDL.
// Prints the mean time per launch; no threshold (timing belongs to the benchmark).
TEST(CombineRowsGpu, TimingAtDecodeShape) {
  LOOM_REQUIRE_GPU();
  for (int N : {2048, 7168}) {
    const int T = 128, k = 8;
    DevBuf d_y(size_t(T * k) * N * 4), d_route(size_t(T * k) * 4), d_out(size_t(T) * N * 4);
    std::vector<int32_t> rr(size_t(T * k));
    for (size_t i = 0; i < rr.size(); ++i) rr[i] = int32_t((i * 37) % rr.size());  // scattered rows
    d_route.upload(rr);
    test::fill(d_y.as<void>(), 0, size_t(T * k) * N * 4);
    CombineRowsParams p;
    p.y = d_y.as<float>();
    p.route_row = d_route.as<int32_t>();
    p.tokens = T;
    p.topk = k;
    p.cols = N;
    p.out = d_out.as<float>();
    Stream stream;
    const double us = mean_launch_us(stream, [&] { launch_combine_rows(p, stream.get(), true); });
    stream.sync();
    std::cout << "[ combine_rows ] T=128 k=8 N=" << N << ": " << us << " us per launch (back to back, PDL, warm L2)\n";
  }
}

// Host-side contract of the launcher (no GPU needed): T = 0 enqueues nothing; bad shapes and
// misaligned pointers throw before any launch.
TEST(CombineRows, LauncherChecksShapes) {
  CombineRowsParams p;
  EXPECT_NO_THROW(launch_combine_rows(p, nullptr, true));
  auto fake = [](uintptr_t a) { return reinterpret_cast<void*>(a); };
  p.tokens = 4;
  p.topk = 2;
  p.cols = 64;
  p.y = static_cast<const float*>(fake(0x10000));
  p.route_row = static_cast<const int32_t*>(fake(0x20000));
  p.out = static_cast<float*>(fake(0x30000));
  auto bad = [&](auto change) {
    CombineRowsParams q = p;
    change(q);
    EXPECT_THROW(launch_combine_rows(q, nullptr, false), Error);
  };
  bad([](CombineRowsParams& q) { q.tokens = -1; });
  bad([](CombineRowsParams& q) { q.topk = 0; });
  bad([](CombineRowsParams& q) { q.cols = 0; });
  bad([](CombineRowsParams& q) { q.cols = 18; });
  bad([](CombineRowsParams& q) { q.route_row = nullptr; });
  auto bf16_rows = [&](CombineRowsParams& q, uintptr_t at) {
    q.y = nullptr;
    q.y_bf16 = static_cast<const uint16_t*>(fake(at));
  };
  bad([&](CombineRowsParams& q) { bf16_rows(q, 0x10008); });  // bf16 rows are read 16 bytes at a time
  bad([&](CombineRowsParams& q) {
    bf16_rows(q, 0x10000);
    q.cols = 20;  // a multiple of 4, not of 8
  });
  bad([&](CombineRowsParams& q) { q.y = static_cast<const float*>(fake(0x10004)); });
  bad([&](CombineRowsParams& q) { q.out = static_cast<float*>(fake(0x30008)); });
  bad([&](CombineRowsParams& q) { q.out_bf16 = static_cast<uint16_t*>(fake(0x40000)); });  // both outputs
  bad([&](CombineRowsParams& q) {
    q.out = nullptr;
    q.out_bf16 = static_cast<uint16_t*>(fake(0x40004));  // misaligned
  });
  bad([&](CombineRowsParams& q) { q.out = nullptr; });  // neither
}

}  // namespace
}  // namespace loom
