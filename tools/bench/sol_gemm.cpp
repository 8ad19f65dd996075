#include "bench/sol_gemm.hpp"

#include <cublasLt.h>

#include <algorithm>
#include <limits>

#include "bench/fill_random.cuh"
#include "bench/timer.hpp"
#include "common/cuda_check.hpp"

#define LOOM_CUBLAS_CHECK(call)                                                                        \
  do {                                                                                                 \
    const cublasStatus_t loom_st_ = (call);                                                            \
    if (loom_st_ != CUBLAS_STATUS_SUCCESS)                                                             \
      throw ::loom::Error(std::string("cuBLASLt error ") + cublasLtGetStatusString(loom_st_) + " in " + \
                          #call);                                                                      \
  } while (0)

namespace loom::bench {

std::vector<GemmShape> sol_gemm_shapes(const Shape& s) {
  const int64_t m = s.routes();
  if (s.mode == Mode::single) return {{m, s.inter, s.hidden}};
  return {{m, 2 * s.inter, s.hidden}, {m, s.hidden, s.inter}};
}

namespace {
constexpr size_t kWorkspaceBytes = 64ull << 20;

// cuBLASLt's FP8 kernels want M in multiples of 16; the extra rows are counted in touched bytes
// but not in FLOPs.
int64_t pad_m(int64_t m) { return std::max<int64_t>(16, (m + 15) / 16 * 16); }
}  // namespace

struct DenseGemm::Impl {
  DType dtype;
  std::vector<GemmShape> shapes;
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  float* scales = nullptr;  // device: per-tensor scales of A (at 0) and B (at +4 floats), both 1
  struct PerShape {
    int64_t m = 0;  // padded
    std::vector<void*> a, b, d;  // per copy
    void* c = nullptr;  // never read (beta = 0), but cuBLASLt's FP8 kernels run out of place only
    cublasLtMatmulDesc_t desc[2] = {nullptr, nullptr};  // [fast_accum]
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
    cublasLtMatmulAlgo_t algo{};
    int chosen_desc = 0;
    bool tuned = false;
    std::string algo_desc;
  };
  std::vector<PerShape> per;

  size_t elem() const { return dtype == DType::fp8 ? 1 : 2; }

  void matmul(const PerShape& p, int copy, int desc, const cublasLtMatmulAlgo_t* algo, cudaStream_t st) const {
    const float alpha = 1.0f, beta = 0.0f;
    // Column-major view: D^T[n, m] = B[n, k] . A[m, k]^T, i.e. A is "op T" with ld = k.
    LOOM_CUBLAS_CHECK(cublasLtMatmul(handle, p.desc[desc], &alpha, p.a[size_t(copy)], p.la, p.b[size_t(copy)], p.lb,
                                     &beta, p.c, p.ld, p.d[size_t(copy)], p.ld, algo, workspace,
                                     kWorkspaceBytes, st));
  }
};

DenseGemm::DenseGemm(DType dtype, std::vector<GemmShape> shapes, int copies, uint64_t seed)
    : impl_(std::make_unique<Impl>()), copies_(copies) {
  Impl& I = *impl_;
  I.dtype = dtype;
  I.shapes = std::move(shapes);
  LOOM_CUBLAS_CHECK(cublasLtCreate(&I.handle));
  LOOM_CUDA_CHECK(cudaMalloc(&I.workspace, kWorkspaceBytes));
  // Each scale on its own 16-byte boundary: cuBLASLt's FP8 kernels reject a 4-byte-aligned one.
  LOOM_CUDA_CHECK(cudaMalloc(&I.scales, 8 * sizeof(float)));
  const float ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  LOOM_CUDA_CHECK(cudaMemcpy(I.scales, ones, sizeof ones, cudaMemcpyHostToDevice));
  const cudaDataType_t ab_type = dtype == DType::fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
  uint64_t fill = seed;
  for (const GemmShape& g : I.shapes) {
    Impl::PerShape p;
    p.m = pad_m(g.m);
    for (int c = 0; c < copies; ++c) {
      void *a, *b, *d;
      LOOM_CUDA_CHECK(cudaMalloc(&a, size_t(p.m * g.k) * I.elem()));
      LOOM_CUDA_CHECK(cudaMalloc(&b, size_t(g.n * g.k) * I.elem()));
      LOOM_CUDA_CHECK(cudaMalloc(&d, size_t(p.m * g.n) * 2));
      if (dtype == DType::fp8) {
        fill_random_e4m3(a, p.m * g.k, ++fill, nullptr);
        fill_random_e4m3(b, g.n * g.k, ++fill, nullptr);
      } else {
        fill_random_bf16(a, p.m * g.k, ++fill, nullptr);
        fill_random_bf16(b, g.n * g.k, ++fill, nullptr);
      }
      p.a.push_back(a);
      p.b.push_back(b);
      p.d.push_back(d);
    }
    LOOM_CUDA_CHECK(cudaMalloc(&p.c, size_t(p.m * g.n) * 2));
    for (int fast = 0; fast < 2; ++fast) {
      LOOM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc[fast], CUBLAS_COMPUTE_32F, CUDA_R_32F));
      const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
      // cuBLASLt is column-major: compute D^T (n x m) = B (n x k, "A" of cuBLASLt transposed) times A^T.
      LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc[fast], CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
      LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc[fast], CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
      if (dtype == DType::fp8) {
        const float* sa = I.scales;
        const float* sb = I.scales + 4;
        LOOM_CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(p.desc[fast], CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa));
        LOOM_CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(p.desc[fast], CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb));
        const int8_t fast_accum = int8_t(fast);
        LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc[fast], CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum,
                                                         sizeof fast_accum));
      }
    }
    // "A" of cuBLASLt = our B [n, k] row-major = k x n column-major, transposed -> n x k.
    LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.la, ab_type, uint64_t(g.k), uint64_t(g.n), int64_t(g.k)));
    // "B" of cuBLASLt = our A [m, k] row-major = k x m column-major.
    LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lb, ab_type, uint64_t(g.k), uint64_t(p.m), int64_t(g.k)));
    // D^T: n x m column-major = our D [m, n] row-major.
    LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.ld, CUDA_R_16BF, uint64_t(g.n), uint64_t(p.m), int64_t(g.n)));
    // The operands are swapped relative to the names above: cuBLASLt's A is our B.
    std::swap(p.a, p.b);
    I.per.push_back(std::move(p));
  }
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
}

DenseGemm::~DenseGemm() {
  if (!impl_) return;
  for (auto& p : impl_->per) {
    for (auto v : {&p.a, &p.b, &p.d})
      for (void* ptr : *v) cudaFree(ptr);
    cudaFree(p.c);
    for (auto d : p.desc)
      if (d) cublasLtMatmulDescDestroy(d);
    if (p.la) cublasLtMatrixLayoutDestroy(p.la);
    if (p.lb) cublasLtMatrixLayoutDestroy(p.lb);
    if (p.ld) cublasLtMatrixLayoutDestroy(p.ld);
  }
  cudaFree(impl_->workspace);
  cudaFree(impl_->scales);
  if (impl_->handle) cublasLtDestroy(impl_->handle);
}

void DenseGemm::autotune(GpuTimer& timer, int reps) {
  Impl& I = *impl_;
  cublasLtMatmulPreference_t pref;
  LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kWorkspaceBytes;
  LOOM_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  for (auto& p : I.per) {
    double best = std::numeric_limits<double>::infinity();
    int offered = 0;
    std::string last_failure = "none";
    const int descs = I.dtype == DType::fp8 ? 2 : 1;
    for (int di = 0; di < descs; ++di) {
      cublasLtMatmulHeuristicResult_t results[8];
      int found = 0;
      // Swapped operands: cuBLASLt's A (p.a) uses layout la.
      const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(I.handle, p.desc[di], p.la, p.lb, p.ld, p.ld, pref,
                                                               8, results, &found);
      if (st != CUBLAS_STATUS_SUCCESS) {
        last_failure = std::string("heuristic: ") + cublasLtGetStatusString(st);
        continue;
      }
      offered += found;
      for (int r = 0; r < found; ++r) {
        if (results[r].state != CUBLAS_STATUS_SUCCESS) continue;
        const cublasLtMatmulAlgo_t algo = results[r].algo;
        Stats s;
        try {
          s = timer.time([&](cudaStream_t st, int c) { I.matmul(p, c, di, &algo, st); }, copies_, L2Mode::warm,
                         TimerOptions{reps, 3});
        } catch (const Error& e) {
          last_failure = e.what();
          continue;  // a candidate the library offered but cannot run here
        }
        if (s.median_us < best) {
          best = s.median_us;
          p.algo = algo;
          p.chosen_desc = di;
          p.tuned = true;
          p.algo_desc = std::string(I.dtype == DType::fp8 ? (di ? "fast-accum " : "precise-accum ") : "") +
                        "heuristic #" + std::to_string(r);
        }
      }
    }
    if (!p.tuned)
      throw Error("cuBLASLt has no working algorithm for this GEMM shape (" + std::to_string(offered) +
                  " offered; last failure: " + last_failure + ")");
  }
  cublasLtMatmulPreferenceDestroy(pref);
}

void DenseGemm::enqueue(cudaStream_t stream, int copy) const {
  for (const auto& p : impl_->per) {
    if (!p.tuned) throw Error("DenseGemm::enqueue before autotune");
    impl_->matmul(p, copy, p.chosen_desc, &p.algo, stream);
  }
}

int64_t DenseGemm::touched_bytes(DType dtype, const std::vector<GemmShape>& shapes) {
  const int64_t elem = dtype == DType::fp8 ? 1 : 2;
  int64_t b = 0;
  for (const GemmShape& g : shapes) {
    const int64_t m = pad_m(g.m);
    b += elem * (m * g.k + g.n * g.k) + 2 * m * g.n;
  }
  return b;
}

const std::vector<GemmShape>& DenseGemm::shapes() const { return impl_->shapes; }
DType DenseGemm::impl_dtype() const { return impl_->dtype; }

double DenseGemm::flops() const {
  double f = 0;
  for (const GemmShape& g : impl_->shapes) f += 2.0 * double(g.m) * double(g.n) * double(g.k);
  return f;
}

std::string DenseGemm::algo() const {
  std::string s;
  for (const auto& p : impl_->per) s += (s.empty() ? "" : " + ") + p.algo_desc;
  return s;
}

const void* DenseGemm::a(int s) const { return impl_->per[size_t(s)].b[0]; }
const void* DenseGemm::b(int s) const { return impl_->per[size_t(s)].a[0]; }
const void* DenseGemm::d(int s) const { return impl_->per[size_t(s)].d[0]; }
int64_t DenseGemm::padded_m(int s) const { return impl_->per[size_t(s)].m; }

}  // namespace loom::bench
