#include "bench/peaks.hpp"

#include <cstdio>
#include <ostream>
#include <sstream>

#include "bench/device_buffer.hpp"
#include "bench/fill_random.cuh"
#include "bench/metrics.hpp"
#include "bench/sol_gemm.hpp"
#include "bench/sol_read.hpp"
#include "common/build_info.hpp"
#include "common/json.hpp"

namespace loom::bench {

std::pair<std::string, std::string> run_peaks(const PeaksOptions& opt, std::ostream& log) {
  std::string why;
  const auto dev = query_device(&why);
  if (!dev) throw Error("loom peaks needs a GPU: " + why);
  GpuTimer timer(*dev);
  json::Writer js;
  js.begin_object().field("tool", "loom peaks").field("commit", build_commit()).field("device", dev->name);
  js.field("sm_count", dev->sm_count).field("l2_bytes", dev->l2_bytes);
  std::ostringstream table;
  table << "loom peaks: " << dev->name << ", " << dev->sm_count << " SMs, L2 " << (dev->l2_bytes >> 20)
        << " MiB, commit " << build_commit() << "\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-28s %10s %10s %10s %12s  %s\n", "measurement", "median", "p10", "p90", "rate",
                "config");
  table << line;

  js.key("read").begin_array();
  for (int64_t mib : {1024, 256}) {
    const int64_t bytes = mib << 20;
    const ColdPlan cold = plan_cold_l2(bytes, dev->l2_bytes, 4);
    std::vector<DeviceBuffer> copies;
    for (int c = 0; c < cold.copies; ++c) {
      copies.emplace_back(size_t(bytes));
      fill_random_e4m3(copies.back().get(), bytes, uint64_t(c + 1), timer.stream());
    }
    DeviceBuffer ids = DeviceBuffer::from(std::vector<int32_t>{0});
    DeviceBuffer sink(4);
    std::vector<ReadArgs> per_copy;
    for (auto& c : copies) {
      ReadArgs a;
      a.group[0] = {c.get(), 0, bytes};
      a.seg_ids = ids.as<int32_t>();
      a.segments = 1;
      a.sink = sink.as<uint32_t>();
      per_copy.push_back(a);
    }
    log << "read " << mib << " MiB (L2 " << cold.str() << ")\n";
    const ReadResult r = measure_stream_read(timer, *dev, per_copy, cold.mode, opt.timer);
    const double tbps = double(bytes) / (r.stats.median_us * 1e6);
    std::snprintf(line, sizeof line, "%-28s %8.1fus %8.1fus %8.1fus %8.2f TB/s  %s, L2 %s\n",
                  ("read " + std::to_string(mib) + " MiB").c_str(), r.stats.median_us, r.stats.p10_us,
                  r.stats.p90_us, tbps, r.config.str().c_str(), cold.str().c_str());
    table << line;
    js.begin_object().field("bytes", bytes).field("median_us", r.stats.median_us).field("p10_us", r.stats.p10_us);
    js.field("p90_us", r.stats.p90_us).field("tb_per_s", tbps).field("config", r.config.str());
    js.field("l2", r.stats.l2).end_object();
  }
  js.end_array();

  // The device copy rate (a device-to-device copy; read and written bytes both counted): the rate
  // `loom bench` holds the glue to, as a copy of the glue's bytes.
  {
    const int64_t bytes = int64_t(1) << 30;
    DeviceBuffer src{size_t(bytes)}, dst{size_t(bytes)};
    fill_random_e4m3(src.get(), bytes, 9, timer.stream());
    log << "copy 1024 MiB\n";
    const Stats s = timer.time(
        [&](cudaStream_t st, int) {
          LOOM_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), size_t(bytes), cudaMemcpyDeviceToDevice, st));
        },
        1, L2Mode::flush, TimerOptions{std::min(opt.timer.reps, 100), 5});
    const double tbps = 2.0 * double(bytes) / (s.median_us * 1e6);
    std::snprintf(line, sizeof line, "%-28s %8.1fus %8.1fus %8.1fus %8.2f TB/s  read + write, cudaMemcpyAsync\n",
                  "copy 1024 MiB", s.median_us, s.p10_us, s.p90_us, tbps);
    table << line;
    js.key("copy").begin_object().field("bytes", bytes).field("median_us", s.median_us).field("tb_per_s", tbps);
    js.end_object();
  }

  js.key("gemm").begin_array();
  for (DType dt : {DType::fp8, DType::bf16}) {
    const int64_t n = opt.gemm_size;
    DenseGemm g(dt, {{n, n, n}}, 1, 7);
    log << "dense " << to_string(dt) << " GEMM " << n << "^3: autotuning\n";
    g.autotune(timer, 10);
    const Stats s = timer.time([&](cudaStream_t st, int c) { g.enqueue(st, c); }, 1, L2Mode::warm,
                               TimerOptions{std::min(opt.timer.reps, 100), 5});
    const double tflops = g.flops() / (s.median_us * 1e6);
    std::snprintf(line, sizeof line, "%-28s %8.1fus %8.1fus %8.1fus %7.0f TFLOP/s  %s (%.0f%% of %.0f)\n",
                  ("dense " + std::string(to_string(dt)) + " GEMM " + std::to_string(n) + "^3").c_str(), s.median_us,
                  s.p10_us, s.p90_us, tflops, g.algo().c_str(), 100 * tflops / peak_tflops(dt), peak_tflops(dt));
    table << line;
    js.begin_object().field("dtype", to_string(dt)).field("size", n).field("median_us", s.median_us);
    js.field("tflops", tflops).field("algo", g.algo()).end_object();
  }
  js.end_array();
  js.end_object();
  return {table.str(), js.str() + "\n"};
}

}  // namespace loom::bench
