// The measurement harness on the GPU: the streaming read touches every byte exactly once, the
// cuBLASLt speed-of-light GEMM computes the right product, and the timer measures known durations.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include "bench/device_buffer.hpp"
#include "bench/sol_gemm.hpp"
#include "bench/spin_wait.cuh"
#include "bench/stream_read_sm90.cuh"
#include "bench/timer.hpp"
#include "common/device_info.hpp"
#include "common/rng.hpp"
#include "gpu_test.hpp"
#include "test_seed.hpp"

namespace loom::bench {
namespace {

TEST(StreamReadGpu, ReadsEveryByteOfEverySelectedSegmentOnce) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  const DeviceInfo dev = *query_device();
  Rng rng(seed);
  // Two groups of segments with different sizes and strides, like w13 and w2 of hit experts.
  const int64_t experts = 9, bytes0 = 4096 * 3, bytes1 = 16 * 77, stride0 = bytes0 + 256, stride1 = bytes1;
  std::vector<uint32_t> m0(size_t(experts * stride0 / 4)), m1(size_t(experts * stride1 / 4));
  for (auto& w : m0) w = uint32_t(rng.next());
  for (auto& w : m1) w = uint32_t(rng.next());
  const std::vector<int32_t> hit = {0, 2, 3, 7, 8};
  uint32_t expect = 0;
  for (int32_t e : hit) {
    for (int64_t i = 0; i < bytes0 / 4; ++i) expect ^= m0[size_t(e * stride0 / 4 + i)];
    for (int64_t i = 0; i < bytes1 / 4; ++i) expect ^= m1[size_t(e * stride1 / 4 + i)];
  }
  DeviceBuffer d0 = DeviceBuffer::from(m0), d1 = DeviceBuffer::from(m1), ids = DeviceBuffer::from(hit);
  for (ReadConfig cfg : {ReadConfig{1, 128, 1}, ReadConfig{2, 512, 4}, ReadConfig{8, 512, 8}, ReadConfig{1, 0, 0, 4},
                         ReadConfig{2, 0, 0, 6}, ReadConfig{1, 0, 0, 12}, ReadConfig{1, 0, 0, 8, 0},
                         ReadConfig{2, 0, 0, 4, 0}, ReadConfig{1, 0, 0, 6, 16}, ReadConfig{2, 0, 0, 8, 3}}) {
    DeviceBuffer sink = DeviceBuffer::from(std::vector<uint32_t>{0});
    ReadArgs a;
    a.group[0] = {d0.get(), stride0, bytes0};
    a.group[1] = {d1.get(), stride1, bytes1};
    a.groups = 2;
    a.seg_ids = ids.as<int32_t>();
    a.segments = int64_t(hit.size());
    a.sink = sink.as<uint32_t>();
    a.checksum = true;
    launch_stream_read(a, cfg, dev.sm_count, nullptr);
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(sink.to_host<uint32_t>()[0], expect) << cfg.str();
  }
}

TEST(SolGemmGpu, MatchesCpuProductFp8AndBf16) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  const DeviceInfo dev = *query_device();
  GpuTimer timer(dev);
  for (DType dt : {DType::fp8, DType::bf16}) {
    SCOPED_TRACE(to_string(dt));
    const GemmShape g{40, 64, 256};  // m = 40 is padded to 48 for cuBLASLt
    DenseGemm gemm(dt, {g}, 1, seed);
    gemm.autotune(timer, 3);
    gemm.enqueue(timer.stream(), 0);
    LOOM_CUDA_CHECK(cudaStreamSynchronize(timer.stream()));
    const int64_t m = gemm.padded_m(0);
    ASSERT_EQ(m, 48);
    const size_t elem = dt == DType::fp8 ? 1 : 2;
    std::vector<uint8_t> a(size_t(m * g.k) * elem), b(size_t(g.n * g.k) * elem);
    std::vector<uint16_t> d(size_t(m * g.n));
    LOOM_CUDA_CHECK(cudaMemcpy(a.data(), gemm.a(0), a.size(), cudaMemcpyDeviceToHost));
    LOOM_CUDA_CHECK(cudaMemcpy(b.data(), gemm.b(0), b.size(), cudaMemcpyDeviceToHost));
    LOOM_CUDA_CHECK(cudaMemcpy(d.data(), gemm.d(0), d.size() * 2, cudaMemcpyDeviceToHost));
    auto value = [&](const std::vector<uint8_t>& v, int64_t i) -> double {
      if (dt == DType::fp8) {
        __half_raw h = __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(v[size_t(i)]), __NV_E4M3);
        return double(__half2float(__half(h)));
      }
      uint16_t bits;
      std::memcpy(&bits, &v[size_t(i) * 2], 2);
      __nv_bfloat16_raw r;
      r.x = bits;
      return double(__bfloat162float(__nv_bfloat16(r)));
    };
    double worst = 0, norm = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < g.n; ++j) {
        double ref = 0;
        for (int64_t k = 0; k < g.k; ++k) ref += value(a, i * g.k + k) * value(b, j * g.k + k);
        __nv_bfloat16_raw r;
        r.x = d[size_t(i * g.n + j)];
        const double got = double(__bfloat162float(__nv_bfloat16(r)));
        worst = std::max(worst, std::abs(got - ref));
        norm = std::max(norm, std::abs(ref));
      }
    EXPECT_GT(norm, 1.0);                // random operands, not zeros
    EXPECT_LE(worst, 1e-2 * norm) << "bf16 output rounding bounds the error";
  }
}

TEST(TimerGpu, MeasuresAKnownDurationInEveryL2Mode) {
  LOOM_REQUIRE_GPU();
  const DeviceInfo dev = *query_device();
  GpuTimer timer(dev);
  for (L2Mode mode : {L2Mode::warm, L2Mode::flush, L2Mode::rotate}) {
    std::vector<int> seen(3, 0);
    const Stats s = timer.time(
        [&](cudaStream_t st, int c) {
          ++seen[size_t(c)];
          launch_spin_wait(100'000, st);  // 100 us
        },
        3, mode, TimerOptions{50, 2});
    EXPECT_EQ(seen, std::vector<int>({1, 1, 1})) << "one capture per copy";
    EXPECT_EQ(s.reps, 50);
    EXPECT_GE(s.median_us, 100.0);
    if (test::sanitizer().empty()) {  // instrumented, the flush and the launches take far longer
      EXPECT_LT(s.median_us, 130.0) << "graph replay adds only launch overhead";
    }
    EXPECT_LE(s.p10_us, s.median_us);
    EXPECT_LE(s.median_us, s.p90_us);
  }
}

}  // namespace
}  // namespace loom::bench
