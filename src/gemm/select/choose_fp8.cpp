// The FP8 GEMM's config chooser: which kernel and which options for a batch, from rows per expert
// (uniform routing assumed), the shape and the device's SM count and L2 size. Every threshold and
// choice says what it was measured against (docs/perf/journal).
#include <algorithm>
#include <cmath>
#include <string>

#include "gemm/gemm_fp8.hpp"

namespace loom {

namespace {
constexpr int kBlockK = kFp8BlockK, kBlockM = kFp8BlockRows, kMaxChunk = kWeightsOnMMaxChunk;
}  // namespace

std::string GemmFp8Config::str() const {
  if (resident_rows)
    return std::string("fp8 grouped GEMM: 128 weight rows (M) x an expert's token rows in {16, 32, 48}-wide chunks (N), "
                       "the chunk's rows resident in shared memory over all of K, 5 weight TMA stages, persistent "
                       "grid") +
           (dynamic ? ", units past the first round from a queue" : ", round robin") +
           ", combine by bulk reductions from a shared-memory stage" + (weights_evict_first ? ", weights L2 evict-first" : "");
  if (x_source == XSource::token_fragments)
    return std::string("fp8 grouped GEMM: tiles of ") +
           (wide_tiles ? "64 of an expert's token rows (M) x 256 weight rows (N, one 128-row block per consumer)"
                       : "128 of an expert's token rows (M) x 128 weight rows (N)") +
           ", the rows loaded by token into A-fragment registers, 4 weight TMA stages, persistent grid, combine by "
           "bulk reductions from a shared-memory stage (atomic) or stores from registers (store)" +
           (weights_evict_first ? ", weights L2 evict-first" : "") +
           (x_evict_last ? ", activation rows L2 evict-last" : "");
  return "fp8 grouped GEMM: units of 128 weight rows x all of an expert's rows in {16..128}-wide chunks, " +
         std::to_string(stages) + " TMA stages, persistent grid, " +
         (dense ? std::string("dense unit walk") : std::string("compact unit walk over experts with rows")) +
         (split_k > 1 ? ", split-K " + std::to_string(split_k) : "") +
         (balanced ? ", balanced shares of (unit, K block)" : "") + (dynamic ? ", dynamic tail (last round from a queue)" : "") +
         (x_source == XSource::gather_by_token ? ", rows gathered by token (cp.async)" : ", expert-sorted rows (TMA)") +
         (weights_evict_first ? ", weights L2 evict-first" : "") +
         (x_evict_first ? ", activations L2 evict-first" : "") +
         (handoff_epilogue ? ", epilogue handed to the producer warpgroup's spare warps" : ", epilogue in the consumers") +
         (warm_up ? ", instruction-cache warm-up before the PDL wait" : "");
}

bool use_token_fragments(int64_t tokens, int64_t topk, int64_t experts, int64_t k, bool routes_in_bins) {
  const double rows = double(tokens) * double(topk) / double(experts);
  const double wide_from = routes_in_bins ? kWideTilesFromBinsRowsPerExpert : kWideTilesRowsPerExpert[0];
  const bool wide = rows >= wide_from && rows < kWideTilesRowsPerExpert[1] && k % (2 * kBlockK) == 0;
  return (rows >= kTokenFragmentsMinRowsPerExpert || wide) &&
         k % kBlockK == 0 && k >= kRegsRing * kBlockK && k <= kRegsMaxK && experts <= kGpuMaxExperts &&
         tokens * k < (int64_t(1) << 31);
}

GemmFp8Config choose_gemm_fp8_config(int64_t tokens, int64_t topk, int64_t experts, int64_t n, int64_t k,
                                     bool deterministic, const DeviceInfo& device, bool allow_token_fragments,
                                     bool routes_in_bins) {
  GemmFp8Config c;
  c.max_width = kMaxChunk;  // the chunk width adapts per expert at run time
  // Expected experts with rows under uniform routing: E (1 - (1 - k/E)^T).
  const double hit = double(experts) * (1.0 - std::pow(1.0 - double(topk) / double(experts), double(tokens)));
  // The dense walk when nearly every expert has rows: a CTA then knows its first unit before the
  // routing exists (the gathering kernels' instruction-cache warm-up walks to it).
  c.dense = hit >= 0.9 * double(experts);
  // Fewer units than SMs leave SMs idle: split K until there is about one unit per SM (atomic
  // combine only; a split needs its partial sums added). Not further: more, shorter units cost more
  // than the balance they buy. Measured e2e (same call, x2), T=1 (32 units): split 4 14.9 / 14.9,
  // 8 15.5 / 15.3, 16 16.3 / 16.7, 2 16.5 / 16.6 us; T=8 (229 units): none 27.6 / 27.5, 2 29.3 /
  // 28.9, 4 31.8 / 32.0 us.
  const int64_t nblocks = (n + kBlockM - 1) / kBlockM, kblocks = (k + kBlockK - 1) / kBlockK;
  const double units = std::max(1.0, hit) * double(nblocks);
  // Gather by token only while no expert can have more than kGatherMaxTokens rows (a token
  // routes to an expert at most once): the cp.async gather of wide chunks cannot keep their bytes
  // in flight, and skew makes wide chunks at any T. Measured GEMM alone, gathered vs sorted:
  // T=2048 154.8 vs 106-113 us; T=128 72.9 vs 69.4 (e2e equal: 82.1 vs 82.0), zipf:1.2 73.7 vs
  // 66.0 e2e, hot:0.9 93.5 vs 80.8. Small batches gain a kernel boundary and the sorted copy.
  // Above that, gathering from expert bins while experts have at most kGatherBinsMaxRowsPerExpert
  // rows: the routing fills the bins, so there is no dispatch kernel and no sorted copy (glue at
  // T=128 ~4 us instead of ~8), and the chunk walk spreads an expert's chunks over the CTAs. Measured
  // e2e, from bins vs dispatch + sorted rows (one call, x3; docs/perf.md, twenty-first session):
  // T=33 / 64 / 128 / 256 / 512 51.3 / 66.4 / 74.8 / 75.3 / 79.2 vs 54.7 / 69.0 / 76.2 / 78.9 /
  // 83.5 us; at 20 rows per expert (T=640, x2, an earlier build) 83.2 vs 88.8; skewed routes from
  // logits, T=128 / 512: hot:0.9 75.9 / 84.8 vs 76.1 / 101.2, zipf:1.2 60.5 / 94.2 vs 58.7 / 95.6
  // (zipf's hot experts' further chunks re-read their weights). From 24 rows the register-loaded
  // kernel's wide tiles take over where K allows (below).
  const double rows_per_expert = double(tokens) * double(topk) / double(experts);
  const bool gather_from_bins_allowed = routes_in_bins && !deterministic && allow_token_fragments;
  const bool gather_from_bins =
      gather_from_bins_allowed && tokens > kGatherMaxTokens && rows_per_expert <= kGatherBinsMaxRowsPerExpert;
  c.x_source = tokens <= kGatherMaxTokens || gather_from_bins ? XSource::gather_by_token : XSource::sorted_rows;
  // L2 eviction priority, when the weight stream outgrows about half of L2 (below that nothing
  // useful is evicted, and T=1 measured 0.2-0.6 us slower with the hint). While an expert's rows
  // fit one chunk, each unit reads its weight tile once: weights go first, which keeps the
  // activation rows (read by every unit of the expert) and the combine's output lines in L2.
  // Measured e2e, hint vs none (same call, 300 reps): T=8 28.8 vs 30.3, T=32 55.8 vs 57.0,
  // T=128 77.5 vs 81.5, T=512 87.2 vs 94.5, T=2048 136.7 vs 139.3 us. With several chunks per
  // expert the unit re-reads its weights: activations go first instead (T=8192 351.9 vs 365.3).
  const double weight_bytes = hit * double(n) * double(k);
  const bool stream_outgrows_l2 = weight_bytes > 0.5 * double(device.l2_bytes);
  c.weights_evict_first = stream_outgrows_l2 && rows_per_expert <= kMaxChunk;
  c.x_evict_first = stream_outgrows_l2 && rows_per_expert > kMaxChunk;
  c.split_k = 1;
  if (!deterministic && units < device.sm_count && !gather_from_bins)  // the chunk walk takes no split
    c.split_k = int(std::clamp<int64_t>(int64_t(std::ceil(device.sm_count / units)), 1, std::min<int64_t>(8, kblocks)));
  // Balanced shares when each SM has one to a few whole units (gathered rows, T <= 32): round
  // robin then leaves some SMs a whole unit more than others (T=8: 232 units on 132 SMs).
  // Measured e2e, balanced vs round robin (same binary, x2): T=8 26.2 / 26.2 vs 27.4 / 27.4, T=16
  // 38.6 / 38.6 vs 44.4 / 44.4, T=32 52.8 / 52.8 vs 53.4 / 53.5 us; in place of split-K (T=1:
  // 15.1 / 14.8 vs 14.5 / 14.4) and with sorted rows (T=64: 69.8 / 69.8 vs 68.8 / 68.6) it lost.
  c.balanced = !deterministic && !c.dense && c.x_source == XSource::gather_by_token && c.split_k == 1;
  // Dynamic tail with sorted rows: round robin leaves the CTAs unequal work at the end (a unit
  // more or less, units of unequal width, SMs that stream at unequal rates). Measured e2e, round
  // robin vs dynamic tail (two builds, same call, x2): T=64 68.5 / 68.7 vs 68.0 / 68.0, T=128 75.9
  // / 76.1 vs 75.6 / 75.8, T=512 86.7 / 86.7 vs 86.5 / 86.4, T=2048 134.7 / 134.4 vs 131.6 / 131.8,
  // T=4096 222.1 / 221.2 vs 209.8 / 209.8, T=8192 351.4 / 350.8 vs 344.7 / 344.3 us; zipf:1.2 T=128
  // 64.9 vs 58.4, hot:0.9 81.4 vs 76.9. Every unit from the queue lost at T=8192 (362.4 us).
  c.dynamic = c.x_source == XSource::sorted_rows;
  // Hand-off epilogue once chunks are wide (its staging leaves room for 4 stages, not 6). Measured
  // e2e, hand-off vs in the consumers (same binary, x2): T=128 76.1 vs 75.5, T=1024 100.8-101.1 vs
  // 98.8-99.1, T=2048 126.5 vs 129.2-129.5, T=4096 203.1-203.4 vs 210.1-210.3, T=8192 336.4-336.5
  // vs 345.1-345.4 us.
  set_handoff_epilogue(c, c.x_source == XSource::sorted_rows && rows_per_expert >= 64);
  // Gathered batches: the producer's dry walk before the PDL wait (instruction fetch). Measured
  // e2e in their own kernel, with vs without (same binary, x3): T=1 12.4-12.5 vs 12.4-12.8, T=8
  // 24.4 vs 24.4-24.6, T=16 35.8-35.9 vs 35.9-36.1, T=32 48.9-49.0 vs 49.1-49.3 us. (In the kernel
  // the sorted rows share, it cost 1.7-3 us at T=16-32: ninth session.)
  c.warm_up = c.x_source == XSource::gather_by_token;
  // From 52 rows per expert (and from 30 to 52, in wide tiles): token rows on M, loaded by token
  // into registers, so no sorted copy is written (kernel/fp8_tokens_on_m_kernel.cuh). Since the bulk-reduction
  // combine (fifteenth session) the register-loaded kernel wins from 32 rows per expert on, its glue
  // (route+quantise in token order, count, dispatch) about 15 us shorter at T=2048 than dispatch +
  // the sorted copy. Measured e2e, sorted rows / wide tiles / 128 x 128 tiles (one build, environment
  // switch, x2 in one call; seventeenth session): T=896 (28 rows) 98.1-98.2 / 99.6-99.7 / -;
  // T=1024 (32) 101.8-101.9 / 99.7-99.9 / 102.7; T=1536 (48) - / 106.1-106.2 / 109.4-109.5;
  // T=1792 (56) - / 116.5 / 114.8-114.9; T=2048 (64) 129.2-129.3 / 125.3-125.6 / 118.4-118.7 us.
  // With expert bins the register-loaded kernel has no count or dispatch kernel before it, and its
  // wide tiles win from fewer rows. Measured e2e from logits, wide tiles vs the gathering kernel
  // from bins (one call, x3; twenty-first session): 22 / 23 / 23.5 / 24 rows per expert (T=704 /
  // 736 / 752 / 768) 83.8-83.9 / 84.6-84.7 / 84.2-84.3 / 84.4-84.5 vs 80.7-80.8 / 80.7-81.0 /
  // 81.0-81.1 / 88.7-89.0 us; at 28 rows (T=896) 85.9-86.0 vs 98.7-98.9 on sorted rows. Skew
  // favours the wide tiles earlier (zipf:1.2, T=704 / 736: 92.3 / 93.4 vs 104.3 / 112.3); the
  // chooser, as everywhere, assumes uniform routing.
  if (allow_token_fragments && use_token_fragments(tokens, topk, experts, k, gather_from_bins_allowed)) {
    c = GemmFp8Config{};
    c.x_source = XSource::token_fragments;
    // L2 eviction priorities, when the weight stream outgrows half of L2 as above: the activation
    // rows (read by every unit of their row tile) evict-last, and the weights evict-first while an
    // expert reads them in at most about one and a half row tiles. Either way the weight stream does
    // not push out the rows and output lines that are read again. Measured e2e (one build,
    // environment switches, x2 in one call; seventeenth session):
    //   weights evict-first vs none: T=1024 / 1536 / 2048 / 2560 / 4096 93.1-93.2 / 97.9 /
    //   108.1-108.4 / 120.8-121.0 / 158.6-158.9 vs 99.2-99.7 / 106.1-106.3 / 120.1 / 130.7-130.9 /
    //   170.2-170.6 us; at T=8192 (two row tiles an expert) 273.3-274.7 vs 270.6-270.8, and on each
    //   expert's last row tile only T=5120 / 6144 / 8192 204.6 / 221.0-221.3 / 274.0-274.2 vs none
    //   203.9-204.0 / 220.5-221.1 / 266.1-269.3.
    //   activations evict-last, on weights evict-first up to T=4096: T=2048 / 4096 / 6144 / 8192
    //   107.6-107.7 / 158.2-158.4 / 212.9-213.7 / 268.4-269.0 vs 107.5-107.8 / 158.7-158.9 /
    //   221.1-221.7 / 271.0-272.1 us; with weights evict-first as well at 6144 / 8192 208.4 (x2) /
    //   273.1-274.6.
    c.x_evict_last = stream_outgrows_l2;
    c.weights_evict_first = stream_outgrows_l2 && rows_per_expert <= 1.5 * kRegsTileRows;
    // 64 x 256 tiles below 40 rows per expert, where most experts' rows fit one 64-row tile. With
    // the activations in registers they won up to 52 (48 rows 106.1 wide vs 109.5 tall, 56 rows
    // 116.5 vs 114.9 us); with the shared-memory ring 128 x 128 tiles win from 40: T=1280 / 1536 /
    // 1792 e2e 80.5-80.7 / 84.0 / 87.8 vs 81.9-82.0 / 84.8 / 95.3-95.5 us (docs/perf.md,
    // thirty-sixth session).
    c.wide_tiles = rows_per_expert < kTallTilesRowsPerExpert;
    // Dynamic tail, as for sorted rows. Measured e2e, with vs round robin (one build, environment
    // switch, x3 in one call; eighteenth session): T=1024 / 2048 / 4096 / 8192 84.6-84.8 /
    // 98.4-98.6 / 143.8-143.9 / 249.6-251.6 vs 84.4-84.6 / 98.4-98.6 / 148.6-148.8 / 257.4-258.0 us.
    c.dynamic = true;
  }
  // Resident token rows (weights on M, an expert's rows in shared memory over all of K), from expert
  // bins, while nearly every expert has rows (a compact walk of fewer hit experts leaves CTAs idle:
  // T=33 e2e 59.5 vs 49.7 us) and the kernel holds 1.5x the mean rows per expert in one chunk (a
  // second chunk streams the expert's weights again: T=1280, 40 rows, 106.7 vs 85.2). Measured e2e,
  // resident vs the chooser's kernel before it (one build, environment switch, x2 in one call;
  // twenty-eighth session): T=64 64.8-64.9 vs 64.5-64.6 (hit 222 of 256: not taken), T=128
  // 71.2-71.3 vs 71.9, T=256 72.7-72.8 vs 72.6-72.7, T=384 74.1-74.2 vs 74.0-74.1, T=512 74.8 vs
  // 76.5-76.6, T=768 76.3-76.4 vs 81.7, T=1024 78.1-78.3 vs 82.1 us. Skewed routes from logits
  // (the chooser assumes uniform routing): T=128 zipf:1.2 61.4 vs 58.0, hot:0.9 71.5 vs 72.6; T=512
  // zipf:1.2 88.9 vs 90.4, hot:0.9 88.8 vs 81.5 us.
  if (gather_from_bins_allowed && tokens > kGatherMaxTokens && hit >= 0.9 * double(experts) &&
      rows_per_expert <= kResidentRowsMaxRowsPerExpert &&
      1.5 * rows_per_expert <= double(resident_rows_capacity(n, k))) {
    c = GemmFp8Config{};
    c.resident_rows = true;
    c.weights_evict_first = stream_outgrows_l2;
    c.dynamic = true;
  }
  return c;
}

void set_handoff_epilogue(GemmFp8Config& c, bool on) {
  c.handoff_epilogue = on;
  c.stages = pipeline_stages(c);
}

int pipeline_stages(const GemmFp8Config& c) {
  // 6 x 16 KiB of weights in flight per SM, 4 beside the hand-off staging (what that costs where
  // chunks are narrow: the measurements above); 8 in the gathering kernels (kStagesGathered).
  if (c.handoff_epilogue) return kStagesHandoff;
  return c.x_source == XSource::gather_by_token ? kStagesGathered : kStagesInline;
}


}  // namespace loom
