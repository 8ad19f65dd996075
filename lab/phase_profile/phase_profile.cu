#include "phase_profile/phase_profile.cuh"

#include <cstdio>
#include <utility>
#include <vector>

#include "bench/device_buffer.hpp"
#include "bench/timer.hpp"
#include "common/cuda_check.hpp"
#include "common/device_info.hpp"
#include "gemm/kernel/fp8_tokens_on_m_kernel.cuh"
#include "loom/loom.hpp"
#include "pipeline/moe_pipeline.hpp"
#include "ptx/clock.cuh"
#include "workload/workload.hpp"

namespace loom::lab {

namespace {

using namespace gemm::tokens_on_m;

// Rows: consumer warpgroups 0 and 1, the weight producer, the combine warp.
__device__ unsigned long long g_phase[4][kPhCount];

// The probe: the SM's cycle counter at each point, summed per phase by one thread a role, added
// into its row of g_phase at the role's end.
struct PhaseProbe {
  using Sums = uint32_t[kPhCount];
  static __device__ __forceinline__ uint32_t clock() { return ptx::clock32(); }
  static __device__ __forceinline__ uint32_t clock_after(uint32_t x0, uint32_t x1, uint32_t x2, uint32_t x3) {
    return ptx::clock32_after(x0, x1, x2, x3);
  }
  static __device__ __forceinline__ uint64_t nanos() { return ptx::globaltimer(); }
  static __device__ __forceinline__ void add(Sums& s, int i, uint32_t v) { s[i] += v; }
  static __device__ __forceinline__ void set(Sums& s, int i, uint32_t v) { s[i] = v; }
  static __device__ __forceinline__ void flush(int row, const Sums& s) {
    for (int i = 0; i < kPhCount; ++i)
      if (s[i] != 0) atomicAdd(&g_phase[row][i], (unsigned long long)s[i]);
  }
};

using ProfiledTall = gemm::TokensOnMKernel<false, PhaseProbe>;
using ProfiledWide = gemm::TokensOnMKernel<true, PhaseProbe>;

void print_phases(std::ostream& log, int kblocks) {
  unsigned long long v[4][kPhCount];
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  LOOM_CUDA_CHECK(cudaMemcpyFromSymbol(v, g_phase, sizeof v));
  const double ctas = double(v[2][kPhCtas]);
  if (ctas == 0) throw Error("phase profile: the profiled kernel did not run");
  auto per_cta = [&](int row, int ph) { return double(v[row][ph]) / ctas; };
  auto ratio = [](double num, double den) { return den > 0 ? num / den : 0.0; };
  char line[320];
  log << "phase profile of the tokens-on-M GEMM (" << ctas << " CTA launches; cycles per CTA launch unless stated):\n";
  std::snprintf(line, sizeof line, "  %-44s %12s %12s\n", "consumer warpgroup", "0", "1");
  log << line;
  const std::pair<const char*, int> rows[] = {
      {"total", kPhTotal},           {"units computed", kPhUnits},  {"units passed (no rows)", kPhIdleUnits},
      {"unit starts", kPhUnitStart}, {"K loops", kPhKLoop},          {"epilogues", kPhEpilogue},
      {"... waits for the staging block", kPhOutWait}, {"passed units", kPhIdle}};
  for (const auto& [name, ph] : rows) {
    std::snprintf(line, sizeof line, "  %-44s %12.1f %12.1f\n", name, per_cta(0, ph), per_cta(1, ph));
    log << line;
  }
  log << "  per K block computed (cycles):\n";
  const std::pair<const char*, int> steps[] = {{"full-barrier wait", kPhFullWait}, {"A fragments ready", kPhFragments},
                                               {"MMAs issued", kPhMmaIssue},        {"ring refill issued", kPhReload},
                                               {"MMAs complete", kPhMmaWait},       {"promotion", kPhPromote}};
  for (const auto& [name, ph] : steps) {
    std::snprintf(line, sizeof line, "    %-42s %12.0f %12.0f\n", name,
                  ratio(double(v[0][ph]), double(v[0][kPhUnits]) * kblocks),
                  ratio(double(v[1][ph]), double(v[1][kPhUnits]) * kblocks));
    log << line;
  }
  for (int tall = 1; tall >= 0; --tall) {
    double out[2];
    for (int c = 0; c < 2; ++c) {
      const double loop = tall ? double(v[c][kPhKLoopTall]) : double(v[c][kPhKLoop] - v[c][kPhKLoopTall]);
      const double units = tall ? double(v[c][kPhUnitsTall]) : double(v[c][kPhUnits] - v[c][kPhUnitsTall]);
      out[c] = ratio(loop, units * kblocks);
    }
    std::snprintf(line, sizeof line, "    %-42s %12.0f %12.0f\n",
                  tall ? "K loop, units of > 64 rows" : "K loop, units of <= 64 rows", out[0], out[1]);
    log << line;
  }
  std::snprintf(line, sizeof line,
                "  weight producer: total %.1f, waiting for a free stage %.1f, %.1f stages; combine warp: %.1f "
                "blocks, waiting for one %.1f, for its reductions to read it %.1f\n",
                per_cta(2, kPhTotal), per_cta(2, kPhEmptyWait), per_cta(2, kPhStages), per_cta(3, kPhBlocks),
                per_cta(3, kPhCombineWait), per_cta(3, kPhCombineRead));
  log << line;
  std::snprintf(line, sizeof line, "  weight producer: %.2f us per CTA by the global timer, so %.3f GHz (cycles / ns)\n",
                per_cta(2, kPhNanos) / 1000.0, ratio(double(v[2][kPhTotal]), double(v[2][kPhNanos])));
  log << line;
}

}  // namespace

void run_phase_profile(const PhaseProfileOptions& opt, std::ostream& log) {
  std::string why;
  const auto dev = query_device(&why);
  if (!dev) throw Error("phase profile needs a GPU: " + why);
  const Preset& preset = find_preset(opt.preset);
  Shape s = preset.shape;
  s.tokens = opt.tokens;
  validate(s);
  const Routes routes = make_routes(s, preset.routing, Distribution{}, opt.seed);
  const std::vector<bf16> hidden = make_hidden(s, opt.seed);
  const LayerWeights w = make_weights(s, opt.seed);
  bench::DeviceBuffer d_hidden = bench::DeviceBuffer::from(hidden), d_logits = bench::DeviceBuffer::from(routes.logits);
  bench::DeviceBuffer d_w = bench::DeviceBuffer::from(w.w1_q), d_ws_scales = bench::DeviceBuffer::from(w.w1_scales);
  const Plan plan = loom::plan(s, preset.routing);
  bench::DeviceBuffer d_out(size_t(s.tokens * s.out_cols()) * 4), d_ws(workspace_bytes(plan));
  Weights weights{d_w.get(), d_ws_scales.as<float>()};
  Inputs in;
  in.tokens = s.tokens;
  in.hidden = d_hidden.get();
  in.router_logits = d_logits.as<float>();
  // One full product run prepares the workspace (layout, quantised rows) the profiled GEMM reads.
  run(plan, weights, in, d_out.get(), d_ws.get(), nullptr);
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  const GemmLaunch g = gemm_launch_for(plan, weights, in, d_out.get(), d_ws.get());
  const auto* config = std::get_if<TokensOnMConfig>(&g.config);
  if (!config)
    throw Error("phase profile: T=" + std::to_string(s.tokens) + " does not run the tokens-on-M kernel (" +
                key(g.config) + ")");
  const gemm::TokensOnMLaunch l = gemm::make_tokens_on_m_launch(g.params, *config);
  static const unsigned long long zero[4][kPhCount] = {};
  LOOM_CUDA_CHECK(cudaMemcpyToSymbol(g_phase, zero, sizeof zero));
  bench::GpuTimer timer(*dev);
  for (int r = 0; r < opt.runs; ++r) {
    timer.flush_l2(timer.stream());
    if (config->wide)
      gemm::launch_grouped_gemm<ProfiledWide>(l.map, l.args, dev->sm_count, gemm::launch_smem_bytes<ProfiledWide>,
                                              timer.stream(), false);
    else
      gemm::launch_grouped_gemm<ProfiledTall>(l.map, l.args, dev->sm_count, gemm::launch_smem_bytes<ProfiledTall>,
                                              timer.stream(), false);
  }
  LOOM_CUDA_CHECK(cudaStreamSynchronize(timer.stream()));
  log << "preset " << opt.preset << ", T=" << s.tokens << ", " << opt.runs << " cold launches of " << key(g.config)
      << "\n";
  print_phases(log, int(s.hidden / 128));
}

}  // namespace loom::lab
