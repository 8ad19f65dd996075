// loom-lab: the design probes that measured loom's kernels (not part of the product; built with
// -DLOOM_BUILD_LAB=ON). Each runs alone on an sm_90 GPU and prints a table.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "args.hpp"
#include "bf16_variants/bf16_variants_sm90.cuh"
#include "phase_profile/phase_profile.cuh"
#include "probes/gather_probe_sm90.cuh"
#include "probes/mma_skeleton_sm90.cuh"
#include "probes/stream_probe_sm90.cuh"
#include "probes/warp_probe_sm90.cuh"
#include "loom/types.hpp"

namespace {

using loom::Error;
using loom::cli::Args;

constexpr const char* kUsage = R"(loom-lab - the design probes behind loom's kernels (not the product)

usage:
  loom-lab skeleton [--kblocks N] [--repeats R]   the FP8 GEMM's K-block loop with no global memory:
                         cycles per K block and tensor-pipe share of its variants (A from
                         registers or shared memory, 2 or 3 consumer warpgroups, promotion; tokens
                         on the MMA's N side at widths 48-80)
  loom-lab gather-probe [--tiles N] [--repeats R]   gathering activation rows by token from L2
                         (cp.async into shared memory, or loads into registers) at several
                         shared-memory sizes
  loom-lab stream-probe [--repeats R] [--pitch B] [--unit-rows N]   streaming 256 MiB of weights from
                         HBM by TMA into a shared-memory ring with nothing consuming them (ring depths,
                         issue orders, L2 prefetches and promotion, bulk copies; the floor's reader),
                         as rows of B bytes (default 2048: FP8 K=2048) in boxes of N rows x 128 B
                         (default 128); BF16 h200-bf16: --pitch 6144 (w13) or 3072 (w2)
  loom-lab warp-probe [--repeats R]   cycles of the warp steps the routing waits on (reduction,
                         ballot, shuffle, match, one arg-max round), as dependent chains in one warp
  loom-lab phase-profile [--preset P] [--tokens T] [--runs N] [--seed S]   the tokens-on-M GEMM's
                         cycles per phase (unit starts, K loops, epilogues; per K block the waits for
                         the stage and the A fragments, the MMAs, the promotion; the producer's and
                         the combine warp's waits) over N cold launches on the workspace of a full
                         run, and the SM clock it ran at (default qwen35-single, T=2048, 200 runs)
  loom-lab bf16-variants [--tokens T,...] [--repeats R] [--uneven]   the BF16 ffn GEMMs (h200-bf16
                         shape) on the product's kernel and on the lab's variants (4 stages with the
                         epilogue from registers, CTA pairs sharing B by multicast, GEMM 1's A by
                         token): every variant's outputs equal to the product's bit for bit, then
                         medians of R rounds alternating them (default T=2048,8192,32768, 10 rounds)
  loom-lab help          this text
)";

std::vector<std::string> rest(int argc, char** argv) { return std::vector<std::string>(argv + 2, argv + argc); }

int cmd_skeleton(int argc, char** argv) {
  const Args a(rest(argc, argv), {"kblocks", "repeats"}, {});
  loom::bench::SkeletonOptions opt;
  opt.kblocks = int(a.integer("kblocks", opt.kblocks));
  opt.repeats = int(a.integer("repeats", opt.repeats));
  if (opt.kblocks < 4 || opt.kblocks % 4 || opt.repeats < 1)
    throw Error("--kblocks must be a positive multiple of 4 and --repeats >= 1");
  std::cout << loom::bench::run_skeleton(opt, std::cerr) << std::flush;
  return 0;
}

int cmd_gather_probe(int argc, char** argv) {
  const Args a(rest(argc, argv), {"tiles", "repeats"}, {});
  loom::bench::GatherProbeOptions opt;
  opt.tiles_per_cta = int(a.integer("tiles", opt.tiles_per_cta));
  opt.repeats = int(a.integer("repeats", opt.repeats));
  if (opt.tiles_per_cta < 1 || opt.tiles_per_cta > 64 || opt.repeats < 1)
    throw Error("--tiles must be in [1, 64] and --repeats >= 1");
  std::cout << loom::bench::run_gather_probe(opt, std::cerr) << std::flush;
  return 0;
}

int cmd_stream_probe(int argc, char** argv) {
  const Args a(rest(argc, argv), {"repeats", "pitch", "unit-rows"}, {});
  loom::bench::StreamProbeOptions opt;
  opt.repeats = int(a.integer("repeats", opt.repeats));
  opt.pitch = a.integer("pitch", opt.pitch);
  opt.unit_rows = int(a.integer("unit-rows", opt.unit_rows));
  if (opt.repeats < 1) throw Error("--repeats must be >= 1");
  std::cout << loom::bench::run_stream_probe(opt, std::cerr) << std::flush;
  return 0;
}

int cmd_warp_probe(int argc, char** argv) {
  const Args a(rest(argc, argv), {"repeats"}, {});
  loom::bench::WarpProbeOptions opt;
  opt.repeats = int(a.integer("repeats", opt.repeats));
  if (opt.repeats < 1) throw Error("--repeats must be >= 1");
  std::cout << loom::bench::run_warp_probe(opt, std::cerr) << std::flush;
  return 0;
}

int cmd_phase_profile(int argc, char** argv) {
  const Args a(rest(argc, argv), {"preset", "tokens", "runs", "seed"}, {});
  loom::lab::PhaseProfileOptions opt;
  opt.preset = a.str("preset", opt.preset);
  opt.tokens = a.integer("tokens", opt.tokens);
  opt.runs = int(a.integer("runs", opt.runs));
  opt.seed = uint64_t(a.integer("seed", int64_t(opt.seed)));
  if (opt.tokens < 1 || opt.runs < 1) throw Error("--tokens and --runs must be >= 1");
  loom::lab::run_phase_profile(opt, std::cout);
  return 0;
}

}  // namespace

int cmd_bf16_variants(int argc, char** argv) {
  const Args a(rest(argc, argv), {"tokens", "repeats"}, {"uneven"});
  loom::lab::Bf16VariantsOptions opt;
  if (a.has("tokens")) {
    opt.tokens.clear();
    for (int64_t t : a.integer_list("tokens")) {
      if (t < 1 || t > (int64_t(1) << 20)) throw Error("--tokens must be in [1, 2^20]");
      opt.tokens.push_back(int(t));
    }
  }
  opt.repeats = int(a.integer("repeats", opt.repeats));
  opt.uneven = a.has("uneven");
  if (opt.repeats < 0) throw Error("--repeats must be >= 0");
  std::cout << loom::lab::run_bf16_variants(opt, std::cerr) << std::flush;
  return 0;
}

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "help";
  try {
    if (cmd == "skeleton") return cmd_skeleton(argc, argv);
    if (cmd == "gather-probe") return cmd_gather_probe(argc, argv);
    if (cmd == "stream-probe") return cmd_stream_probe(argc, argv);
    if (cmd == "warp-probe") return cmd_warp_probe(argc, argv);
    if (cmd == "phase-profile") return cmd_phase_profile(argc, argv);
    if (cmd == "bf16-variants") return cmd_bf16_variants(argc, argv);
    if (cmd == "help" || cmd == "--help" || cmd == "-h") {
      std::cout << kUsage;
      return 0;
    }
    std::fprintf(stderr, "loom-lab: error: unknown command '%s' (try `loom-lab help`)\n", cmd.c_str());
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "loom-lab: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom-lab: error: %s\n", e.what());
    return 3;
  }
}
