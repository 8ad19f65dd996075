#include "bench/bench.hpp"

#include <algorithm>
#include <chrono>
#include <memory>
#include <ostream>

#include "bench/device_buffer.hpp"
#include "bench/sol_gemm.hpp"
#include "bench/sol_read.hpp"
#include "common/build_info.hpp"
#include "common/device_info.hpp"
#include "pipeline/layer_ref.hpp"

namespace loom::bench {

namespace {

// Device copies of the expert weights (rotated to keep L2 cold), made on demand.
class DeviceWeights {
 public:
  explicit DeviceWeights(const LayerWeights& w) : w_(w) {}
  void ensure_copies(int n) {
    while (int(w1_.size()) < n) {
      if (w1_.empty()) {
        w1_.push_back(w_.shape.dtype == DType::fp8 ? DeviceBuffer::from(w_.w1_q) : DeviceBuffer::from(w_.w1));
        if (w_.shape.mode == Mode::ffn)
          w2_.push_back(w_.shape.dtype == DType::fp8 ? DeviceBuffer::from(w_.w2_q) : DeviceBuffer::from(w_.w2));
      } else {
        w1_.push_back(w1_.front().clone());
        if (w_.shape.mode == Mode::ffn) w2_.push_back(w2_.front().clone());
      }
    }
  }
  const DeviceBuffer& w1(int c) const { return w1_[size_t(c)]; }
  const DeviceBuffer& w2(int c) const { return w2_[size_t(c)]; }

 private:
  const LayerWeights& w_;
  std::vector<DeviceBuffer> w1_, w2_;
};

// Streaming read over the routed experts' weight matrices (codes or bf16 values; the fp32 block
// scales add < 0.5 % and are left out of the read).
SolFigures measure_sol(const BenchOptions& opt, const Shape& s, const std::vector<int32_t>& counts,
                       const DeviceInfo& dev, GpuTimer& timer, DeviceWeights& weights, std::ostream& log) {
  SolFigures sol;
  std::vector<int32_t> hit;
  for (int32_t e = 0; e < int32_t(counts.size()); ++e)
    if (counts[size_t(e)] > 0) hit.push_back(e);
  const int64_t elem = s.dtype == DType::fp8 ? 1 : 2;
  ReadArgs base;
  if (s.mode == Mode::single) {
    base.group[0] = {nullptr, elem * s.inter * s.hidden, elem * s.inter * s.hidden};
    base.groups = 1;
  } else {
    base.group[0] = {nullptr, elem * 2 * s.inter * s.hidden, elem * 2 * s.inter * s.hidden};
    base.group[1] = {nullptr, elem * s.hidden * s.inter, elem * s.hidden * s.inter};
    base.groups = 2;
  }
  base.segments = int64_t(hit.size());
  const int64_t read_bytes = base.total_bytes();
  const ColdPlan cold = plan_cold_l2(read_bytes, dev.l2_bytes, opt.max_copies);
  weights.ensure_copies(cold.copies);
  DeviceBuffer ids = DeviceBuffer::from(hit);
  DeviceBuffer sink(sizeof(uint32_t));
  std::vector<ReadArgs> per_copy;
  for (int c = 0; c < cold.copies; ++c) {
    ReadArgs a = base;
    a.group[0].base = weights.w1(c).get();
    if (s.mode == Mode::ffn) a.group[1].base = weights.w2(c).get();
    a.seg_ids = ids.as<int32_t>();
    a.sink = sink.as<uint32_t>();
    per_copy.push_back(a);
  }
  log << "  SoL read: " << hit.size() << " experts, " << (read_bytes >> 20) << " MiB, L2 " << cold.str() << "\n";
  const ReadResult rr = measure_stream_read(timer, dev, per_copy, cold.mode, opt.timer);
  sol.read = rr.stats;
  sol.read_config = rr.config.str();
  sol.read_bytes = read_bytes;

  const std::vector<GemmShape> shapes = sol_gemm_shapes(s);
  const ColdPlan gcold = plan_cold_l2(DenseGemm::touched_bytes(s.dtype, shapes), dev.l2_bytes, opt.max_copies);
  DenseGemm gemm(s.dtype, shapes, gcold.copies, opt.seed);
  gemm.autotune(timer, 20);
  log << "  SoL GEMM: " << gemm.algo() << ", L2 " << gcold.str() << "\n";
  sol.gemm = timer.time([&](cudaStream_t st, int c) { gemm.enqueue(st, c); }, gcold.copies, gcold.mode, opt.timer);
  sol.gemm_algo = gemm.algo();
  sol.measured = true;
  return sol;
}

}  // namespace

std::vector<Record> run_bench(const BenchOptions& opt, std::ostream& log) {
  validate(opt.shape);
  validate(opt.routing, opt.shape);
  for (int64_t t : opt.tokens) {
    Shape s = opt.shape;
    s.tokens = t;
    validate(s);
  }
  std::string why_no_device;
  const std::optional<DeviceInfo> dev = query_device(&why_no_device);
  std::unique_ptr<GpuTimer> timer;
  if (dev) timer = std::make_unique<GpuTimer>(*dev);

  log << "generating weights (" << describe(opt.shape) << ", seed " << opt.seed << ")\n";
  const LayerWeights weights = make_weights(opt.shape, opt.seed);
  DeviceWeights device_weights(weights);

  std::vector<Record> records;
  for (int64_t t : opt.tokens) {
    Shape s = opt.shape;
    s.tokens = t;
    Record r;
    r.preset = opt.preset;
    r.shape = s;
    r.routing = opt.routing;
    r.distribution = to_string(opt.dist);
    r.seed = opt.seed;
    r.commit = build_commit();
    r.device = dev;
    const uint64_t batch_seed = opt.seed * 1000003ull + uint64_t(t);
    const Routes routes = make_routes(s, opt.routing, opt.dist, batch_seed);
    const std::vector<bf16> hidden = make_hidden(s, batch_seed);
    const std::vector<int32_t> counts = expert_counts(routes.topk, s.experts);
    r.work = layer_work(s, counts, opt.dist.kind == DistKind::random);
    log << "T=" << t << ": " << r.work.experts_hit << " experts hit\n";

    // The GPU kernels of the layer come with the seed-pipeline issue; until then the CPU
    // reference runs and its wall time is reported as CPU time only.
    r.path = "cpu-reference";
    r.config = "CPU reference (double accumulation); GPU layer kernels not built yet";
    if (t == 0) {
      r.note = "T=0: empty output, nothing launched";
      r.cpu_reference_ms = 0;
    } else if (r.work.flops / 1e9 > opt.max_cpu_gflop) {
      r.note = "CPU reference skipped: " + std::to_string(int64_t(r.work.flops / 1e9)) + " GFLOP exceeds --max-cpu-gflop";
    } else {
      const auto t0 = std::chrono::steady_clock::now();
      const LayerResult out = layer_ref(weights, hidden.data(), routes.topk);
      const auto t1 = std::chrono::steady_clock::now();
      r.cpu_reference_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
      if (out.out.size() != size_t(s.tokens * s.out_cols())) throw Error("CPU reference returned a wrong-sized output");
    }

    if (!dev) {
      r.sol.why_not = why_no_device;
    } else if (!opt.measure_sol) {
      r.sol.why_not = "disabled (--no-sol)";
    } else if (t == 0) {
      r.sol.why_not = "T=0";
    } else {
      r.sol = measure_sol(opt, s, counts, *dev, *timer, device_weights, log);
    }
    records.push_back(std::move(r));
  }
  return records;
}

}  // namespace loom::bench
