#include "bf16_variants/bf16_variants_sm90.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>

#include "bench/device_buffer.hpp"
#include "bf16_variants/bf16_variant_instances.cuh"
#include "common/cuda_check.hpp"
#include "common/device_info.hpp"
#include "gemm/gemm_bf16.hpp"
#include "gemm/gemm_bf16_launch.cuh"
#include "loom/types.hpp"

namespace loom::lab {

namespace {

using bench::DeviceBuffer;

// Random bf16 in [-scale, scale) from a hash of the index (no host copy of the large operands).
__global__ void fill_bf16(uint16_t* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed ^ uint32_t(i >> 32) * 40503u;
    h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
    const float f = (float(h & 0xffffff) / 16777216.0f * 2.0f - 1.0f) * scale;
    p[i] = uint16_t(__float_as_uint(f) >> 16);
  }
}

// x_sorted[r] = hidden[row_token[r]]: the sorted copy the product's GEMM 1 reads.
__global__ void gather_sorted(const uint16_t* hidden, const int32_t* row_token, uint16_t* x, int64_t rows, int k) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
    for (int c = threadIdx.x; c < k; c += blockDim.x) x[r * k + c] = hidden[int64_t(row_token[r]) * k + c];
}

enum class Variant { product, unstaged, pair, tokens, pair_tokens };
constexpr Variant kVariants[] = {Variant::product, Variant::unstaged, Variant::pair, Variant::tokens,
                                 Variant::pair_tokens};
const char* name(Variant v) {
  switch (v) {
    case Variant::product: return "product (3 stages, staged epilogue)";
    case Variant::unstaged: return "4 stages, epilogue from registers";
    case Variant::pair: return "CTA pairs, B multicast";
    case Variant::tokens: return "GEMM 1 A by token (cp.async)";
    case Variant::pair_tokens: return "CTA pairs + A by token";
  }
  return "?";
}

template <class K>
int pairs_resident(const DeviceInfo& dev) {
  const int pairs = std::min(dev.sm_count / 2, gemm::max_active_clusters<K>(gemm::launch_smem_bytes<K>));
  if (pairs < 1) throw Error("bf16-variants: no CTA pair fits on the device");
  return pairs;
}

struct Gemms {
  GemmBf16Params g1, g2;           // the product's (A from the sorted copy)
  const uint16_t* hidden = nullptr;  // by token: GEMM 1's A from here
  const int32_t* row_token = nullptr;
  int64_t tokens = 0;
  int pair_grid = 0;  // CTAs of the pairs that fit at once (asked once, not per launch)
};

void launch(const Gemms& g, Variant v, const DeviceInfo& dev, bool second) {
  using namespace gemm;
  const GemmBf16Params& p = second ? g.g2 : g.g1;
  check_gemm_bf16(p);
  GemmBf16Params by_token = g.g1;
  by_token.x = reinterpret_cast<const bf16*>(g.hidden);
  by_token.x_rows = g.tokens;
  const bool pair = v == Variant::pair || v == Variant::pair_tokens;
  const int grid = pair ? g.pair_grid : dev.sm_count;
  if (v == Variant::product) return launch_gemm_bf16(p, dev, nullptr, false);
  if (v == Variant::unstaged)
    return second ? launch_bf16_instance<LabBf16RowsUnstaged>(p, grid, nullptr, false)
                  : launch_bf16_instance<LabBf16ActUnstaged>(p, grid, nullptr, false);
  if (second)  // GEMM 2 reads the intermediate in sorted order: pairs or the product's
    return pair ? launch_bf16_instance<LabBf16RowsPair>(p, grid, nullptr, false) : launch_gemm_bf16(p, dev, nullptr, false);
  if (v == Variant::pair) return launch_bf16_instance<LabBf16ActPair>(p, grid, nullptr, false);
  if (v == Variant::tokens)
    return launch_bf16_instance<LabBf16ActTokens>(by_token, grid, nullptr, false, g.row_token, g.g1.x_rows);
  return launch_bf16_instance<LabBf16ActPairTokens>(by_token, grid, nullptr, false, g.row_token, g.g1.x_rows);
}

}  // namespace

std::string run_bf16_variants(const Bf16VariantsOptions& opt, std::ostream& log) {
  const DeviceInfo dev = *query_device();
  const int pair_grid = 2 * pairs_resident<gemm::LabBf16RowsPair>(dev);
  const int E = opt.experts, k = opt.topk, H = opt.hidden, I = opt.inter;
  std::ostringstream table;
  table << "BF16 GEMM variants, H=" << H << " I=" << I << " E=" << E << " k=" << k << ", "
        << (opt.uneven ? "uneven" : "balanced") << " expert rows; median of " << opt.repeats
        << " rounds alternating the variants (us; TFLOP/s on 6 T k H I)\n";
  char line[256];
  std::snprintf(line, sizeof line, "%8s  %-38s %10s %10s %10s %8s\n", "T", "variant", "GEMM 1", "GEMM 2", "both",
                "TFLOP/s");
  table << line;
  std::mt19937 rng(opt.seed);
  for (const int T : opt.tokens) {
    const int64_t R = int64_t(T) * k;
    std::vector<int32_t> off(size_t(E) + 1, 0);
    if (opt.uneven) {  // random shares, expert 1 empty
      std::vector<double> share(static_cast<size_t>(E));
      for (int e = 0; e < E; ++e) share[size_t(e)] = e == 1 ? 0.0 : std::uniform_real_distribution<double>(0.2, 2.0)(rng);
      double sum = 0;
      for (double s : share) sum += s;
      double acc = 0;
      for (int e = 0; e < E; ++e) acc += share[size_t(e)], off[size_t(e) + 1] = int32_t(double(R) * acc / sum);
      off[size_t(E)] = int32_t(R);
    } else {
      for (int e = 0; e <= E; ++e) off[size_t(e)] = int32_t(R * e / E);
    }
    std::vector<int32_t> row_token(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r) row_token[size_t(r)] = int32_t((r * 7919) % T);
    DeviceBuffer w13(size_t(E) * 2 * I * H * 2), w2(size_t(E) * H * I * 2), hidden(size_t(T) * H * 2),
        x(size_t(R) * H * 2), doff = DeviceBuffer::from(off), drt = DeviceBuffer::from(row_token),
        rw(size_t(R) * 4);
    fill_bf16<<<1024, 256>>>(w13.as<uint16_t>(), w13.bytes() / 2, opt.seed * 3 + 1, 0.05f);
    fill_bf16<<<1024, 256>>>(w2.as<uint16_t>(), w2.bytes() / 2, opt.seed * 3 + 2, 0.05f);
    fill_bf16<<<1024, 256>>>(hidden.as<uint16_t>(), hidden.bytes() / 2, opt.seed * 3 + 3, 1.0f);
    LOOM_CUDA_CHECK(cudaGetLastError());
    gather_sorted<<<1024, 256>>>(hidden.as<uint16_t>(), drt.as<int32_t>(), x.as<uint16_t>(), R, H);
    LOOM_CUDA_CHECK(cudaGetLastError());
    std::vector<float> weights(static_cast<size_t>(R));
    for (float& w : weights) w = std::uniform_real_distribution<float>(0.05f, 1.0f)(rng);
    rw.upload(weights);
    // Outputs per variant: the intermediate and the route rows (compared with the product's).
    const int nv = int(std::size(kVariants));
    std::vector<DeviceBuffer> act, y;
    for (int v = 0; v < nv; ++v) act.emplace_back(size_t(R) * I * 2), y.emplace_back(size_t(R) * H * 2);
    auto gemms = [&](int v) {
      Gemms g;
      g.g1.weights = w13.as<bf16>(), g.g1.x = x.as<bf16>(), g.g1.x_rows = R, g.g1.offsets = doff.as<int32_t>();
      g.g1.epilogue = Bf16Epilogue::act, g.g1.out = act[size_t(v)].get(), g.g1.inter = I, g.g1.experts = E;
      g.g1.n = 2 * I, g.g1.k = H;
      g.g2 = g.g1;
      g.g2.weights = w2.as<bf16>(), g.g2.x = act[size_t(v)].as<bf16>(), g.g2.epilogue = Bf16Epilogue::rows;
      g.g2.row_weight = rw.as<float>(), g.g2.out = y[size_t(v)].get(), g.g2.store_bf16 = true, g.g2.n = H, g.g2.k = I;
      g.hidden = hidden.as<uint16_t>(), g.row_token = drt.as<int32_t>(), g.tokens = T, g.pair_grid = pair_grid;
      return g;
    };
    for (int v = 0; v < nv; ++v) {
      LOOM_CUDA_CHECK(cudaMemset(act[size_t(v)].get(), 0xff, act[size_t(v)].bytes()));
      LOOM_CUDA_CHECK(cudaMemset(y[size_t(v)].get(), 0xff, y[size_t(v)].bytes()));
      launch(gemms(v), kVariants[v], dev, false);
      launch(gemms(v), kVariants[v], dev, true);
      LOOM_CUDA_CHECK(cudaGetLastError());
    }
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());
    // Routed rows only (rows past offsets[E] are never written).
    const std::vector<uint16_t> act0 = act[0].to_host<uint16_t>(), y0 = y[0].to_host<uint16_t>();
    for (int v = 1; v < nv; ++v) {
      if (act[size_t(v)].to_host<uint16_t>() != act0 || y[size_t(v)].to_host<uint16_t>() != y0)
        throw Error(std::string("bf16-variants: ") + name(kVariants[v]) + " differs from the product at T=" +
                    std::to_string(T));
    }
    log << "T=" << T << ": every variant's outputs equal the product's\n";
    if (opt.repeats <= 0) continue;
    cudaEvent_t ev[3];
    for (cudaEvent_t& e : ev) LOOM_CUDA_CHECK(cudaEventCreate(&e));
    std::vector<std::vector<float>> t1(static_cast<size_t>(nv)), t2(static_cast<size_t>(nv));
    for (int round = -1; round < opt.repeats; ++round)  // round -1: warm-up
      for (int v = 0; v < nv; ++v) {
        const Gemms g = gemms(v);
        LOOM_CUDA_CHECK(cudaEventRecord(ev[0]));
        launch(g, kVariants[v], dev, false);
        LOOM_CUDA_CHECK(cudaEventRecord(ev[1]));
        launch(g, kVariants[v], dev, true);
        LOOM_CUDA_CHECK(cudaEventRecord(ev[2]));
        LOOM_CUDA_CHECK(cudaEventSynchronize(ev[2]));
        float a = 0, b = 0;
        LOOM_CUDA_CHECK(cudaEventElapsedTime(&a, ev[0], ev[1]));
        LOOM_CUDA_CHECK(cudaEventElapsedTime(&b, ev[1], ev[2]));
        if (round >= 0) t1[size_t(v)].push_back(a * 1e3f), t2[size_t(v)].push_back(b * 1e3f);
      }
    for (cudaEvent_t& e : ev) LOOM_CUDA_CHECK(cudaEventDestroy(e));
    auto median = [](std::vector<float> x) {
      std::sort(x.begin(), x.end());
      return double(x[x.size() / 2]);
    };
    const double flops = 6.0 * double(R) * H * I;
    for (int v = 0; v < nv; ++v) {
      const double a = median(t1[size_t(v)]), b = median(t2[size_t(v)]);
      std::snprintf(line, sizeof line, "%8d  %-38s %10.1f %10.1f %10.1f %8.0f\n", T, name(kVariants[v]), a, b, a + b,
                    flops / ((a + b) * 1e6));
      table << line;
    }
  }
  return table.str();
}

}  // namespace loom::lab
