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

// Block: 32 sorted rows of one expert x 32 output columns; K in tiles of 32 through shared memory.
__global__ void reference_gemm_kernel(const uint8_t* a, const float* a_scales, const uint8_t* w, const float* w_scales,
                                      const int2* tiles, int n, int k, int nblocks, int kblocks, double* y) {
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
      as[r][kk] = gk < k ? decode_e4m3(a[row * k + gk]) * double(a_scales[row * kblocks + gk / 128]) : 0.0;
      const int gn = n0 + r;
      ws[r][kk] = (gk < k && gn < n)
                      ? decode_e4m3(w[(int64_t(e) * n + gn) * k + gk]) *
                            double(w_scales[(int64_t(e) * nblocks + gn / 128) * kblocks + gk / 128])
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

}  // namespace

std::vector<double> reference_single_fp8_gpu(const LayerWeights& w, const std::vector<bf16>& hidden, const TopK& topk) {
  const Shape& s = w.shape;
  const int64_t T = topk.tokens, K = s.hidden, N = s.inter, KB = quant_blocks(K), NB = quant_blocks(N);
  const Dispatch d = dispatch_ref(topk.ids.data(), T, s.topk, s.experts);
  // Sorted rows padded per expert to whole 32-row tiles, so a tile never spans two experts.
  std::vector<int2> tiles;
  std::vector<int64_t> padded_start(size_t(s.experts));
  int64_t padded = 0;
  for (int64_t e = 0; e < s.experts; ++e) {
    padded_start[size_t(e)] = padded;
    const int64_t c = d.counts[size_t(e)];
    for (int64_t r = 0; r < c; r += kTile) tiles.push_back(make_int2(int(e), int(padded + r)));
    padded += (c + kTile - 1) / kTile * kTile;
  }
  std::vector<uint8_t> tq(size_t(T * K));
  std::vector<float> ts(size_t(T * KB));
  quantize_1x128_ref(hidden.data(), T, K, tq.data(), ts.data());
  std::vector<uint8_t> a(size_t(std::max<int64_t>(padded, 1) * K), 0);
  std::vector<float> as(size_t(std::max<int64_t>(padded, 1) * KB), 0.0f);
  std::vector<int64_t> route_padded_row(size_t(T * s.topk), -1);
  for (int64_t route = 0; route < T * s.topk; ++route) {
    const int32_t row = d.route_row[size_t(route)];
    if (row < 0) continue;
    const int32_t e = topk.ids[size_t(route)];
    const int64_t prow = padded_start[size_t(e)] + (row - d.offsets[size_t(e)]);
    route_padded_row[size_t(route)] = prow;
    const int64_t t = route / s.topk;
    std::copy_n(&tq[size_t(t * K)], K, &a[size_t(prow * K)]);
    std::copy_n(&ts[size_t(t * KB)], KB, &as[size_t(prow * KB)]);
  }
  std::vector<double> out(size_t(T * N), 0.0);
  if (tiles.empty()) return out;
  bench::DeviceBuffer da = bench::DeviceBuffer::from(a), das = bench::DeviceBuffer::from(as);
  bench::DeviceBuffer dw = bench::DeviceBuffer::from(w.w1_q), dws = bench::DeviceBuffer::from(w.w1_scales);
  bench::DeviceBuffer dt = bench::DeviceBuffer::from(tiles);
  bench::DeviceBuffer dy(size_t(padded * N) * sizeof(double));
  const dim3 grid(unsigned(tiles.size()), unsigned((N + kTile - 1) / kTile));
  reference_gemm_kernel<<<grid, 256>>>(da.as<uint8_t>(), das.as<float>(), dw.as<uint8_t>(), dws.as<float>(),
                                       dt.as<int2>(), int(N), int(K), int(NB), int(KB), dy.as<double>());
  LOOM_CUDA_CHECK_LAUNCH();
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<double> y = dy.to_host<double>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < s.topk; ++j) {
      const int64_t prow = route_padded_row[size_t(t * s.topk + j)];
      if (prow < 0) continue;
      const double wt = topk.weights[size_t(t * s.topk + j)];
      for (int64_t n = 0; n < N; ++n) out[size_t(t * N + n)] += wt * y[size_t(prow * N + n)];
    }
  return out;
}

}  // namespace loom::test
