// The dispatch kernel against dispatch_ref, exactly: offsets, route_row, row_token, the bits of
// row_weight, the untouched tail of the row arrays and the status word, on fresh random routings
// (workload distributions, out-of-range ids, NaN flags), run twice for determinism.
// DispatchLaunch* tests are host-only (argument checks and launch shapes); DispatchGpu* skip
// without an sm_90 device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "common/cuda_check.hpp"
#include "common/rng.hpp"
#include "dispatch/dispatch_ref.hpp"
#include "dispatch/dispatch_sm90.cuh"
#include "gpu_test.hpp"
#include "loom/types.hpp"
#include "contract/device_layout.hpp"
#include "ptx/pdl.cuh"
#include "test_seed.hpp"
#include "workload/workload.hpp"

namespace loom {
namespace {

constexpr int32_t kPoisonInt = 0x7fffffff;
constexpr uint32_t kPoisonWeight = 0x7fc0dead;  // a quiet NaN with a payload
constexpr uint32_t kPoisonStatus = 0xdeadbeef;

// Owning device array (tests only; the harness's DeviceBuffer lives with the tools).
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    if (n_) LOOM_CUDA_CHECK(cudaMalloc(&ptr_, n_ * sizeof(T)));
  }
  ~DeviceArray() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  void upload(const std::vector<T>& h) {
    ASSERT_EQ(h.size(), n_);
    if (n_) LOOM_CUDA_CHECK(cudaMemcpy(ptr_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    if (n_) LOOM_CUDA_CHECK(cudaMemcpy(h.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  T* get() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

using test::bits;
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Input {
  int64_t tokens = 0, topk = 0, experts = 0;
  std::vector<int32_t> ids;
  std::vector<float> weights;
  std::vector<uint8_t> flags;  // empty: no nan_flags pointer
};

struct Output {
  std::vector<int32_t> offsets, route_row, row_token;
  std::vector<uint32_t> row_weight;  // bits
  uint32_t status[4] = {};
  bool operator==(const Output& o) const {
    return offsets == o.offsets && route_row == o.route_row && row_token == o.row_token &&
           row_weight == o.row_weight && std::equal(std::begin(status), std::end(status), std::begin(o.status));
  }
};

size_t slice_words(const Input& in) {
  return std::max<size_t>(1, dispatch_slice_count_bytes(in.tokens, in.topk, in.experts) / 4);
}

// Device copies of one input and its outputs; run() poisons the outputs, launches, waits.
class Rig {
 public:
  explicit Rig(const Input& in)
      : in_(in),
        routes_(size_t(in.tokens * in.topk)),
        ids_(routes_),
        weights_(routes_),
        flags_(in.flags.size()),
        offsets_(size_t(in.experts + 1)),
        route_row_(routes_),
        row_token_(routes_),
        row_weight_(routes_),
        status_(1),
        slice_counts_(slice_words(in)) {
    ids_.upload(in.ids);
    weights_.upload(in.weights);
    flags_.upload(in.flags);
    LOOM_CUDA_CHECK(cudaStreamCreate(&stream_));  // blocking: ordered after the synchronous uploads
  }
  ~Rig() { cudaStreamDestroy(stream_); }

  DispatchParams params() const {
    DispatchParams p;
    p.topk_ids = ids_.get();
    p.topk_weights = weights_.get();
    p.nan_flags = in_.flags.empty() ? nullptr : flags_.get();
    p.tokens = int(in_.tokens);
    p.topk = int(in_.topk);
    p.experts = int(in_.experts);
    p.offsets = offsets_.get();
    p.route_row = route_row_.get();
    p.row_token = row_token_.get();
    p.row_weight = row_weight_.get();
    p.status = status_.get();
    p.slice_counts = slice_counts_.get();
    return p;
  }
  int32_t* ids() const { return ids_.get(); }
  cudaStream_t stream() const { return stream_; }

  void poison() {
    offsets_.upload(std::vector<int32_t>(size_t(in_.experts + 1), kPoisonInt));
    route_row_.upload(std::vector<int32_t>(routes_, kPoisonInt));
    // Stale counts from an earlier run must not matter: the count kernel rewrites every word.
    slice_counts_.upload(std::vector<int32_t>(slice_words(in_), kPoisonInt));
    row_token_.upload(std::vector<int32_t>(routes_, kPoisonInt));
    row_weight_.upload(std::vector<float>(routes_, from_bits(kPoisonWeight)));
    LayerStatus s;
    s.nan_tokens = s.dropped_routes = s.reserved[0] = s.reserved[1] = kPoisonStatus;
    status_.upload({s});
  }
  Output collect() {
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
    Output o;
    o.offsets = offsets_.download();
    o.route_row = route_row_.download();
    o.row_token = row_token_.download();
    for (float w : row_weight_.download()) o.row_weight.push_back(bits(w));
    const LayerStatus s = status_.download()[0];
    o.status[0] = s.nan_tokens;
    o.status[1] = s.dropped_routes;
    o.status[2] = s.reserved[0];
    o.status[3] = s.reserved[1];
    return o;
  }
  Output run(bool pdl) {
    poison();
    launch_dispatch(params(), stream_, pdl);
    return collect();
  }

 private:
  const Input& in_;
  size_t routes_;
  DeviceArray<int32_t> ids_;
  DeviceArray<float> weights_;
  DeviceArray<uint8_t> flags_;
  DeviceArray<int32_t> offsets_, route_row_, row_token_;
  DeviceArray<float> row_weight_;
  DeviceArray<LayerStatus> status_;
  DeviceArray<int32_t> slice_counts_;
  cudaStream_t stream_ = nullptr;
};

template <class T>
std::string first_difference(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size())
    return "size " + std::to_string(got.size()) + " != " + std::to_string(want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      std::ostringstream o;
      o << "first difference at [" << i << "]: got " << got[i] << ", want " << want[i];
      return o.str();
    }
  }
  return {};
}

// What the kernel must produce, from dispatch_ref (tail rows stay poisoned).
Output expected(const Input& in) {
  const Dispatch d = dispatch_ref(in.ids.data(), in.tokens, in.topk, in.experts);
  const size_t routes = size_t(in.tokens * in.topk);
  Output o;
  o.offsets = d.offsets;
  o.route_row = d.route_row;
  o.row_token.assign(routes, kPoisonInt);
  o.row_weight.assign(routes, kPoisonWeight);
  for (size_t row = 0; row < d.row_route.size(); ++row) {
    const int32_t r = d.row_route[row];
    o.row_token[row] = int32_t(r / in.topk);
    o.row_weight[row] = bits(in.weights[size_t(r)]);
  }
  uint32_t nan = 0;
  for (uint8_t f : in.flags) nan += f != 0;
  o.status[0] = nan;
  o.status[1] = uint32_t(d.dropped);
  o.status[2] = o.status[3] = 0;
  return o;
}

void expect_equal(const Output& got, const Output& want) {
  EXPECT_EQ(first_difference(got.offsets, want.offsets), "") << "offsets";
  EXPECT_EQ(first_difference(got.route_row, want.route_row), "") << "route_row";
  EXPECT_EQ(first_difference(got.row_token, want.row_token), "") << "row_token (tail must stay poisoned)";
  EXPECT_EQ(first_difference(got.row_weight, want.row_weight), "") << "row_weight bits (tail must stay poisoned)";
  EXPECT_EQ(got.status[0], want.status[0]) << "status.nan_tokens";
  EXPECT_EQ(got.status[1], want.status[1]) << "status.dropped_routes";
  EXPECT_EQ(got.status[2], 0u) << "status.reserved[0]";
  EXPECT_EQ(got.status[3], 0u) << "status.reserved[1]";
}

// Runs the kernel twice (with and without PDL, outputs re-poisoned in between) and compares both
// runs with the reference and with each other.
void check(const Input& in) {
  SCOPED_TRACE(testing::Message() << "T=" << in.tokens << " k=" << in.topk << " E=" << in.experts
                                  << (in.flags.empty() ? " no flags" : " flags"));
  const Output want = expected(in);
  Rig rig(in);
  const Output first = rig.run(false);
  expect_equal(first, want);
  const Output second = rig.run(true);
  EXPECT_TRUE(second == first) << "second run differs from the first";
}

// Replaces about one id in `every` with an out-of-range one (negative, E, beyond, int extremes).
void sprinkle_bad_ids(Input& in, Rng& rng, uint64_t every) {
  for (int32_t& id : in.ids) {
    if (rng.below(every) != 0) continue;
    const int32_t bad[] = {-1,
                           int32_t(in.experts),
                           int32_t(in.experts + 1 + int64_t(rng.below(1000))),
                           -int32_t(1 + rng.below(100000)),
                           std::numeric_limits<int32_t>::min(),
                           std::numeric_limits<int32_t>::max()};
    id = bad[rng.below(std::size(bad))];
  }
}

void random_flags(Input& in, Rng& rng) {
  in.flags.resize(size_t(in.tokens));
  // Mostly zero, some ones, the odd other nonzero byte (counted as one token).
  for (uint8_t& f : in.flags) {
    const uint64_t x = rng.below(16);
    f = x < 12 ? 0 : x < 15 ? 1 : uint8_t(2 + rng.below(254));
  }
}

Input from_workload(int64_t tokens, int64_t experts, int64_t topk, const std::string& dist, uint64_t seed) {
  Shape shape;
  shape.tokens = tokens;
  shape.hidden = 128;
  shape.inter = 128;
  shape.experts = experts;
  shape.topk = topk;
  const Routes routes = make_routes(shape, Routing{}, parse_distribution(dist), seed);
  Input in;
  in.tokens = tokens;
  in.topk = topk;
  in.experts = experts;
  in.ids = routes.topk.ids;
  in.weights = routes.topk.weights;
  return in;
}

// Uniform ids in [0, E) with repeats allowed inside a token (the reference orders them by slot).
Input uniform_ids(int64_t tokens, int64_t experts, int64_t topk, Rng& rng) {
  Input in;
  in.tokens = tokens;
  in.topk = topk;
  in.experts = experts;
  in.ids.resize(size_t(tokens * topk));
  in.weights.resize(in.ids.size());
  for (int32_t& id : in.ids) id = int32_t(rng.below(uint64_t(experts)));
  for (float& w : in.weights) w = float(rng.uniform(-2.0, 2.0));
  return in;
}

// Every value of T, E and k of the GPU plan appears, and every distribution; each case runs
// clean (no flags) and dirty (out-of-range ids, NaN flags).
TEST(DispatchGpu, MatchesReferenceOnWorkloads) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  struct Case {
    int64_t tokens, experts, topk;
    const char* dist;
  };
  const Case cases[] = {
      {1, 8, 1, "random"},           {3, 64, 2, "balanced"},        {17, 256, 8, "zipf:1.2"},
      {128, 256, 8, "random"},       {128, 512, 16, "hot:0.9"},     {1000, 64, 8, "concentrated"},
      {1000, 8, 2, "hot:0.9"},       {17, 512, 1, "balanced"},      {3, 8, 8, "concentrated"},
      {1000, 256, 16, "random"},     {128, 64, 1, "zipf:1.2"},      {8192, 8, 1, "balanced"},
      {8192, 256, 8, "random"},      {8192, 512, 16, "zipf:1.2"},   {8192, 64, 2, "concentrated"},
  };
  Rng rng(seed, 1);
  uint64_t n = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.dist);
    Input in = from_workload(c.tokens, c.experts, c.topk, c.dist, seed + ++n);
    check(in);
    sprinkle_bad_ids(in, rng, 1 + rng.below(30));
    random_flags(in, rng);
    check(in);
    if (HasFailure()) return;
  }
}

// Out-of-range ids of every kind, up to all of them: dropped (-1), counted, no rows.
TEST(DispatchGpu, DropsOutOfRangeIds) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  Rng rng(seed);
  for (int64_t tokens : {1, 17, 1000, 5000}) {
    for (uint64_t every : {1, 2, 7}) {  // 1: every id is out of range
      Input in = uniform_ids(tokens, 64, 8, rng);
      sprinkle_bad_ids(in, rng, every);
      if (every == 1) {
        for (size_t i = 0; i < in.ids.size(); ++i) in.ids[i] = (i % 2) ? -1 - int32_t(i % 5) : 64 + int32_t(i % 7);
        in.ids[0] = std::numeric_limits<int32_t>::min();
        in.ids.back() = std::numeric_limits<int32_t>::max();
      }
      check(in);
      if (HasFailure()) return;
    }
  }
}

// Experts with no rows (few tokens over many experts), every token on the same k experts (one
// long segment per expert, spanning all warps and CTAs), and repeated experts inside a token.
TEST(DispatchGpu, EmptyExpertsAndSharedExperts) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  Rng rng(seed);
  // Few tokens, many experts: most segments are empty.
  check(uniform_ids(1, 512, 8, rng));
  check(uniform_ids(3, 512, 16, rng));
  for (int64_t tokens : {1, 17, 128, 1000, 8192}) {
    for (int64_t topk : {1, 8, 16}) {
      // All tokens pick the same k experts, scattered over [0, E), in a fixed slot order.
      const int64_t experts = 512;
      std::vector<int32_t> chosen(static_cast<size_t>(experts));
      std::iota(chosen.begin(), chosen.end(), 0);
      for (size_t i = 0; i < size_t(topk); ++i) std::swap(chosen[i], chosen[i + rng.below(uint64_t(experts) - i)]);
      Input in = uniform_ids(tokens, experts, topk, rng);
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t j = 0; j < topk; ++j) in.ids[size_t(t * topk + j)] = chosen[size_t(j)];
      check(in);
      // The same expert in several slots of each token: ordered by slot within the token.
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t j = 0; j < topk; ++j) in.ids[size_t(t * topk + j)] = chosen[size_t(j / 2)];
      random_flags(in, rng);
      check(in);
      if (HasFailure()) return;
    }
  }
}

// Shapes that exercise the kernel's geometry: every CTA count regime (1 CTA, several, slices of
// 1..4 steps per warp), a partial last warp / CTA, and expert windows (E > 1024: several passes,
// E not a multiple of 32).
TEST(DispatchGpu, LaunchGeometries) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  Rng rng(seed);
  struct Case {
    int64_t tokens, experts, topk;
  };
  const Case cases[] = {
      {1024, 8, 1},  {1025, 8, 1},    {511, 100, 4},   {4097, 33, 16},  {8191, 200, 16}, {20000, 64, 8},
      {5, 1000, 4},  {3000, 1024, 8}, {3000, 1025, 8}, {700, 4096, 16}, {9000, 4096, 8}, {2, 4096, 1},
      {9001, 2047, 3}, {40000, 256, 8}, {70000, 64, 8},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "ctas=" << dispatch_launch_shape(c.tokens, c.topk, c.experts).ctas
                                    << " windows=" << dispatch_launch_shape(c.tokens, c.topk, c.experts).windows);
    Input in = uniform_ids(c.tokens, c.experts, c.topk, rng);
    sprinkle_bad_ids(in, rng, 25);
    random_flags(in, rng);
    check(in);
    if (HasFailure()) return;
  }
}

// Random shapes (odd T*k, E not a multiple of 32, up to 4096 experts), random ids with repeats
// inside a token and out-of-range ids at a random rate.
TEST(DispatchGpu, RandomShapes) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  Rng rng(seed);
  for (int trial = 0; trial < 30; ++trial) {
    const int64_t experts = 1 + int64_t(rng.below(rng.below(4) ? 600 : 4096));
    const int64_t topk = 1 + int64_t(rng.below(16));
    const int64_t tokens = 1 + int64_t(rng.below(rng.below(2) ? 300 : 12000));
    Input in = uniform_ids(tokens, experts, topk, rng);
    sprinkle_bad_ids(in, rng, 1 + rng.below(40));
    if (rng.below(2)) random_flags(in, rng);
    check(in);
    if (HasFailure()) return;
  }
}

// A misaligned ids pointer (not 16-byte aligned): the kernels read the ids one by one, so the
// results must not change.
TEST(DispatchGpu, UnalignedIds) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  Rng rng(seed);
  Input in = uniform_ids(3001, 256, 8, rng);
  sprinkle_bad_ids(in, rng, 40);
  const Output want = expected(in);
  // Copies one element past a 256-byte aligned allocation: 4-byte aligned, not 16.
  std::vector<int32_t> ids_host(1, 7);
  ids_host.insert(ids_host.end(), in.ids.begin(), in.ids.end());
  std::vector<float> weights_host(1, 0.5f);
  weights_host.insert(weights_host.end(), in.weights.begin(), in.weights.end());
  DeviceArray<int32_t> ids(ids_host.size());
  DeviceArray<float> weights(weights_host.size());
  ids.upload(ids_host);
  weights.upload(weights_host);
  Rig rig(in);
  rig.poison();
  DispatchParams p = rig.params();
  p.topk_ids = ids.get() + 1;
  p.topk_weights = weights.get() + 1;
  launch_dispatch(p, rig.stream(), false);
  expect_equal(rig.collect(), want);
}

// Spins ~`ns` nanoseconds after letting its dependents launch, then writes the ids: a dispatch
// launched with PDL behind it starts early and must wait (griddepcontrol.wait) before reading.
__global__ void late_ids_writer(const int32_t* src, int32_t* dst, int n, unsigned long long ns) {
  ptx::pdl_launch_dependents();
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
  for (int i = int(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += int(gridDim.x * blockDim.x)) dst[i] = src[i];
}

TEST(DispatchGpu, PdlWaitsForThePreviousKernel) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  Rng rng(seed);
  for (int64_t tokens : {128, 8192}) {
    Input in = uniform_ids(tokens, 256, 8, rng);
    sprinkle_bad_ids(in, rng, 50);
    const Output want = expected(in);
    Rig rig(in);
    DeviceArray<int32_t> staged(in.ids.size());
    staged.upload(in.ids);
    for (int rep = 0; rep < 3; ++rep) {
      // Stale ids in place (a different valid routing) until the writer lands.
      Input stale = uniform_ids(tokens, 256, 8, rng);
      LOOM_CUDA_CHECK(cudaMemcpy(rig.ids(), stale.ids.data(), stale.ids.size() * 4, cudaMemcpyHostToDevice));
      rig.poison();
      late_ids_writer<<<8, 256, 0, rig.stream()>>>(staged.get(), rig.ids(), int(in.ids.size()), 50000);
      LOOM_CUDA_CHECK_LAUNCH();
      launch_dispatch(rig.params(), rig.stream(), true);
      expect_equal(rig.collect(), want);
      if (HasFailure()) return;
    }
  }
}

// T = 0 launches nothing: the outputs keep their poison.
TEST(DispatchGpu, ZeroTokensWritesNothing) {
  LOOM_REQUIRE_GPU();
  Input in;
  in.tokens = 0;
  in.topk = 8;
  in.experts = 64;
  Rig rig(in);
  rig.poison();
  launch_dispatch(rig.params(), rig.stream(), true);
  const Output o = rig.collect();
  EXPECT_EQ(o.offsets, std::vector<int32_t>(65, kPoisonInt));
  for (uint32_t s : o.status) EXPECT_EQ(s, kPoisonStatus);
}

// Host-only: bad shapes and null pointers throw before any CUDA call (runs without a GPU).
TEST(DispatchLaunch, RejectsInvalidArguments) {
  alignas(16) static int32_t dummy[4];
  DispatchParams p;
  p.topk_ids = dummy;
  p.topk_weights = reinterpret_cast<const float*>(dummy);
  p.offsets = dummy;
  p.route_row = dummy;
  p.row_token = dummy;
  p.row_weight = reinterpret_cast<float*>(dummy);
  p.status = reinterpret_cast<LayerStatus*>(dummy);
  p.tokens = 4;
  p.topk = 2;
  p.experts = 8;
  auto with = [&](auto edit) {
    DispatchParams q = p;
    edit(q);
    return q;
  };
  EXPECT_THROW(launch_dispatch(with([](DispatchParams& q) { q.experts = 0; }), nullptr, false), Error);
  EXPECT_THROW(launch_dispatch(with([](DispatchParams& q) { q.experts = 4097; }), nullptr, false), Error);
  EXPECT_THROW(launch_dispatch(with([](DispatchParams& q) { q.experts = -3; }), nullptr, false), Error);
  EXPECT_THROW(launch_dispatch(with([](DispatchParams& q) { q.topk = 0; }), nullptr, false), Error);
  EXPECT_THROW(launch_dispatch(with([](DispatchParams& q) { q.tokens = -1; }), nullptr, false), Error);
  EXPECT_THROW(launch_dispatch(with([](DispatchParams& q) { q.tokens = 1 << 28, q.topk = 16; }), nullptr, false),
               Error);  // 2^32 routes
  EXPECT_THROW(launch_dispatch(with([](DispatchParams& q) { q.experts = 0, q.tokens = 0; }), nullptr, false), Error);
  EXPECT_THROW(launch_dispatch(with([](DispatchParams& q) { q.topk_ids = nullptr; }), nullptr, false), Error);
  EXPECT_THROW(launch_dispatch(with([](DispatchParams& q) { q.topk_weights = nullptr; }), nullptr, false), Error);
  EXPECT_THROW(launch_dispatch(with([](DispatchParams& q) { q.offsets = nullptr; }), nullptr, false), Error);
  EXPECT_THROW(launch_dispatch(with([](DispatchParams& q) { q.route_row = nullptr; }), nullptr, false), Error);
  EXPECT_THROW(launch_dispatch(with([](DispatchParams& q) { q.row_token = nullptr; }), nullptr, false), Error);
  EXPECT_THROW(launch_dispatch(with([](DispatchParams& q) { q.row_weight = nullptr; }), nullptr, false), Error);
  EXPECT_THROW(launch_dispatch(with([](DispatchParams& q) { q.status = nullptr; }), nullptr, false), Error);
  // Several CTAs need the slice counts.
  EXPECT_THROW(launch_dispatch(with([](DispatchParams& q) { q.tokens = 1000, q.topk = 8; }), nullptr, false), Error);
  // T = 0 with a valid shape: nothing to do, no CUDA call, no pointers needed.
  EXPECT_NO_THROW(launch_dispatch(DispatchParams{nullptr, nullptr, nullptr, 0, 8, 64}, nullptr, false));
}

// Host-only: the launch shape stays within one H100/H200 CTA's shared memory for every legal
// shape, decode is one CTA, and prefill spreads over CTAs.
TEST(DispatchLaunch, ShapeFitsTheDevice) {
  constexpr size_t kOptInSmem = 227 * 1024 - 1024;  // leave room for the kernel's static arrays
  for (int64_t experts : {1, 8, 31, 64, 256, 512, 1000, 1024, 1025, 2048, 4095, 4096}) {
    for (int64_t routes : std::initializer_list<int64_t>{1, 1024, 1025, 32768, 65536, 131072, 1 << 20,
                                                          std::numeric_limits<int32_t>::max()}) {
      SCOPED_TRACE(testing::Message() << "E=" << experts << " R=" << routes);
      const DispatchLaunch l = dispatch_launch_shape(routes, 1, experts);
      EXPECT_EQ(l.threads, 1024);
      EXPECT_LE(l.smem_bytes, kOptInSmem);
      EXPECT_GE(l.steps, 1);
      EXPECT_LE(l.steps, 4);
      EXPECT_EQ(int64_t(l.ctas), (routes + 1024 * l.steps - 1) / (1024 * l.steps));
      EXPECT_GE(int64_t(l.window) * l.windows, experts);
      EXPECT_LE(l.window, 1024);
    }
  }
  EXPECT_EQ(dispatch_launch_shape(128, 8, 256).ctas, 1);
  EXPECT_EQ(dispatch_launch_shape(128, 8, 256).windows, 1);
  EXPECT_EQ(dispatch_launch_shape(8192, 8, 256).ctas, 64);
  EXPECT_EQ(dispatch_launch_shape(8192, 16, 512).ctas, 128);
  EXPECT_EQ(dispatch_launch_shape(8192, 16, 512).slice_count_words, size_t(128 * 513));
  EXPECT_EQ(dispatch_launch_shape(128, 8, 256).slice_count_words, 0u);
  EXPECT_EQ(dispatch_launch_shape(0, 8, 256).ctas, 0);
  EXPECT_EQ(dispatch_launch_shape(1, 1, 4096).windows, 4);
  EXPECT_THROW(dispatch_launch_shape(1, 1, 4097), Error);
}

// Host-only: the slice counts sized for a largest batch hold what every smaller batch needs (the
// CTA count is not monotone in T: it drops where the slices grow).
TEST(DispatchLaunch, SliceCountsSizedForEverySmallerBatch) {
  for (int64_t experts : {8, 256, 4096}) {
    for (int64_t topk : {1, 8, 16}) {
      for (int64_t max_tokens : {1, 128, 129, 16384, 20000, 65536, 300000}) {
        const size_t bytes = dispatch_slice_count_bytes(max_tokens, topk, experts);
        for (int64_t t = 0; t <= max_tokens; t += 1 + max_tokens / 997) {
          SCOPED_TRACE(testing::Message() << "E=" << experts << " k=" << topk << " max T=" << max_tokens << " T=" << t);
          ASSERT_LE(dispatch_launch_shape(t, topk, experts).slice_count_words * 4, bytes);
        }
        EXPECT_LE(dispatch_launch_shape(max_tokens, topk, experts).slice_count_words * 4, bytes);
      }
    }
  }
}

}  // namespace
}  // namespace loom
