// The BF16 layer's gather: every routed sorted row holds its token's hidden row bit for bit, every
// other row keeps its poison (nothing written out of place), dropped routes copy nothing.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "bench/device_buffer.hpp"
#include "common/bf16.hpp"
#include "common/rng.hpp"
#include "contract/device_layout.hpp"
#include "dispatch/dispatch_ref.hpp"
#include "dispatch/gather_rows_sm90.cuh"
#include "gpu_test.hpp"
#include "loom/types.hpp"
#include "test_seed.hpp"
#include "workload/workload.hpp"

namespace loom {
namespace {

constexpr uint16_t kPoison = 0x7fc1;

void run_case(int64_t T, int64_t H, int64_t E, int64_t k, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "T=" << T << " H=" << H << " E=" << E << " k=" << k);
  const Shape s{T, H, 16, E, k, Mode::ffn, DType::bf16};
  const std::vector<bf16> hidden = make_hidden(s, seed);
  // Distinct ids per token, about one route in 16 out of range (dropped).
  Rng rng(seed, 7);
  std::vector<int32_t> ids(size_t(T * k));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      int32_t id;
      bool fresh;
      do {
        id = rng.below(16) == 0 ? int32_t(E + rng.below(3)) : int32_t(rng.below(uint64_t(E)));
        fresh = true;
        for (int64_t i = 0; i < j; ++i) fresh = fresh && ids[size_t(t * k + i)] != id;
      } while (!fresh);
      ids[size_t(t * k + j)] = id;
    }
  const Dispatch d = dispatch_ref(ids.data(), T, k, E);
  const int64_t Rp = padded_rows(T * k);
  bench::DeviceBuffer dh = bench::DeviceBuffer::from(hidden), drr = bench::DeviceBuffer::from(d.route_row);
  bench::DeviceBuffer drows(size_t(Rp * H) * 2);
  std::vector<uint16_t> poison(size_t(Rp * H), kPoison);
  drows.upload(poison);
  GatherRowsParams p;
  p.hidden = dh.as<uint16_t>();
  p.route_row = drr.as<int32_t>();
  p.rows = drows.as<uint16_t>();
  p.tokens = int(T);
  p.topk = int(k);
  p.hidden_dim = int(H);
  launch_gather_rows(p, nullptr, false);
  LOOM_CUDA_CHECK(cudaGetLastError());
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = drows.to_host<uint16_t>();
  std::vector<uint16_t> want = poison;
  for (int64_t route = 0; route < T * k; ++route) {
    const int32_t row = d.route_row[size_t(route)];
    if (row < 0) continue;
    for (int64_t c = 0; c < H; ++c) want[size_t(row * H + c)] = hidden[size_t(route / k * H + c)].bits;
  }
  int64_t wrong = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && wrong++ == 0) first = int64_t(i);
  EXPECT_EQ(wrong, 0) << "first wrong element " << first << " (row " << (first >= 0 ? first / H : -1) << ")";
}

TEST(GatherRowsGpu, RoutedRowsBitForBitNothingElse) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  run_case(1, 16, 4, 1, seed);
  run_case(5, 1024, 16, 2, seed + 1);
  run_case(37, 2880, 16, 8, seed + 2);
  run_case(300, 3072, 64, 16, seed + 3);
}

TEST(GatherRowsLaunch, RefusesBadSizes) {
  GatherRowsParams p;
  p.hidden = reinterpret_cast<const uint16_t*>(uintptr_t(256));
  p.route_row = reinterpret_cast<const int32_t*>(uintptr_t(256));
  p.rows = reinterpret_cast<uint16_t*>(uintptr_t(256));
  p.tokens = 4;
  p.topk = 2;
  p.hidden_dim = 100;  // not a multiple of 8
  EXPECT_THROW(launch_gather_rows(p, nullptr, false), Error);
  p.hidden_dim = 128;
  p.topk = 33;
  EXPECT_THROW(launch_gather_rows(p, nullptr, false), Error);
  p.topk = 2;
  p.rows = reinterpret_cast<uint16_t*>(uintptr_t(258));
  EXPECT_THROW(launch_gather_rows(p, nullptr, false), Error);
}

}  // namespace
}  // namespace loom
