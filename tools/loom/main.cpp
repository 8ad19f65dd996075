// loom: benchmark, peaks and plan inspection for the loom MoE kernels.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "args.hpp"
#include "bench/bench.hpp"
#ifdef LOOM_HAVE_DIST
#include "bench/dist/ep_bench.hpp"
#include "loom/dist.hpp"
#endif
#include "bench/peaks.hpp"
#include "common/build_info.hpp"
#include "diag/chain_trace.cuh"
#include "common/device_info.hpp"
#include "loom/loom.hpp"
#include "workload/workload.hpp"

namespace {

using loom::Error;
using loom::cli::Args;

constexpr const char* kUsage = R"(loom - fused MoE kernels for Hopper: benchmark and tools

usage:
  loom bench [options]   time the MoE layer on a workload (default: --preset qwen35-single)
  loom peaks [options]   measure the device's read and copy bandwidth and dense GEMM rates
  loom info [options]    show the device and the plan loom would use for a shape: what each range
                         of token counts launches, and the GEMM configs; --device h200|h100 plans
                         for a described device (no GPU needed), --gemm-config and
                         --gemm2-config KEY as in bench; --ep N [--ep-rank r --tokens-per-peer N
                         --rows-per-peer R --ep-chunks C --comm-sms S] one rank's expert-parallel
                         plan
  loom help              this text

workload options (bench, info):
  --preset NAME          qwen35-single | qwen35-layer | h200-bf16
  --tokens T[,T...]      token counts (one measurement each); --sweep for 1,8,32,128,512,2048,8192
  --hidden H  --inter I  widths (single mode: K = hidden, N = inter); multiples of 16
  --experts E --topk k   expert count and experts per token
  --mode single|ffn      --dtype fp8|bf16
  --dist SPEC            random | balanced | zipf:S | hot:P | concentrated | replay:FILE
  --scoring softmax|sigmoid  --softcap C  --no-renorm  --n-group G  --topk-group G  --routed-scale S
  --seed N               generator seed (default 1)
bench options:
  --reps N (default 500)  --warmup N (default 20)  --json FILE  --csv FILE  --no-sol
  --max-copies N         input copies for cold-L2 rotation (default 8)
  --max-cpu-gflop G      skip the CPU reference above this size (default 40)
  --deterministic        bitwise-reproducible combine (no float atomics)
  --no-pdl --eager --no-fuse   switch off programmatic dependent launch / graph replay (time
                         eager launches) / the fused small-batch route+dispatch kernels
  --no-bins              the count and dispatch kernels instead of the routing's expert bins
                         (register-loaded GEMM batches, and gathering ones above 32 tokens)
  --gemm-config KEY      run every batch on this GEMM config (a key `loom info` lists, e.g.
                         tM.tall.s4.bulk.dyn) instead of the chooser's (ffn: GEMM 1's; bf16:
                         bf16.tM.128x256 or bf16.wM.64x64, both GEMMs)
  --gemm2-config KEY     ffn: GEMM 2's config (wM.sorted... or tM.<tall|wide>.sorted...)
  --weights uniform|normal  the expert weights' values (default uniform; normal has heavier tails)
  --dist-logits          run a distribution of ids (balanced, zipf, hot, ...) from router logits
                         whose softmax top-k are those ids, through the routing kernel
  --no-check             skip the comparison of the GPU output with the CPU reference
  --trace-chain N        after timing, N cold graph replays whose kernels stamp the time of each
                         traced point; prints the medians (a -DLOOM_CHAIN_TRACE=ON build only)
  --ep N                 expert parallelism over N GPUs, one process a rank (a build with NCCL):
                         the ffn layer with each rank's own T tokens, its e2e, and its dispatch,
                         local experts and combine each alone; --tokens-per-peer N and
                         --rows-per-peer R set the caps of token rows sent to and route outputs
                         returned from one peer; --deterministic a row back per route;
                         --ep-chunks C[,C...] times each part count in turn (the exchange of one part
                         overlapping the GEMMs of another; default 1) and --comm-sms S the SMs the
                         local GEMMs leave to NCCL when parted (default 16)
                         (--ep-rank, --ep-id, --ep-out: what the ranks are started with)
)";

const std::set<std::string> kWorkloadFlags = {"preset", "tokens",  "hidden",     "inter",      "experts",
                                              "topk",   "mode",    "dtype",      "dist",       "scoring",
                                              "softcap", "n-group", "topk-group", "routed-scale", "seed"};

struct Workload {
  std::string preset;
  loom::Shape shape;
  loom::Routing routing;
  std::vector<int64_t> tokens;
  loom::Distribution dist;
  uint64_t seed = 1;
};

Workload parse_workload(const Args& a) {
  Workload w;
  w.preset = a.str("preset", "qwen35-single");
  const loom::Preset& p = loom::find_preset(w.preset);
  w.shape = p.shape;
  w.routing = p.routing;
  bool custom = false;
  auto override_int = [&](const char* flag, int64_t& field) {
    if (a.has(flag)) {
      field = a.integer(flag, 0);
      custom = true;
    }
  };
  override_int("hidden", w.shape.hidden);
  override_int("inter", w.shape.inter);
  override_int("experts", w.shape.experts);
  override_int("topk", w.shape.topk);
  if (a.has("mode")) w.shape.mode = loom::parse_mode(a.str("mode", "")), custom = true;
  if (a.has("dtype")) w.shape.dtype = loom::parse_dtype(a.str("dtype", "")), custom = true;
  if (a.has("scoring")) w.routing.scoring = loom::parse_scoring(a.str("scoring", ""));
  w.routing.softcap = float(a.number("softcap", w.routing.softcap));
  if (a.has("no-renorm")) w.routing.renormalize = false;
  w.routing.n_group = int(a.integer("n-group", w.routing.n_group));
  w.routing.topk_group = int(a.integer("topk-group", w.routing.topk_group));
  w.routing.scale = float(a.number("routed-scale", w.routing.scale));
  if (custom) w.preset += "+custom";
  w.dist = loom::parse_distribution(a.str("dist", "random"));
  const int64_t seed = a.integer("seed", 1);
  if (seed < 0) throw Error("--seed must be >= 0");
  w.seed = uint64_t(seed);
  if (a.has("sweep") && a.has("tokens")) throw Error("give --tokens or --sweep, not both");
  w.tokens = a.has("sweep") ? std::vector<int64_t>{1, 8, 32, 128, 512, 2048, 8192}
             : a.has("tokens") ? a.integer_list("tokens")
                               : std::vector<int64_t>{p.shape.tokens};
  loom::validate(w.shape);
  loom::validate(w.routing, w.shape);
  for (int64_t t : w.tokens) {
    loom::Shape s = w.shape;
    s.tokens = t;
    loom::validate(s);
    // A bad replay file is reported before any work starts.
    if (w.dist.kind == loom::DistKind::replay) loom::read_replay_counts(w.dist.file, t, s.topk, s.experts);
  }
  return w;
}

std::vector<std::string> rest(int argc, char** argv) { return std::vector<std::string>(argv + 2, argv + argc); }

int cmd_bench(int argc, char** argv) {
  std::set<std::string> valued = kWorkloadFlags;
  valued.insert({"reps", "warmup", "json", "csv", "max-copies", "max-cpu-gflop", "trace-chain", "gemm-config",
                 "gemm2-config", "weights", "ep", "rows-per-peer", "tokens-per-peer", "ep-chunks", "comm-sms",
                 "ep-rank", "ep-id", "ep-out"});
  const Args a(rest(argc, argv), valued,
               {"no-renorm", "sweep", "no-sol", "deterministic", "no-pdl", "eager", "no-check", "no-fuse", "no-bins",
                "dist-logits"});
  const Workload w = parse_workload(a);
  loom::bench::BenchOptions opt;
  opt.preset = w.preset;
  opt.shape = w.shape;
  opt.routing = w.routing;
  opt.tokens = w.tokens;
  opt.dist = w.dist;
  opt.dist_logits = a.has("dist-logits");
  const std::string values = a.str("weights", "uniform");
  if (values != "uniform" && values != "normal") throw Error("--weights must be uniform or normal, got '" + values + "'");
  opt.weight_values = values == "normal" ? loom::WeightValues::normal : loom::WeightValues::uniform;
  opt.seed = w.seed;
  opt.timer.reps = int(a.integer("reps", 500));
  opt.timer.warmup = int(a.integer("warmup", 20));
  if (opt.timer.reps < 1) throw Error("--reps must be >= 1");
  if (opt.timer.warmup < 0) throw Error("--warmup must be >= 0");
  opt.measure_sol = !a.has("no-sol");
  opt.max_copies = int(a.integer("max-copies", 8));
  if (opt.max_copies < 1) throw Error("--max-copies must be >= 1");
  opt.max_cpu_gflop = a.number("max-cpu-gflop", 40);
  opt.layer.deterministic = a.has("deterministic");
  opt.layer.pdl = !a.has("no-pdl");
  opt.layer.fuse_small_batch = !a.has("no-fuse");
  opt.layer.expert_bins = !a.has("no-bins");
  opt.layer.gemm_config = a.str("gemm-config", "");
  opt.layer.gemm2_config = a.str("gemm2-config", "");
  opt.timer.graph = !a.has("eager");
  opt.check = !a.has("no-check");
  opt.trace_chain = int(a.integer("trace-chain", 0));
  if (opt.trace_chain < 0) throw Error("--trace-chain must be >= 0");
  if (opt.trace_chain > 0 && !loom::trace::enabled())
    throw Error("--trace-chain needs a build configured with -DLOOM_CHAIN_TRACE=ON");
  if (a.has("ep") || a.has("ep-rank")) {
#ifdef LOOM_HAVE_DIST
    loom::bench::EpBenchOptions ep;
    ep.base = opt;
    ep.ranks = int(a.integer("ep", 1));
    ep.rows_per_peer = a.integer("rows-per-peer", 0);
    ep.tokens_per_peer = a.integer("tokens-per-peer", 0);
    ep.comm_sms = int(a.integer("comm-sms", -1));
    if (a.has("ep-chunks")) {
      ep.chunks.clear();
      for (const int64_t c : a.integer_list("ep-chunks")) {
        if (c < 1 || c > 8) throw Error("--ep-chunks takes part counts in [1, 8], got " + std::to_string(c));
        ep.chunks.push_back(int(c));
      }
    }
    if (ep.ranks < 1) throw Error("--ep must be >= 1");
    if (opt.shape.mode != loom::Mode::ffn) throw Error("--ep runs the ffn layer (--mode ffn or an ffn preset)");
    if (a.has("json") || a.has("csv") || opt.trace_chain) throw Error("--ep prints its table only (no --json, --csv, --trace-chain)");
    if (a.has("ep-rank")) {
      loom::bench::run_ep_bench_rank(ep, int(a.integer("ep-rank", 0)), a.str("ep-id", ""), a.str("ep-out", ""), std::cerr);
      return 0;
    }
    const std::vector<std::string> args(argv + 2, argv + argc);
    std::cout << loom::bench::run_ep_bench(ep, "/proc/self/exe", args, std::cerr) << std::flush;
    return 0;
#else
    throw Error("--ep needs a build with NCCL (libloom_dist)");
#endif
  }
  const auto records = loom::bench::run_bench(opt, std::cerr);
  if (a.has("json")) loom::bench::write_file(a.str("json", ""), loom::bench::to_json(records));
  if (a.has("csv")) loom::bench::write_file(a.str("csv", ""), loom::bench::to_csv(records));
  std::cout << loom::bench::to_table(records) << std::flush;
  return 0;
}

int cmd_peaks(int argc, char** argv) {
  const Args a(rest(argc, argv), {"reps", "json"}, {});
  loom::bench::PeaksOptions opt;
  opt.timer.reps = int(a.integer("reps", 500));
  if (opt.timer.reps < 1) throw Error("--reps must be >= 1");
  const auto [table, json] = loom::bench::run_peaks(opt, std::cerr);
  if (a.has("json")) loom::bench::write_file(a.str("json", ""), json);
  std::cout << table << std::flush;
  return 0;
}

int cmd_info(int argc, char** argv) {
  std::set<std::string> valued = kWorkloadFlags;
  valued.insert({"device", "gemm-config", "gemm2-config", "ep", "ep-rank", "rows-per-peer", "tokens-per-peer",
                 "ep-chunks", "comm-sms"});
  const Args a(rest(argc, argv), valued, {"no-renorm", "sweep", "deterministic", "no-pdl", "no-fuse", "no-bins"});
  const Workload w = parse_workload(a);
  std::cout << "loom " << loom::build_commit() << "\n";
  std::optional<loom::DeviceSpec> spec;
  if (a.has("device")) {
    spec = loom::device_spec(a.str("device", ""));
    std::cout << "device: " << spec->name << ", " << spec->sm_count << " SMs, L2 " << (spec->l2_bytes >> 20)
              << " MiB, " << spec->smem_per_block / 1024 << " KiB smem/block\n";
  } else {
    std::string why;
    const auto dev = loom::query_device(&why);
    if (dev) {
      spec = loom::current_device();
      std::cout << "device: " << dev->name << " (sm_" << dev->major << dev->minor << "), " << dev->sm_count
                << " SMs, L2 " << (dev->l2_bytes >> 20) << " MiB, " << (dev->global_bytes >> 30) << " GiB, "
                << dev->smem_per_block_optin / 1024 << " KiB smem/block, " << dev->clock_mhz << " MHz\n";
    } else {
      std::cout << "device: none (" << why << "; --device h200 plans for a described one)\n";
    }
  }
  std::cout << "workload: " << w.preset << ", " << loom::describe(w.shape) << ", " << loom::describe(w.routing)
            << ", dist " << loom::to_string(w.dist) << "\n";
  loom::Options opt;
  opt.deterministic = a.has("deterministic");
  opt.pdl = !a.has("no-pdl");
  opt.fuse_small_batch = !a.has("no-fuse");
  opt.expert_bins = !a.has("no-bins");
  opt.gemm_config = a.str("gemm-config", "");
  opt.gemm2_config = a.str("gemm2-config", "");
  loom::Shape s = w.shape;
  s.tokens = *std::max_element(w.tokens.begin(), w.tokens.end());
  if (!spec) {
    std::cout << "plan: none without a device\n";
    return 0;
  }
  if (a.has("ep")) {  // one rank's expert-parallel plan, its placement and what it reserves
#ifdef LOOM_HAVE_DIST
    loom::ExpertParallel ep;
    ep.size = int(a.integer("ep", 1));
    ep.rank = int(a.integer("ep-rank", 0));
    ep.rows_per_peer = a.integer("rows-per-peer", 0);
    ep.tokens_per_peer = a.integer("tokens-per-peer", 0);
    ep.chunks = int(a.integer("ep-chunks", 1));
    ep.comm_sms = int(a.integer("comm-sms", -1));
    std::cout << loom::describe(loom::plan_ep(s, w.routing, opt, ep, *spec));
    return 0;
#else
    throw Error("--ep needs a build with NCCL (libloom_dist)");
#endif
  }
  try {
    const loom::Plan p = loom::plan(s, w.routing, opt, *spec);
    std::cout << "plan (GPU):\n" << loom::describe(p);
  } catch (const Error& e) {
    if (!opt.gemm_config.empty() || !opt.gemm2_config.empty()) throw;  // a key that cannot run is the user's error
    std::cout << "plan: CPU reference only (" << e.what() << ")\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "help";
  try {
    if (cmd == "bench") return cmd_bench(argc, argv);
    if (cmd == "peaks") return cmd_peaks(argc, argv);
    if (cmd == "info") return cmd_info(argc, argv);
    if (cmd == "help" || cmd == "--help" || cmd == "-h") {
      std::cout << kUsage;
      return 0;
    }
    std::fprintf(stderr, "loom: error: unknown command '%s' (try `loom help`)\n", cmd.c_str());
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "loom: error: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "loom: error: out of host memory for this workload\n");
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom: error: %s\n", e.what());
    return 3;
  }
}
