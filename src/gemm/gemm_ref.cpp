#include "gemm/gemm_ref.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <string>

#include "common/parallel.hpp"
#include "quant/fp8_e4m3.hpp"
#include "quant/quant_ref.hpp"

// Speed without changing the arithmetic: every output is the sum over k = 0..K-1, in that order, of
// double products of exactly dequantised operands (a float code value times a float scale needs at
// most 4 + 24 significant bits, so it is exact in double). The kernel vectorises across outputs
// (independent sums), never across k, so it needs no reassociation and no -ffast-math.

namespace loom {

namespace {

constexpr int kMR = 4;        // activation rows per micro-tile
constexpr int kNR = 4;        // weight rows (outputs) per micro-tile
constexpr int64_t kNB = 64;   // weight rows dequantised per work item
constexpr int64_t kMB = 64;   // activation rows dequantised at a time

const std::array<double, 256>& e4m3_table() {
  static const std::array<double, 256> t = [] {
    std::array<double, 256> v{};
    for (int c = 0; c < 256; ++c) v[size_t(c)] = double(e4m3_to_float(uint8_t(c)));
    return v;
  }();
  return t;
}

// c[i][j] = sum_k ap[k][i] * wp[k][j] for MR rows of the A panel (stride kMR) and kNR weight rows.
template <int MR>
void micro_tile(const double* ap, const double* wp, int64_t K, double* out, int64_t ldo, int64_t nvalid) {
  double c[MR][kNR] = {};
  for (int64_t k = 0; k < K; ++k) {
    const double* a = ap + k * kMR;
    const double* w = wp + k * kNR;
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < kNR; ++j) c[i][j] += a[i] * w[j];
  }
  for (int i = 0; i < MR; ++i)
    for (int64_t j = 0; j < nvalid; ++j) out[i * ldo + j] = c[i][j];
}

void check(const ActivationRows& a, const int32_t* offsets, const ExpertWeights& w) {
  if (a.dtype != w.dtype) throw Error("grouped_gemm_ref: activation and weight dtypes differ");
  if (a.cols != w.cols)
    throw Error("grouped_gemm_ref: activation width " + std::to_string(a.cols) + " != weight K " +
                std::to_string(w.cols));
  if (w.experts <= 0 || w.rows <= 0 || w.cols <= 0) throw Error("grouped_gemm_ref: empty weight shape");
  if (!offsets) throw Error("grouped_gemm_ref: offsets is null");
  if (offsets[0] != 0) throw Error("grouped_gemm_ref: offsets[0] must be 0");
  for (int64_t e = 0; e < w.experts; ++e)
    if (offsets[e + 1] < offsets[e]) throw Error("grouped_gemm_ref: offsets must be non-decreasing");
  if (offsets[w.experts] > a.rows)
    throw Error("grouped_gemm_ref: offsets[E] = " + std::to_string(offsets[w.experts]) + " exceeds the " +
                std::to_string(a.rows) + " activation rows");
  if (w.dtype == DType::fp8) {
    if (offsets[w.experts] > 0 && (!a.q || !a.scales)) throw Error("grouped_gemm_ref: fp8 activations missing");
    if (!w.q || !w.scales) throw Error("grouped_gemm_ref: fp8 weights missing");
    weight_row_blocks(w.rows, w.segment_rows);  // throws on a bad segment split
  } else {
    if (offsets[w.experts] > 0 && !a.x) throw Error("grouped_gemm_ref: bf16 activations missing");
    if (!w.w) throw Error("grouped_gemm_ref: bf16 weights missing");
  }
}

}  // namespace

void grouped_gemm_ref(const ActivationRows& a, const int32_t* offsets, const ExpertWeights& w, double* out) {
  check(a, offsets, w);
  const int64_t E = w.experts, N = w.rows, K = w.cols;
  const int64_t n_items = (N + kNB - 1) / kNB;
  const bool fp8 = w.dtype == DType::fp8;
  const auto& lut = e4m3_table();
  const int64_t kb = quant_blocks(K);
  const int64_t row_blocks = fp8 ? weight_row_blocks(N, w.segment_rows) : 0;

  // Work items (expert, block of kNB weight rows), experts without rows skipped. Items are claimed
  // dynamically so a hot expert does not stall one thread; each item owns its outputs.
  std::vector<std::pair<int32_t, int32_t>> items;
  for (int64_t e = 0; e < E; ++e)
    if (offsets[e + 1] > offsets[e])
      for (int64_t nb = 0; nb < n_items; ++nb) items.emplace_back(int32_t(e), int32_t(nb));
  std::atomic<int64_t> next{0};

  parallel_for(std::min<int64_t>(cpu_threads(), int64_t(items.size())), [&](int64_t, int64_t) {
    std::vector<double> wp(size_t(kNB * K));  // [kNB / kNR panels][K][kNR]
    std::vector<double> ap(size_t(kMB * K));  // [kMB / kMR panels][K][kMR]
    for (int64_t it = next++; it < int64_t(items.size()); it = next++) {
      const int64_t e = items[size_t(it)].first;
      const int64_t n0 = int64_t(items[size_t(it)].second) * kNB, n1 = std::min(N, n0 + kNB);
      // Dequantise weight rows n0..n1 of expert e into kNR-wide panels, the last one zero-padded.
      for (int64_t n = n0; n < n1; n += kNR) {
        double* panel = wp.data() + (n - n0) * K;
        for (int j = 0; j < kNR; ++j) {
          const int64_t row = n + j;
          if (row >= n1) {
            for (int64_t k = 0; k < K; ++k) panel[k * kNR + j] = 0.0;
            continue;
          }
          if (fp8) {
            const uint8_t* q = w.q + (e * N + row) * K;
            const float* s = w.scales + (e * row_blocks + weight_row_block(row, w.segment_rows)) * kb;
            for (int64_t k = 0; k < K; ++k) panel[k * kNR + j] = lut[q[k]] * double(s[k / kQuantBlock]);
          } else {
            const bf16* x = w.w + (e * N + row) * K;
            for (int64_t k = 0; k < K; ++k) panel[k * kNR + j] = double(bf16_to_float(x[k]));
          }
        }
      }
      for (int64_t m0 = offsets[e]; m0 < offsets[e + 1]; m0 += kMB) {
        const int64_t m1 = std::min<int64_t>(offsets[e + 1], m0 + kMB);
        // Dequantise activation rows m0..m1 into kMR-wide panels (a short last panel is never read
        // past its rows: the micro-tile below is instantiated for the exact row count).
        for (int64_t r = m0; r < m1; ++r) {
          double* panel = ap.data() + ((r - m0) / kMR) * kMR * K;
          const int64_t i = (r - m0) % kMR;
          if (fp8) {
            const uint8_t* q = a.q + r * K;
            const float* s = a.scales + r * kb;
            for (int64_t k = 0; k < K; ++k) panel[k * kMR + i] = lut[q[k]] * double(s[k / kQuantBlock]);
          } else {
            const bf16* x = a.x + r * K;
            for (int64_t k = 0; k < K; ++k) panel[k * kMR + i] = double(bf16_to_float(x[k]));
          }
        }
        for (int64_t r = m0; r < m1; r += kMR) {
          const double* apanel = ap.data() + ((r - m0) / kMR) * kMR * K;
          const int64_t mr = std::min<int64_t>(kMR, m1 - r);
          for (int64_t n = n0; n < n1; n += kNR) {
            const double* wpanel = wp.data() + (n - n0) * K;
            double* o = out + r * N + n;
            const int64_t nvalid = std::min<int64_t>(kNR, n1 - n);
            switch (mr) {
              case 4: micro_tile<4>(apanel, wpanel, K, o, N, nvalid); break;
              case 3: micro_tile<3>(apanel, wpanel, K, o, N, nvalid); break;
              case 2: micro_tile<2>(apanel, wpanel, K, o, N, nvalid); break;
              default: micro_tile<1>(apanel, wpanel, K, o, N, nvalid); break;
            }
          }
        }
      }
    }
  });
}

void silu_mul_ref(const double* h, int64_t rows, int64_t inter, float* act) {
  parallel_for(
      rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const double* gate = h + r * 2 * inter;
          const double* up = gate + inter;
          for (int64_t i = 0; i < inter; ++i) {
            const double g = gate[i];
            // g / (1 + e^-g): e^-g overflows to inf for very negative g, giving -0, the limit.
            act[r * inter + i] = float(g / (1.0 + std::exp(-g)) * up[i]);
          }
        }
      },
      16);
}

void combine_ref(const double* y, int64_t cols, const Dispatch& d, const TopK& topk, double* out) {
  const int64_t T = topk.tokens, k = topk.topk;
  if (d.routes != T * k || int64_t(d.route_row.size()) != T * k || int64_t(topk.weights.size()) != T * k)
    throw Error("combine_ref: dispatch and top-k disagree on the number of routes");
  parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          double* o = out + t * cols;
          std::fill(o, o + cols, 0.0);
          for (int64_t j = 0; j < k; ++j) {  // slot order: the summation order is part of the contract
            const int32_t row = d.route_row[size_t(t * k + j)];
            if (row < 0) continue;  // dropped route
            const double wt = double(topk.weights[size_t(t * k + j)]);
            const double* yr = y + int64_t(row) * cols;
            for (int64_t n = 0; n < cols; ++n) o[n] += wt * yr[n];
          }
        }
      },
      16);
}

}  // namespace loom
