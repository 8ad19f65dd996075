#include "pipeline/gpu_reference.cuh"

#include <cuda_fp8.h>

#include <algorithm>

#include "bench/device_buffer.hpp"
#include "dispatch/dispatch_ref.hpp"
#include "gemm/gemm_ref.hpp"
#include "quant/quant_ref.hpp"

namespace loom::test {

namespace {

constexpr int kTile = 32;

__device__ double decode_e4m3(uint8_t code) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(code), __NV_E4M3);
  return double(__half2float(__half(h)));
}

__device__ double decode_bf16(uint16_t bits) { return double(__uint_as_float(uint32_t(bits) << 16)); }

// An operand element in double: fp8, code x its block's scale; bf16 (no scales), the value.
template <bool kBf16>
__device__ double element(const void* p, int64_t i, const float* scales, int64_t s) {
  if constexpr (kBf16)
    return decode_bf16(static_cast<const uint16_t*>(p)[i]);
  else
    return decode_e4m3(static_cast<const uint8_t*>(p)[i]) * double(scales[s]);
}

// Block: 32 sorted rows of one expert x 32 output columns; K in tiles of 32 through shared memory.
// Weight rows form segments of seg rows (w13: gate, then up), each in its own 128-row blocks.
template <bool kBf16>
__global__ void reference_gemm_kernel(const void* a, const float* a_scales, const void* w, const float* w_scales,
                                      const int2* tiles, int n, int k, int seg, int nblocks, int kblocks, double* y) {
  __shared__ double as[kTile][kTile + 1];
  __shared__ double ws[kTile][kTile + 1];
  const int2 tile = tiles[blockIdx.x];  // (expert, first padded row); padding rows hold zeros
  const int e = tile.x, row0 = tile.y;
  const int n0 = blockIdx.y * kTile;
  const int tr = threadIdx.x / kTile, tc = threadIdx.x % kTile;  // 32 x 8 threads, 4 rows each
  double acc[4] = {0, 0, 0, 0};
  for (int k0 = 0; k0 < k; k0 += kTile) {
    for (int i = threadIdx.x; i < kTile * kTile; i += blockDim.x) {
      const int r = i / kTile, kk = i % kTile, gk = k0 + kk;
      const int64_t row = row0 + r;
      as[r][kk] = gk < k ? element<kBf16>(a, row * k + gk, a_scales, row * kblocks + gk / 128) : 0.0;
      const int gn = n0 + r;
      ws[r][kk] = (gk < k && gn < n)
                      ? element<kBf16>(w, (int64_t(e) * n + gn) * k + gk, w_scales,
                                       (int64_t(e) * nblocks + gn / seg * ((seg + 127) / 128) + gn % seg / 128) *
                                               kblocks + gk / 128)
                      : 0.0;
    }
    __syncthreads();
    for (int kk = 0; kk < kTile; ++kk)
      for (int i = 0; i < 4; ++i) acc[i] += as[tr + 8 * i][kk] * ws[tc][kk];
    __syncthreads();
  }
  for (int i = 0; i < 4; ++i) {
    const int gn = n0 + tc;
    if (gn < n) y[int64_t(row0 + tr + 8 * i) * n + gn] = acc[i];
  }
}

// Sorted rows padded per expert to whole 32-row tiles (a tile never spans two experts), each
// route's padded row, and the tiles.
struct PaddedRows {
  std::vector<int2> tiles;
  std::vector<int64_t> route_row;  // [T*k], -1 = dropped
  int64_t rows = 0;
};
PaddedRows pad_rows(const Shape& s, const TopK& topk) {
  const Dispatch d = dispatch_ref(topk.ids.data(), topk.tokens, s.topk, s.experts);
  PaddedRows p;
  std::vector<int64_t> start(size_t(s.experts));
  for (int64_t e = 0; e < s.experts; ++e) {
    start[size_t(e)] = p.rows;
    const int64_t c = d.counts[size_t(e)];
    for (int64_t r = 0; r < c; r += kTile) p.tiles.push_back(make_int2(int(e), int(p.rows + r)));
    p.rows += (c + kTile - 1) / kTile * kTile;
  }
  p.route_row.assign(size_t(topk.tokens * s.topk), -1);
  for (int64_t route = 0; route < topk.tokens * s.topk; ++route) {
    const int32_t row = d.route_row[size_t(route)];
    if (row >= 0) {
      const int32_t e = topk.ids[size_t(route)];
      p.route_row[size_t(route)] = start[size_t(e)] + (row - d.offsets[size_t(e)]);
    }
  }
  return p;
}

// y [rows, N] in double: each padded row times its expert's weights. fp8: codes a with 1x128 scales
// as (row-major), weights wq [E, N, K] with 128x128 scales ws in segments of seg rows; bf16 (as and
// ws empty): the values.
template <bool kBf16, class A, class W>
std::vector<double> grouped_gemm_on_gpu(const PaddedRows& p, const std::vector<A>& a, const std::vector<float>& as,
                                        const std::vector<W>& wq, const std::vector<float>& ws, int64_t N, int64_t K,
                                        int64_t seg) {
  if (p.tiles.empty()) return {};
  bench::DeviceBuffer da = bench::DeviceBuffer::from(a), das = bench::DeviceBuffer::from(as);
  bench::DeviceBuffer dw = bench::DeviceBuffer::from(wq), dws = bench::DeviceBuffer::from(ws);
  bench::DeviceBuffer dt = bench::DeviceBuffer::from(p.tiles);
  bench::DeviceBuffer dy(size_t(p.rows * N) * sizeof(double));
  const dim3 grid(unsigned(p.tiles.size()), unsigned((N + kTile - 1) / kTile));
  reference_gemm_kernel<kBf16><<<grid, 256>>>(da.get(), das.as<float>(), dw.get(), dws.as<float>(), dt.as<int2>(),
                                              int(N), int(K), int(seg), int(weight_row_blocks(N, seg)),
                                              int(quant_blocks(K)), dy.as<double>());
  LOOM_CUDA_CHECK_LAUNCH();
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  return dy.to_host<double>();
}

std::vector<double> grouped_gemm_gpu(const PaddedRows& p, const std::vector<uint8_t>& a, const std::vector<float>& as,
                                     const std::vector<uint8_t>& wq, const std::vector<float>& ws, int64_t N, int64_t K,
                                     int64_t seg) {
  return grouped_gemm_on_gpu<false>(p, a, as, wq, ws, N, K, seg);
}

std::vector<double> grouped_gemm_bf16_gpu(const PaddedRows& p, const std::vector<bf16>& a, const std::vector<bf16>& w,
                                          int64_t N, int64_t K) {
  return grouped_gemm_on_gpu<true>(p, a, {}, w, {}, N, K, N);
}

// Each token's quantised hidden row copied to its routes' padded rows (padding rows: zeros).
void gather_hidden(const Shape& s, const PaddedRows& p, const std::vector<bf16>& hidden, int64_t T,
                   std::vector<uint8_t>& a, std::vector<float>& as) {
  const int64_t K = s.hidden, KB = quant_blocks(K);
  std::vector<uint8_t> tq(size_t(T * K));
  std::vector<float> ts(size_t(T * KB));
  quantize_1x128_ref(hidden.data(), T, K, tq.data(), ts.data());
  a.assign(size_t(std::max<int64_t>(p.rows, 1) * K), 0);
  as.assign(size_t(std::max<int64_t>(p.rows, 1) * KB), 0.0f);
  for (int64_t route = 0; route < T * s.topk; ++route) {
    const int64_t prow = p.route_row[size_t(route)], t = route / s.topk;
    if (prow < 0) continue;
    std::copy_n(&tq[size_t(t * K)], K, &a[size_t(prow * K)]);
    std::copy_n(&ts[size_t(t * KB)], KB, &as[size_t(prow * KB)]);
  }
}

// Sum over slots, in slot order, of weight * y[route's row]; bf16_rows: each weighted row rounded
// to bf16 first (the BF16 layer's GEMM 2 stores them so).
std::vector<double> combine(const PaddedRows& p, const TopK& topk, const std::vector<double>& y, int64_t N,
                            bool bf16_rows = false) {
  std::vector<double> out(size_t(topk.tokens * N), 0.0);
  for (int64_t t = 0; t < topk.tokens; ++t)
    for (int64_t j = 0; j < topk.topk; ++j) {
      const int64_t prow = p.route_row[size_t(t * topk.topk + j)];
      if (prow < 0) continue;
      const double wt = topk.weights[size_t(t * topk.topk + j)];
      for (int64_t n = 0; n < N; ++n) {
        const double v = wt * y[size_t(prow * N + n)];
        out[size_t(t * N + n)] += bf16_rows ? double(round_double_to_bf16(v)) : v;
      }
    }
  return out;
}

}  // namespace

std::vector<double> reference_single_fp8_gpu(const LayerWeights& w, const std::vector<bf16>& hidden, const TopK& topk) {
  const Shape& s = w.shape;
  const PaddedRows p = pad_rows(s, topk);
  std::vector<uint8_t> a;
  std::vector<float> as;
  gather_hidden(s, p, hidden, topk.tokens, a, as);
  if (p.tiles.empty()) return std::vector<double>(size_t(topk.tokens * s.inter), 0.0);
  return combine(p, topk, grouped_gemm_gpu(p, a, as, w.w1_q, w.w1_scales, s.inter, s.hidden, s.inter), s.inter);
}

std::vector<double> reference_ffn_fp8_gpu(const LayerWeights& w, const std::vector<bf16>& hidden, const TopK& topk,
                                          const RouteIntermediate* given, std::vector<float>* act_out) {
  const Shape& s = w.shape;
  const int64_t I = s.inter, H = s.hidden, ib = quant_blocks(I), routes = topk.tokens * s.topk;
  const PaddedRows p = pad_rows(s, topk);
  if (act_out) act_out->assign(size_t(routes * I), 0.0f);
  if (p.tiles.empty()) return std::vector<double>(size_t(topk.tokens * H), 0.0);
  std::vector<uint8_t> a;
  std::vector<float> as;
  gather_hidden(s, p, hidden, topk.tokens, a, as);
  const std::vector<double> h = grouped_gemm_gpu(p, a, as, w.w1_q, w.w1_scales, 2 * I, H, I);
  // The intermediate as layer_ref makes it: act in double, rounded once to fp32, 1x128 requantised.
  std::vector<float> act(size_t(p.rows * I));
  silu_mul_ref(h.data(), p.rows, I, act.data());
  std::vector<uint8_t> a2(size_t(p.rows * I));
  std::vector<float> as2(size_t(p.rows * ib));
  quantize_1x128_ref(act.data(), p.rows, I, a2.data(), as2.data());
  for (int64_t route = 0; route < routes; ++route) {
    const int64_t row = p.route_row[size_t(route)];
    if (row < 0) continue;
    if (act_out) std::copy_n(act.begin() + row * I, I, act_out->begin() + route * I);
    if (given) {
      std::copy_n(given->codes.begin() + route * I, I, a2.begin() + row * I);
      std::copy_n(given->scales.begin() + route * ib, ib, as2.begin() + row * ib);
    }
  }
  return combine(p, topk, grouped_gemm_gpu(p, a2, as2, w.w2_q, w.w2_scales, H, I, H), H);
}

std::vector<double> reference_ffn_bf16_gpu(const LayerWeights& w, const std::vector<bf16>& hidden, const TopK& topk) {
  const Shape& s = w.shape;
  const int64_t I = s.inter, H = s.hidden, routes = topk.tokens * s.topk;
  const PaddedRows p = pad_rows(s, topk);
  if (p.tiles.empty()) return std::vector<double>(size_t(topk.tokens * H), 0.0);
  std::vector<bf16> a(size_t(p.rows * H));  // padding rows: zeros
  for (int64_t route = 0; route < routes; ++route) {
    const int64_t prow = p.route_row[size_t(route)];
    if (prow >= 0) std::copy_n(&hidden[size_t(route / s.topk * H)], H, &a[size_t(prow * H)]);
  }
  const std::vector<double> h = grouped_gemm_bf16_gpu(p, a, w.w1, 2 * I, H);
  // act in double, rounded to fp32 then bf16, as layer_ref's bf16 path.
  std::vector<float> act(size_t(p.rows * I));
  silu_mul_ref(h.data(), p.rows, I, act.data());
  std::vector<bf16> a2(act.size());
  for (size_t i = 0; i < act.size(); ++i) a2[i] = float_to_bf16(act[i]);
  // Each weighted route row rounded to bf16 (GEMM 2's stores), summed in slot order.
  return combine(p, topk, grouped_gemm_bf16_gpu(p, a2, w.w2, H, I), H, /*bf16_rows=*/true);
}

}  // namespace loom::test
