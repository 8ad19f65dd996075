#include "bench/dist/ep_bench.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <map>
#include <ostream>
#include <sstream>

#include "bench/device_buffer.hpp"
#include "bench/timer.hpp"
#include "common/bf16.hpp"
#include "common/build_info.hpp"
#include "common/cuda_check.hpp"
#include "common/device_info.hpp"
#include "dist/ep_routes_ref.hpp"
#include "dist/nccl/ep_stage.hpp"
#include "loom/dist.hpp"
#include "pipeline/moe_pipeline.hpp"
#include "pipeline/layer_ref.hpp"

namespace loom::bench {
namespace {

void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw Error(std::string("loom bench --ep: ") + what + ": " + ncclGetErrorString(r));
}

// One rank's row of the table.
struct RankRow {
  int rank = 0;
  int chunks = 1;
  int64_t tokens = 0;
  Stats e2e, local;
  double dispatch_us = -1, combine_us = -1;  // each stage alone (plans in one part); < 0: not timed
  double rel_err = -1;  // < 0: not checked
  double flops = 0;     // this rank's tokens: 6 T k H I
  uint32_t overflow = 0;
};

std::string to_line(const RankRow& r) {
  std::ostringstream s;
  s << std::setprecision(9) << r.rank << ' ' << r.chunks << ' ' << r.tokens << ' ' << r.e2e.median_us << ' '
    << r.e2e.p10_us << ' ' << r.e2e.p90_us << ' ' << r.local.median_us << ' ' << r.rel_err << ' ' << r.flops << ' '
    << r.overflow << ' ' << r.dispatch_us << ' ' << r.combine_us;
  return s.str();
}

std::string sci(double v) {
  if (v < 0) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.1e", v);
  return b;
}

RankRow from_line(const std::string& line) {
  std::istringstream s(line);
  RankRow r;
  if (!(s >> r.rank >> r.chunks >> r.tokens >> r.e2e.median_us >> r.e2e.p10_us >> r.e2e.p90_us >> r.local.median_us >>
        r.rel_err >> r.flops >> r.overflow >> r.dispatch_us >> r.combine_us))
    throw Error("loom bench --ep: a rank wrote an unreadable line: " + line);
  return r;
}

// A run's tokens and routes (logits, or ids with weights) on the device.
struct DeviceInputs {
  DeviceBuffer hidden, logits, bias, ids, weights;
  Inputs in;
  DeviceInputs(const Routes& routes, const std::vector<bf16>& h, int64_t tokens) {
    hidden = DeviceBuffer::from(h);
    in.tokens = tokens;
    in.hidden = hidden.get();
    if (!routes.logits.empty()) {
      logits = DeviceBuffer::from(routes.logits);
      in.router_logits = logits.as<float>();
      if (!routes.expert_bias.empty()) {
        bias = DeviceBuffer::from(routes.expert_bias);
        in.expert_bias = bias.as<float>();
      }
    } else {
      ids = DeviceBuffer::from(routes.topk.ids);
      weights = DeviceBuffer::from(routes.topk.weights);
      in.topk_ids = ids.as<int32_t>();
      in.topk_weights = weights.as<float>();
    }
  }
};

// The weights of a layer on the device (FP8 codes with their scales, or BF16 values).
struct DeviceWeights {
  DeviceBuffer w1, w2, s1, s2;
  explicit DeviceWeights(const LayerWeights& w) {
    const bool fp8 = w.shape.dtype == DType::fp8;
    w1 = fp8 ? DeviceBuffer::from(w.w1_q) : DeviceBuffer::from(w.w1);
    w2 = fp8 ? DeviceBuffer::from(w.w2_q) : DeviceBuffer::from(w.w2);
    if (fp8) {
      s1 = DeviceBuffer::from(w.w1_scales);
      s2 = DeviceBuffer::from(w.w2_scales);
    }
  }
  Weights view() const {
    Weights v;
    v.w1 = w1.get();
    v.w1_scales = s1.as<float>();
    v.w2 = w2.get();
    v.w2_scales = s2.as<float>();
    return v;
  }
};

// The one-GPU layer (every expert, the options given) on P T tokens: what the P ranks' T tokens
// each would take on one GPU.
Stats one_gpu(const LayerWeights& all, const BenchOptions& b, GpuTimer& timer, int64_t tokens) {
  Shape s = b.shape;
  s.tokens = tokens;
  const Plan p = plan(s, b.routing, b.layer);
  const DeviceWeights w(all);
  const uint64_t seed = b.seed * 1000003ull + uint64_t(tokens);
  const DeviceInputs d(make_routes(s, b.routing, b.dist, seed), make_hidden(s, seed), tokens);
  DeviceBuffer ws(workspace_bytes(p)), out(size_t(tokens * s.hidden) * 2);
  return timer.time([&](cudaStream_t st, int) { run(p, w.view(), d.in, out.get(), ws.get(), st); }, 1, L2Mode::flush,
                    b.timer);
}

// One token count on one plan: the output checked against the CPU reference where affordable, then
// the whole run and the local experts alone timed.
RankRow measure(const EpPlan& p, void* ws, const LayerWeights& all, const Weights& lw, const BenchOptions& b,
                GpuTimer& timer, ncclComm_t comm, int rank, int64_t t) {
  Shape s = b.shape;
  s.tokens = t;
  RankRow row;
  row.rank = rank;
  row.chunks = p.chunks;
  row.tokens = t;
  row.flops = 6.0 * double(t) * double(s.topk) * double(s.hidden) * double(s.inter);
  const uint64_t seed = b.seed * 1000003ull + uint64_t(t) + 7919ull * uint64_t(rank + 1);  // each rank its own tokens
  const Routes routes = make_routes(s, b.routing, b.dist, seed);
  const std::vector<bf16> hidden = make_hidden(s, seed);
  const DeviceInputs d(routes, hidden, t);
  const Inputs& in = d.in;
  DeviceBuffer dout(size_t(std::max<int64_t>(1, t * s.hidden)) * 2);
  LOOM_CUDA_CHECK(cudaMemsetAsync(dout.get(), 0xff, dout.bytes(), timer.stream()));
  run_ep(p, lw, in, dout.get(), ws, comm, timer.stream());
  LOOM_CUDA_CHECK(cudaStreamSynchronize(timer.stream()));
  row.overflow = read_status(p, ws, timer.stream()).overflow_routes;
  if (b.check && t > 0 && row.flops / 1e9 <= b.max_cpu_gflop) {
    // The one-GPU reference of these tokens (route rows rounded to bf16: the deterministic rule).
    const LayerResult ref = layer_ref(all, hidden.data(), routes.topk, nullptr, true);
    const std::vector<uint16_t> bits = dout.to_host<uint16_t>();
    std::vector<float> got(size_t(t * s.hidden));
    for (size_t i = 0; i < got.size(); ++i) got[i] = bf16_to_float(bf16{bits[i]});
    row.rel_err = relative_error(got.data(), ref.out.data(), t, s.hidden).overall;
  }
  // Every rank replays as often as the others (the NCCL calls in the graphs pair up).
  row.e2e = timer.time([&](cudaStream_t st, int) { run_ep(p, lw, in, dout.get(), ws, comm, st); }, 1,
                       L2Mode::flush, b.timer);
  // The dispatch (routing, the send kernels, the rows' exchange) and the combine (the outputs'
  // exchange back, the combine) alone, on what the last run left; every rank times the same stage
  // together.
  if (p.chunks == 1) {
    for (const EpStage stage : {EpStage::dispatch, EpStage::combine}) {
      const Stats st = timer.time(
          [&](cudaStream_t str, int) { run_ep_stage(p, lw, in, dout.get(), ws, comm, str, stage); }, 1,
          L2Mode::flush, b.timer);
      (stage == EpStage::dispatch ? row.dispatch_us : row.combine_us) = st.median_us;
    }
  }
  // The local experts alone, part after part on the rows the last run received (the local
  // plan's own workspace).
  const EpPlan::Layout& L = p.layout;
  auto* base = static_cast<uint8_t*>(ws);
  const int64_t part = p.local.shape.tokens;
  const bool fp8 = s.dtype == DType::fp8;  // the rows came as codes and scales
  const int64_t row_bytes = fp8 ? s.hidden : 2 * s.hidden, groups = (s.hidden + 127) / 128;
  row.local = timer.time(
      [&](cudaStream_t st, int) {
        for (int c = 0; c < p.chunks; ++c) {
          Inputs li;
          li.tokens = part;
          QuantisedHidden qh;
          qh.codes = base + L.recv_x + size_t(c * part * row_bytes);
          qh.scales = reinterpret_cast<const float*>(base + L.recv_scales) + c * part * groups;
          li.hidden = fp8 ? nullptr : base + L.recv_x + size_t(c * part * row_bytes);
          li.topk_ids = reinterpret_cast<const int32_t*>(base + L.recv_ids) + c * part * s.topk;
          li.topk_weights = reinterpret_cast<const float*>(base + L.recv_w) + c * part * s.topk;
          run_stages(p.local, lw, li, base + L.out_local + size_t(c * part * s.hidden) * 2, base + L.local, st,
                     Stages::all, nullptr, fp8 ? &qh : nullptr);
        }
      },
      1, L2Mode::flush, b.timer);
  return row;
}

}  // namespace

void run_ep_bench_rank(const EpBenchOptions& opt, int rank, const std::string& id_file, const std::string& out_file,
                       std::ostream& log) {
  setenv("NCCL_NVLS_ENABLE", "0", 1);  // NVLink multicast off (the device machines' rule)
  LOOM_CUDA_CHECK(cudaSetDevice(rank));
  ncclUniqueId id;
  {
    std::ifstream f(id_file, std::ios::binary);
    if (!f.read(reinterpret_cast<char*>(&id), sizeof id)) throw Error("loom bench --ep: cannot read " + id_file);
  }
  ncclComm_t comm = nullptr;
  nccl_check(ncclCommInitRank(&comm, opt.ranks, id, rank), "ncclCommInitRank");
  std::string why;
  const auto dev = query_device(&why);
  if (!dev) throw Error("loom bench --ep: rank " + std::to_string(rank) + ": " + why);
  GpuTimer timer(*dev);

  const BenchOptions& b = opt.base;
  const LayerWeights all = make_weights(b.shape, b.seed, b.weight_values);  // every rank: the same weights
  ExpertParallel ep;
  ep.size = opt.ranks;
  ep.rank = rank;
  ep.comm_sms = opt.comm_sms;
  const dist::EpConfig placement_of{opt.ranks, rank, -1, -1, {}};
  const LayerWeights mine =
      dist::slice_experts(all, dist::make_placement(b.shape.experts, placement_of).local_experts);
  const DeviceWeights local(mine);
  const Weights lw = local.view();
  std::ofstream out(out_file);
  // A plan per token count, as a caller would make one per regime (decode, prefill): a run moves
  // and computes its plan's whole segments, so a plan for more tokens costs more at every T.
  for (const int chunks : opt.chunks)
    for (const int64_t t : b.tokens) {
      ep.chunks = chunks;
      ep.rows_per_peer = std::min(opt.rows_per_peer, std::max<int64_t>(t, 1) * b.shape.topk);
      ep.tokens_per_peer = std::min(opt.tokens_per_peer, std::max<int64_t>(t, 1));
      Shape s = b.shape;
      s.tokens = std::max<int64_t>(t, 1);
      const EpPlan p = plan_ep(s, b.routing, b.layer, ep);
      DeviceBuffer ws(workspace_bytes(p));
      log << "rank " << rank << ": " << describe(p).substr(0, describe(p).find('\n')) << "\n";
      out << to_line(measure(p, ws.get(), all, lw, b, timer, comm, rank, t)) << "\n" << std::flush;
    }
  nccl_check(ncclCommDestroy(comm), "ncclCommDestroy");
  if (rank == 0)  // after the exchanges: the other ranks are done with their GPUs
    for (const int64_t t : b.tokens) {
      if (t < 1) continue;
      const Stats one = one_gpu(all, b, timer, int64_t(opt.ranks) * t);
      out << std::setprecision(9) << "one " << t << ' ' << one.median_us << ' ' << one.p10_us << ' ' << one.p90_us
          << "\n" << std::flush;
    }
}

std::string run_ep_bench(const EpBenchOptions& opt, const std::string& self, const std::vector<std::string>& argv,
                         std::ostream& log) {
  std::string why;
  if (!query_device(&why)) throw Error("loom bench --ep: no usable GPU (" + why + ")");
  int gpus = 0;
  LOOM_CUDA_CHECK(cudaGetDeviceCount(&gpus));
  if (opt.ranks < 1 || opt.ranks > gpus)
    throw Error("loom bench --ep " + std::to_string(opt.ranks) + ": this machine has " + std::to_string(gpus) +
                " GPU(s); one rank a GPU");
  char dir_template[] = "/tmp/loom-ep-XXXXXX";
  const char* dir = mkdtemp(dir_template);
  if (!dir) throw Error("loom bench --ep: cannot make a temporary directory");
  const std::string id_file = std::string(dir) + "/nccl-id";
  {
    ncclUniqueId id;
    nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    std::ofstream f(id_file, std::ios::binary);
    f.write(reinterpret_cast<const char*>(&id), sizeof id);
    if (!f) throw Error("loom bench --ep: cannot write " + id_file);
  }
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  std::vector<pid_t> pids;
  for (int r = 0; r < opt.ranks; ++r) {
    std::vector<std::string> args{self, "bench"};
    args.insert(args.end(), argv.begin(), argv.end());
    for (const std::string& extra : {std::string("--ep-rank"), std::to_string(r), std::string("--ep-id"), id_file,
                                     std::string("--ep-out"), std::string(dir) + "/rank" + std::to_string(r)})
      args.push_back(extra);
    std::vector<char*> cargs;
    for (std::string& a : args) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    const pid_t pid = fork();
    if (pid < 0) throw Error("loom bench --ep: fork failed");
    if (pid == 0) {
      execv(self.c_str(), cargs.data());
      _exit(127);
    }
    pids.push_back(pid);
  }
  std::string failed;
  for (int r = 0; r < opt.ranks; ++r) {
    int status = 0;
    waitpid(pids[size_t(r)], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed += " " + std::to_string(r);
  }
  if (!failed.empty()) throw Error("loom bench --ep: rank(s)" + failed + " failed (their errors are above)");

  std::vector<RankRow> rows;
  std::map<int64_t, Stats> one;  // T per rank -> the one-GPU layer on P T tokens
  for (int r = 0; r < opt.ranks; ++r) {
    std::ifstream f(std::string(dir) + "/rank" + std::to_string(r));
    for (std::string line; std::getline(f, line);) {
      if (line.rfind("one ", 0) == 0) {
        std::istringstream l(line.substr(4));
        int64_t t = 0;
        Stats st;
        if (!(l >> t >> st.median_us >> st.p10_us >> st.p90_us))
          throw Error("loom bench --ep: rank 0 wrote an unreadable line: " + line);
        one[t] = st;
      } else if (!line.empty()) {
        rows.push_back(from_line(line));
      }
    }
  }
  const Shape& s = opt.base.shape;
  std::ostringstream t;
  const std::string shape = describe(s);  // "T=... H=...": T is each row's own here
  t << "expert parallelism: " << opt.ranks << " rank(s), one GPU and process each; "
    << shape.substr(shape.find(' ') + 1) << "; " << describe(opt.base.routing) << ", dist "
    << to_string(opt.base.dist) << "; "
    << (opt.base.layer.deterministic ? "deterministic (a row back per route, summed in slot order)"
                                     : "owners sum their routes (a row back per token and owner)")
    << "; graph replays, L2 flushed, median of " << opt.base.timer.reps << " [p10, p90], us; commit "
    << build_commit() << "\n";
  t << "each timed alone: dispatch (routing, the send kernels, the rows' exchange), local (the rank's own\n"
       "experts on the rows it received), combine (the outputs' exchange back, the combine; in parts the\n"
       "stages overlap: '-'); parts: the exchange and the local experts in that many chunks, overlapped\n"
       "(1: unsplit); one GPU: the layer on P T tokens with every expert on one GPU, and how much faster\n"
       "the P ranks' slowest is\n";
  char line[256];
  std::snprintf(line, sizeof line, "%8s %5s %5s %26s %9s %9s %9s %9s %9s %9s\n", "T/rank", "parts", "rank",
                "e2e [p10, p90]", "dispatch", "local", "combine", "overflow", "rel-err", "TFLOP/s");
  t << line;
  for (const int chunks : opt.chunks) {
    for (const int64_t tok : opt.base.tokens) {
      double slowest = 0, flops = 0;
      for (const RankRow& r : rows) {
        if (r.tokens != tok || r.chunks != chunks) continue;
        std::ostringstream e2e;
        e2e << std::fixed << std::setprecision(1) << r.e2e.median_us << " [" << r.e2e.p10_us << ", " << r.e2e.p90_us
            << "]";
        auto us = [](double v) {
          char b[32];
          std::snprintf(b, sizeof b, v < 0 ? "-" : "%.1f", v);
          return std::string(b);
        };
        std::snprintf(line, sizeof line, "%8lld %5d %5d %26s %9s %9.1f %9s %9u %9s %9.1f\n", (long long)tok, chunks,
                      r.rank, e2e.str().c_str(), us(r.dispatch_us).c_str(), r.local.median_us,
                      us(r.combine_us).c_str(), r.overflow, sci(r.rel_err).c_str(), r.flops / r.e2e.median_us / 1e6);
        t << line;
        slowest = std::max(slowest, r.e2e.median_us);
        flops += r.flops;
      }
      std::snprintf(line, sizeof line, "%8lld %5d %5s %26.1f %9s %9s %9s %9s %9s %9.1f\n", (long long)tok, chunks,
                    "all", slowest, "", "", "", "", "", slowest > 0 ? flops / slowest / 1e6 : 0.0);
      t << line;
      if (one.count(tok) && slowest > 0) {
        const Stats& o = one[tok];
        std::snprintf(line, sizeof line, "%8lld %5d %5s %26s %9s %9s %9s %9s %9s %9.1f  (%.2fx one GPU)\n",
                      (long long)tok, chunks, "one",
                      (std::to_string(int64_t(o.median_us + 0.5)) + " [P T tokens]").c_str(), "", "", "", "", "",
                      flops / o.median_us / 1e6, o.median_us / slowest);
        t << line;
      }
    }
  }
  log << "loom bench --ep: rank outputs in " << dir << "\n";
  return t.str();
}

}  // namespace loom::bench
