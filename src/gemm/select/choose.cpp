#include "gemm/select/choose.hpp"

#include <algorithm>
#include <cmath>

#include "gemm/gemm_fp8.hpp"
#include "loom/types.hpp"

namespace loom {

bool use_token_fragments(int64_t tokens, int64_t topk, int64_t experts, int64_t k, bool routes_in_bins) {
  const double rows = double(tokens) * double(topk) / double(experts);
  const double wide_from = routes_in_bins ? kWideTilesFromBinsRowsPerExpert : kWideTilesRowsPerExpert[0];
  const bool wide = rows >= wide_from && rows < kWideTilesRowsPerExpert[1] && k % (2 * kFp8BlockK) == 0;
  return (rows >= kTokenFragmentsMinRowsPerExpert || wide) && k % kFp8BlockK == 0 && k >= kRegsRing * kFp8BlockK &&
         k <= kRegsMaxK && experts <= kGpuMaxExperts && tokens * k < (int64_t(1) << 31);
}

GemmConfig choose_gemm_config(const GemmProblem& pr, const DeviceInfo& device) {
  const int64_t tokens = pr.tokens, topk = pr.topk, experts = pr.experts, n = pr.n, k = pr.k;
  const bool deterministic = pr.deterministic;
  // Expected experts with rows under uniform routing: E (1 - (1 - k/E)^T).
  const double hit = double(experts) * (1.0 - std::pow(1.0 - double(topk) / double(experts), double(tokens)));
  const double rows_per_expert = double(tokens) * double(topk) / double(experts);
  // L2 eviction priorities pay once the weight stream outgrows about half of L2 (below that nothing
  // useful is evicted, and small batches ran slower with the hints).
  const bool stream_outgrows_l2 = hit * double(n) * double(k) > 0.5 * double(device.l2_bytes);
  const bool bins_allowed = pr.routes_in_bins && !deterministic && pr.allow_tokens_on_m;

  // Resident rows (weights on M, an expert's rows in shared memory over all of K), from expert bins,
  // while nearly every expert has rows (a compact walk of fewer experts leaves CTAs idle) and the
  // kernel holds 1.5x the mean rows per expert in one chunk (a second chunk streams the expert's
  // weights again).
  if (bins_allowed && tokens > kGatherMaxTokens && hit >= 0.9 * double(experts) &&
      rows_per_expert <= kResidentRowsMaxRowsPerExpert && 1.5 * rows_per_expert <= double(resident_rows_capacity(n, k))) {
    ResidentConfig c;
    c.weights_evict_first = stream_outgrows_l2;
    c.dynamic = true;
    return c;
  }
  // Tokens on M: from tens of rows per expert, the rows loaded by token into A fragments, so no
  // sorted copy is written (its glue is shorter than dispatch + the copy). With expert bins there
  // is no count or dispatch kernel before it either, and its wide tiles win from fewer rows.
  if (pr.allow_tokens_on_m && use_token_fragments(tokens, topk, experts, k, bins_allowed)) {
    TokensOnMConfig c;
    c.store = deterministic;
    // The activation rows (read by every unit of their row tile) evict-last; the weights
    // evict-first while an expert reads them in at most about one and a half row tiles. Either way
    // the weight stream does not push out the lines that are read again.
    c.x_evict_last = stream_outgrows_l2;
    c.weights_evict_first = stream_outgrows_l2 && rows_per_expert <= 1.5 * kRegsTileRows;
    // 64 x 256 tiles while most experts' rows fit one 64-row tile (a tall tile would leave its
    // second warpgroup idle).
    c.wide = rows_per_expert < kTallTilesRowsPerExpert;
    c.dynamic = true;  // the last round from the queue: SMs stream at unequal rates
    return c;
  }

  WeightsOnMConfig c;
  c.store = deterministic;
  const bool nearly_all_hit = hit >= 0.9 * double(experts);
  // Gather by token only while no expert can have more than kGatherMaxTokens rows: the cp.async
  // gather cannot keep the bytes of wide chunks in flight, and skew makes wide chunks at any T.
  // Small batches gain a kernel boundary and the sorted copy. Above that, from expert bins while
  // experts have at most kGatherBinsMaxRowsPerExpert rows: no dispatch kernel and no sorted copy,
  // and the chunk walk spreads an expert's chunks over the CTAs.
  const bool from_bins = bins_allowed && tokens > kGatherMaxTokens && rows_per_expert <= kGatherBinsMaxRowsPerExpert;
  const bool gather = tokens <= kGatherMaxTokens || from_bins;
  c.rows = from_bins ? WmRows::bins : gather ? WmRows::gather : WmRows::sorted;
  // The dense walk when nearly every expert has rows: a CTA then knows its first unit before the
  // routing exists (the gathering kernels' warm-up walks to it). Otherwise it would pull unused
  // experts' weights. (The chunk walk over bins lists the experts with rows itself.)
  c.dense = nearly_all_hit && !from_bins;
  // While an expert's rows fit one chunk, each unit reads its weight tile once: weights go first,
  // keeping the activation rows (read by every unit of the expert) and the output lines in L2. With
  // several chunks per expert a unit re-reads its weights: activations go first instead.
  c.weights_evict_first = stream_outgrows_l2 && rows_per_expert <= kWeightsOnMMaxChunk;
  c.x_evict_first = !gather && stream_outgrows_l2 && rows_per_expert > kWeightsOnMMaxChunk;
  // Fewer units than SMs leave SMs idle: split K into as many ranges as keep every unit in one wave
  // (units x split <= SMs; red combine only; the chunk walk takes no split). A split that spills
  // into a second wave measured slower than the next smaller one (session 45's journal).
  const int64_t nblocks = (n + kFp8BlockRows - 1) / kFp8BlockRows, kblocks = (k + kFp8BlockK - 1) / kFp8BlockK;
  const double units = std::max(1.0, hit) * double(nblocks);
  if (!deterministic && units < device.sm_count && !from_bins)
    c.split_k = int(std::clamp<int64_t>(int64_t(std::floor(device.sm_count / units)), 1, std::min<int64_t>(8, kblocks)));
  // Balanced shares when each SM has one to a few whole units of gathered rows: round robin then
  // leaves some SMs a whole unit more than others.
  c.balanced = !deterministic && !nearly_all_hit && gather && c.split_k == 1;
  // Sorted rows: the last round from the queue (round robin leaves the CTAs unequal work at the end),
  // and the hand-off epilogue once chunks are wide (its staging leaves room for 4 stages, not 6).
  c.dynamic = !gather;
  c.handoff = !gather && rows_per_expert >= 64;
  // Gathering: the producer's dry walk before the PDL wait (instruction fetch); the plan keeps it
  // where the walk's indices are valid before the wait and the launch uses PDL.
  c.warm_up = gather;
  return c;
}

}  // namespace loom
