#include "probes/mma_skeleton_sm90.cuh"

#include <algorithm>
#include <cstdio>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "probes/probe_launch.hpp"
#include "common/cuda_check.hpp"
#include "common/device_info.hpp"
#include "gemm/promote_rows.cuh"
#include "gemm/ring_cursor.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/setmaxnreg.cuh"
#include "ptx/wgmma.cuh"

namespace loom::bench {
namespace {

constexpr int kStages = 4;
constexpr int kBlockK = 128;
constexpr int kTileBytes = 128 * kBlockK;  // one 128 x 128 e4m3 tile (B per stage; A of two warpgroups)
constexpr uint32_t kOperandByte = 0x30;    // e4m3 0.5: block sums stay small and finite

// One variant of the loop (the kernel's template argument).
struct Variant {
  int consumers;   // consumer warpgroups of 64 rows (2 or 3)
  bool bf16;       // bf16 operands (m64n128k16, four per 64-element K block, no promotion)
  bool reg_a;      // A from registers (regrouped per block, as gemm_fp8_regs) or from shared memory
  bool wide;       // two n128 accumulators per block (an n256 tile), no promotion
  bool promote;    // final += block * per-row scale after each block
  int chunk;       // 0: one block accumulator; 1: the same, with the next block's barrier wait, scale
                   // reads and A regrouping before this block's promotion; 2, 4: two block
                   // accumulators, block b + 1's MMAs issued before block b's wait, drained every
                   // `chunk` blocks (ptxas serialises every wgmma (C7514) when one is still in
                   // flight at the loop's back edge)
};

template <int kConsumers, bool RegA, bool kWide, bool kPromote, int kChunk, bool Bf16 = false>
struct Config {
  static_assert(!Bf16 || !kPromote, "bf16: no promotion");
  static_assert(kConsumers == 2 || kConsumers == 3, "two or three consumer warpgroups");
  static_assert(!(kWide && (kPromote || kChunk)), "an n256 tile leaves no registers for a second accumulator");
  static_assert(!kChunk || kPromote, "the reordered loops exist for the promotion");
  static_assert(kChunk == 0 || kChunk == 1 || kChunk == 2 || kChunk == 4, "chunks of 2 or 4 blocks (ring of 4)");
  static constexpr int kThreads = 128 * (kConsumers + 1);
  // The register file split as the GEMM kernels do (65536 per SM).
  static constexpr uint32_t kProducerRegs = kConsumers == 2 ? 40 : 24;
  static constexpr uint32_t kConsumerRegs = kConsumers == 2 ? 232 : 160;
  static_assert(128 * kProducerRegs + 128 * kConsumers * kConsumerRegs <= 65536, "the SM's registers");
  static constexpr int kMmas = kWide ? 8 : 4;
  static constexpr bool kRegA = RegA;
  static constexpr bool kBf16 = Bf16;
  static_assert(!(kRegA && kBf16), "A from registers is the e4m3 form only");
};

struct alignas(1024) Smem {
  uint8_t b[kStages][kTileBytes];
  uint8_t a[2][kTileBytes];  // 64-row A tiles of up to four warpgroups (shared-memory A)
  float xs[kStages][3 * 64];
  uint64_t full[kStages], empty[kStages];
  uint32_t zero_word;
};

using Stage = PipelineState<kStages>;

template <class C>
__device__ __forceinline__ void issue(float (&acc)[64], float (&acc2)[64], const uint32_t (&frag)[4][4],
                                      uint64_t desc_a, uint64_t desc_b) {
#pragma unroll
  for (int i = 0; i < 64; ++i) ptx::fence_operand(acc[i]);
  if constexpr (C::kMmas == 8)
#pragma unroll
    for (int i = 0; i < 64; ++i) ptx::fence_operand(acc2[i]);
  ptx::wgmma_fence();
  // Four k32 steps into one accumulator; an n256 tile runs them again into its second half (on the
  // same B tile: the loop is measured, not the data).
  auto four_mmas = [&](float (&d)[64]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if constexpr (C::kRegA)
        ptx::WgmmaE4M3RegA128::mma(d, frag[j], desc_b + 2 * j, j > 0 ? 1 : 0);
      else if constexpr (C::kBf16)  // a stage's 128-byte rows hold 64 bf16 of K: four k16 steps
        ptx::WgmmaBf16<128>::mma(d, desc_a + 2 * j, desc_b + 2 * j, j > 0 ? 1 : 0);
      else
        ptx::WgmmaE4M3<128>::mma(d, desc_a + 2 * j, desc_b + 2 * j, j > 0 ? 1 : 0);
    }
  };
  four_mmas(acc);
  if constexpr (C::kMmas == 8) four_mmas(acc2);
  ptx::wgmma_commit_group();
}

// Fixed operand tiles and scales, and the stage ring's barriers (empty: one arrival per consumer
// warp); the block's threads meet after.
__device__ __forceinline__ void init_operands(Smem& s, int threads, int consumer_warps) {
  uint32_t* words = reinterpret_cast<uint32_t*>(&s);
  const uint32_t fill = kOperandByte * 0x01010101u;
  for (int i = threadIdx.x; i < int((kStages + 2) * kTileBytes / 4); i += threads) words[i] = fill;
  for (int i = threadIdx.x; i < kStages * 3 * 64; i += threads) (&s.xs[0][0])[i] = 1.0f + 1e-3f * float(i % 7);
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      ptx::mbar_init(&s.full[i], 1);
      ptx::mbar_init(&s.empty[i], consumer_warps);
    }
    ptx::fence_mbar_init();
    s.zero_word = 0;
  }
  __syncthreads();
}

// The stage ring's producer, with nothing to copy: each stage full as soon as it is free.
__device__ __forceinline__ void cycle_stages(Smem& s, int kblocks) {
  Stage st;
  for (int b = 0; b < kblocks; ++b) {
    ptx::mbar_wait(&s.empty[st.stage], st.phase ^ 1);
    ptx::mbar_arrive(&s.full[st.stage]);
    st.advance();
  }
}

__device__ __forceinline__ void free_stage(Smem& s, const Stage& st) {
  __syncwarp();
  if (threadIdx.x % 32 == 0) ptx::mbar_arrive(&s.empty[st.stage]);
}

template <int kConsumers, bool kRegA, bool kWide, bool kPromote, int kChunk, bool kBf16>
__global__ void __launch_bounds__(Config<kConsumers, kRegA, kWide, kPromote, kChunk, kBf16>::kThreads, 1)
    skeleton_kernel(int kblocks, unsigned long long* cycles, float* sink) {
  using C = Config<kConsumers, kRegA, kWide, kPromote, kChunk, kBf16>;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t pad = (1024u - uint32_t(reinterpret_cast<uintptr_t>(smem_raw) % 1024u)) % 1024u;
  Smem& s = *reinterpret_cast<Smem*>(smem_raw + pad);
  init_operands(s, C::kThreads, 4 * kConsumers);
  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    ptx::setmaxnreg_dec<C::kProducerRegs>();
    if (threadIdx.x == 0) cycle_stages(s, kblocks);
    return;
  }
  ptx::setmaxnreg_inc<C::kConsumerRegs>();
  const int consumer = warpgroup - 1, lane = threadIdx.x % 32;
  const int row_a = 64 * consumer + 16 * (threadIdx.x / 32 % 4) + lane / 4, row_b = row_a + 8;
  const uint64_t desc_a = ptx::smem_desc_k_major_sw128(&s.a[consumer / 2][(consumer % 2) * (kTileBytes / 2)]);
  // A in registers: the loaded words of one block (as gemm_fp8_regs holds them: four distinct
  // registers quads, read from shared memory so that nothing folds), regrouped each block.
  const uint4* ring_src = reinterpret_cast<const uint4*>(&s.a[0][0]) + lane;
  const uint4 ring_a_lo = ring_src[0], ring_a_hi = ring_src[32], ring_b_lo = ring_src[64], ring_b_hi = ring_src[96];
  float fin[64], acc0[64], acc1[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) fin[i] = 0.0f;
  uint32_t frag0[4][4], frag1[4][4];
  const unsigned long long t0 = clock64();
  Stage st;
  auto stage_operands = [&](uint32_t (&frag)[4][4], const Stage& at, float& sa, float& sb) {
    ptx::mbar_wait(&s.full[at.stage], at.phase);
    sa = s.xs[at.stage][row_a];
    sb = s.xs[at.stage][row_b];
    if constexpr (kRegA) {
      const uint32_t pin = *reinterpret_cast<volatile const uint32_t*>(&s.zero_word);
      ptx::regroup_a_fragments(frag, ring_a_lo, ring_a_hi, ring_b_lo, ring_b_hi, pin);
    }
    return ptx::smem_desc_k_major_sw128(&s.b[at.stage][0]);
  };
  if constexpr (kChunk == 0) {
    for (int b = 0; b < kblocks; ++b) {
      float sa, sb;
      const uint64_t desc_b = stage_operands(frag0, st, sa, sb);
      issue<C>(acc0, acc1, frag0, desc_a, desc_b);
      ptx::wgmma_wait_group<0>();
#pragma unroll
      for (int i = 0; i < 64; ++i) ptx::fence_operand(acc0[i]);
      if constexpr (kWide)
#pragma unroll
        for (int i = 0; i < 64; ++i) ptx::fence_operand(acc1[i]);
      free_stage(s, st);
      st.advance();
      if constexpr (kPromote) promote_rows(fin, acc0, sa, sb);
    }
  } else if constexpr (kChunk == 1) {
    float sa, sb;
    uint64_t desc_b = stage_operands(frag0, st, sa, sb);
    Stage next = st;
    next.advance();
    for (int b = 0; b < kblocks; ++b) {
      issue<C>(acc0, acc0, frag0, desc_a, desc_b);
      ptx::wgmma_wait_group<0>();
#pragma unroll
      for (int i = 0; i < 64; ++i) ptx::fence_operand(acc0[i]);
      free_stage(s, st);
      st.advance();
      const float psa = sa, psb = sb;
      if (b + 1 < kblocks) {  // the next block's operands first: their latency hides under the FFMAs
        desc_b = stage_operands(frag0, next, sa, sb);
        next.advance();
      }
      promote_rows(fin, acc0, psa, psb);
    }
  } else {
    // Per chunk: blocks b0, b0 + 1, ... alternate between acc0 and acc1; each block's MMAs are
    // issued before the previous block is waited for and promoted; the chunk ends drained.
    Stage next = st;
    for (int b0 = 0; b0 < kblocks; b0 += kChunk) {
      float sa0, sb0, sa1, sb1;
      issue<C>(acc0, acc0, frag0, desc_a, stage_operands(frag0, next, sa0, sb0));
      next.advance();
#pragma unroll
      for (int i = 0; i < kChunk; i += 2) {
        issue<C>(acc1, acc1, frag1, desc_a, stage_operands(frag1, next, sa1, sb1));
        next.advance();
        ptx::wgmma_wait_group<1>();
#pragma unroll
        for (int r = 0; r < 64; ++r) ptx::fence_operand(acc0[r]);
        free_stage(s, st);
        st.advance();
        promote_rows(fin, acc0, sa0, sb0);
        if (i + 2 < kChunk) {
          issue<C>(acc0, acc0, frag0, desc_a, stage_operands(frag0, next, sa0, sb0));
          next.advance();
          ptx::wgmma_wait_group<1>();
        } else {
          ptx::wgmma_wait_group<0>();
        }
#pragma unroll
        for (int r = 0; r < 64; ++r) ptx::fence_operand(acc1[r]);
        free_stage(s, st);
        st.advance();
        promote_rows(fin, acc1, sa1, sb1);
      }
    }
  }
  const unsigned long long t1 = clock64();
  if (threadIdx.x % 128 == 0) cycles[blockIdx.x * kConsumers + consumer] = t1 - t0;
  float keep = 0.0f;
#pragma unroll
  for (int i = 0; i < 64; ++i) keep += kPromote ? fin[i] : acc0[i] + (kWide ? acc1[i] : 0.0f);
  if (kblocks < 0) sink[threadIdx.x] = keep;  // never: keeps the accumulators live
}

// Tokens on the MMA's N side (the resident-rows GEMM's orientation): A is the stage's weight tile
// (64 rows per consumer warpgroup, both warpgroups on the same stage), B a fixed tile of W token
// rows; the promotion scales by column (scales read from shared memory, as promote_columns). Each
// K block spans kGroups stages, each promoted into its own final accumulator (a K-outer walk over
// kGroups weight blocks of one expert). kPipelined (kGroups 1): two block accumulators, block b + 1
// issued before block b is waited for, drained every 2 blocks.
template <int W, int kGroups, bool kPipelined>
__global__ void __launch_bounds__(384, 1)
    skeleton_tokens_kernel(int kblocks, unsigned long long* cycles, float* sink) {
  static_assert(!kPipelined || kGroups == 1, "pipelined form: one weight block per K block");
  static_assert(W % 16 == 0 && W * kBlockK <= kTileBytes, "the token tile fits one fixed operand tile (s.a)");
  constexpr uint32_t kProducerRegs = 40, kConsumerRegs = 232;
  using Mma = ptx::WgmmaE4M3<W>;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t pad = (1024u - uint32_t(reinterpret_cast<uintptr_t>(smem_raw) % 1024u)) % 1024u;
  Smem& s = *reinterpret_cast<Smem*>(smem_raw + pad);
  init_operands(s, 384, 8);
  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    ptx::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0) cycle_stages(s, kblocks);
    return;
  }
  ptx::setmaxnreg_inc<kConsumerRegs>();
  const int consumer = warpgroup - 1, q = threadIdx.x % 4;
  const uint64_t desc_b = ptx::smem_desc_k_major_sw128(&s.a[0][0]);
  float fin[kGroups][W / 2], acc0[W / 2], acc1[W / 2];
#pragma unroll
  for (int g = 0; g < kGroups; ++g)
#pragma unroll
    for (int i = 0; i < W / 2; ++i) fin[g][i] = 0.0f;
  auto issue = [&](float (&acc)[W / 2], const Stage& at) {
    ptx::mbar_wait(&s.full[at.stage], at.phase);
    const uint64_t desc_a = ptx::smem_desc_k_major_sw128(&s.b[at.stage][consumer * 64 * kBlockK]);
#pragma unroll
    for (int i = 0; i < W / 2; ++i) ptx::fence_operand(acc[i]);
    ptx::wgmma_fence();
#pragma unroll
    for (int j = 0; j < 4; ++j) Mma::mma(acc, desc_a + 2 * j, desc_b + 2 * j, j > 0 ? 1 : 0);
    ptx::wgmma_commit_group();
  };
  auto retire = [&](float (&f)[W / 2], float (&acc)[W / 2], const Stage& at) {
#pragma unroll
    for (int i = 0; i < W / 2; ++i) ptx::fence_operand(acc[i]);
    const float* xs = s.xs[at.stage];
    float sa[W / 4];
    column_scales<W>(sa, xs, xs[64], q);
    free_stage(s, at);
    promote_columns<W>(f, acc, sa);
  };
  const unsigned long long t0 = clock64();
  Stage st;
  if constexpr (!kPipelined) {
    for (int b = 0; b < kblocks; b += kGroups) {
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        issue(acc0, st);
        ptx::wgmma_wait_group<0>();
        retire(fin[g], acc0, st);
        st.advance();
      }
    }
  } else {
    for (int b = 0; b < kblocks; b += 2) {
      Stage second = st;
      second.advance();
      issue(acc0, st);
      issue(acc1, second);
      ptx::wgmma_wait_group<1>();
      retire(fin[0], acc0, st);
      ptx::wgmma_wait_group<0>();
      retire(fin[0], acc1, second);
      st = second;
      st.advance();
    }
  }
  const unsigned long long t1 = clock64();
  if (threadIdx.x % 128 == 0) cycles[blockIdx.x * 2 + consumer] = t1 - t0;
  float keep = 0.0f;
#pragma unroll
  for (int g = 0; g < kGroups; ++g)
#pragma unroll
    for (int i = 0; i < W / 2; ++i) keep += fin[g][i];
  if (kblocks < 0) sink[threadIdx.x] = keep;  // never: keeps the accumulators live
}

struct Row {
  const char* name;
  Variant v;
  int width;  // tokens on N: the MMA's N (weights on M); 0: the forms above (tokens on M)
  void (*kernel)(int, unsigned long long*, float*);
  int threads;
};

template <int kConsumers, bool kRegA, bool kWide, bool kPromote, int kChunk, bool kBf16 = false>
Row row(const char* name) {
  using C = Config<kConsumers, kRegA, kWide, kPromote, kChunk, kBf16>;
  return Row{name, Variant{kConsumers, kBf16, kRegA, kWide, kPromote, kChunk}, 0,
             skeleton_kernel<kConsumers, kRegA, kWide, kPromote, kChunk, kBf16>, C::kThreads};
}

template <int W, int kGroups, bool kPipelined>
Row tokens_row(const char* name) {
  return Row{name, Variant{2, false, false, false, true, kPipelined ? 2 : 0}, W,
             skeleton_tokens_kernel<W, kGroups, kPipelined>, 384};
}

}  // namespace

std::string run_skeleton(const SkeletonOptions& opt, std::ostream& log) {
  const DeviceInfo dev = probe_device("skeleton");
  const std::vector<Row> rows = {
      row<2, true, false, true, 0>("A regs, 2 wg, n128, promote (gemm_fp8_regs)"),
      row<2, true, false, false, 0>("A regs, 2 wg, n128, no promotion"),
      row<2, false, false, true, 0>("A smem, 2 wg, n128, promote"),
      row<2, false, false, false, 0>("A smem, 2 wg, n128, no promotion"),
      row<2, false, true, false, 0>("A smem, 2 wg, n256, no promotion"),
      row<2, true, true, false, 0>("A regs, 2 wg, n256, no promotion"),
      row<2, true, false, true, 1>("A regs, 2 wg, n128, promote, next block first"),
      row<2, false, false, true, 1>("A smem, 2 wg, n128, promote, next block first"),
      row<3, false, false, true, 0>("A smem, 3 wg, n128, promote"),
      row<2, false, false, true, 2>("A smem, 2 wg, n128, promote, pipelined by 2"),
      row<2, false, false, true, 4>("A smem, 2 wg, n128, promote, pipelined by 4"),
      row<2, false, false, false, 0, true>("bf16, A smem, 2 wg, n128 (64-element K blocks)"),
      row<2, false, true, false, 0, true>("bf16, A smem, 2 wg, n256 (64-element K blocks)"),
      row<3, false, false, false, 0, true>("bf16, A smem, 3 wg, n128 (64-element K blocks)"),
      tokens_row<48, 1, false>("tokens on N: n48, promote by column"),
      tokens_row<64, 1, false>("tokens on N: n64, promote by column"),
      tokens_row<80, 1, false>("tokens on N: n80, promote by column"),
      tokens_row<80, 1, true>("tokens on N: n80, pipelined by 2"),
      tokens_row<64, 4, false>("tokens on N: n64, 4 weight blocks per K block"),
      tokens_row<80, 4, false>("tokens on N: n80, 4 weight blocks per K block"),
  };
  const size_t smem = sizeof(Smem) + 1024;
  unsigned long long* cycles = nullptr;
  float* sink = nullptr;
  LOOM_CUDA_CHECK(cudaMalloc(&cycles, sizeof(unsigned long long) * size_t(dev.sm_count) * 3));
  LOOM_CUDA_CHECK(cudaMalloc(&sink, sizeof(float) * 512));
  std::ostringstream table;
  table << "mma skeleton: " << dev.name << ", " << dev.sm_count << " SMs, " << opt.kblocks
        << " K blocks per warpgroup, median of " << opt.repeats << " launches (no global memory in the loop)\n";
  char line[256];
  std::snprintf(line, sizeof line, "  %-46s %12s %10s %10s\n", "variant", "cyc/K-block", "pipe busy", "us");
  table << line;
  for (const Row& r : rows) {
    log << "skeleton: " << r.name << "\n";
    LOOM_CUDA_CHECK(cudaFuncSetAttribute(r.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    std::vector<double> per_block, micros;
    for (int i = 0; i < opt.repeats; ++i) {
      const double us =
          time_launch_us([&] { r.kernel<<<dev.sm_count, r.threads, smem>>>(opt.kblocks, cycles, sink); });
      std::vector<unsigned long long> c(size_t(dev.sm_count) * size_t(r.v.consumers));
      LOOM_CUDA_CHECK(cudaMemcpy(c.data(), cycles, c.size() * sizeof(c[0]), cudaMemcpyDeviceToHost));
      per_block.push_back(double(*std::max_element(c.begin(), c.end())) / opt.kblocks);
      micros.push_back(us);
    }
    std::sort(per_block.begin(), per_block.end());
    std::sort(micros.begin(), micros.end());
    const double cyc = per_block[per_block.size() / 2];
    // Per K block of every warpgroup: an m64nNk32 e4m3 takes N / 2 cycles (64 for n128), and so
    // does an m64nNk16 bf16 (half the multiply-adds per cycle, half the K).
    const double mma_cycles = r.width ? 4.0 * (r.width / 2) * 2 : 64.0 * (r.v.wide ? 8 : 4) * r.v.consumers;
    std::snprintf(line, sizeof line, "  %-46s %12.0f %9.1f%% %10.1f\n", r.name, cyc, 100.0 * mma_cycles / cyc,
                  micros[micros.size() / 2]);
    table << line;
  }
  LOOM_CUDA_CHECK(cudaFree(cycles));
  LOOM_CUDA_CHECK(cudaFree(sink));
  return table.str();
}

}  // namespace loom::bench
