// Expert parallelism over NCCL (issue 49): P ranks, one GPU each, each owning some of the E experts.
// A rank's run routes its own tokens, sends every route to the rank that owns its expert, runs its
// experts on the rows it received (through a plan of its own experts), returns the outputs and
// combines each token's rows in slot order. The same contract as run(): device pointers, one
// stream, no host synchronisation, capturable in a CUDA graph. The NCCL communicator is the
// caller's (loom never creates or owns one); every rank calls run_ep() for the same run.
//
//   loom::EpPlan p = loom::plan_ep(shape, routing, options, ep);  // shape: this rank's most tokens, all E
//   cudaMalloc(&ws, loom::workspace_bytes(p));
//   loom::run_ep(p, local_weights, inputs, out, ws, comm, stream);  // local_weights: this rank's experts
//
// The first form: each token travels once to each rank that owns one of its experts (its k slots'
// local ids, -1 where another rank owns the expert, and weights beside it), by grouped
// ncclSend/ncclRecv of fixed segments of tokens_per_peer rows per peer, full segments whatever the
// counts (graph capture needs sizes known on the host). The owner runs its experts on them and
// returns one row per route (Options::deterministic) or per token row (its routes summed), in
// fixed segments. Both segment sizes are tunable caps: routes past them are not sent, and
// EpStatus::overflow_routes counts them. Rows travel in bf16, or for an FP8 layer as codes and
// 1x128 scales (the sender quantises; the owner uses them as they are). A rank's own segments
// never leave it. With chunks > 1 the exchange runs on a second stream that run_ep forks from the
// caller's and joins back, so one part's rows travel while another's GEMMs run. Not yet measured
// on several GPUs (docs/architecture.md).
#pragma once

#include <nccl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/loom.hpp"

namespace loom {

struct ExpertParallel {
  int size = 1;  // P
  int rank = 0;  // this rank, in [0, P); its NCCL rank in the communicator
  // This rank's experts as a range [first_expert, first_expert + expert_count) (both or neither,
  // -1 = not given); without a map it must be the rank's block of the contiguous placement.
  int64_t first_expert = -1, expert_count = -1;
  // Every expert's owner, [E] ranks in [0, P); empty: contiguous blocks (rank r owns experts
  // [r E / P, (r + 1) E / P)).
  std::vector<int32_t> expert_rank;
  // Token rows a rank sends to one peer per run. 0: twice a balanced share, ceil(2 T k / P) rounded
  // up to 16 rows, at most T (dist/ep_buffers.hpp).
  int64_t tokens_per_peer = 0;
  // Route outputs one peer returns to a rank per run (deterministic mode; else one row per token
  // row comes back). 0: the same share, at most T k.
  int64_t rows_per_peer = 0;
  // The exchange and the local experts in `chunks` parts (1 to 8): part c + 1's rows travel while
  // part c's GEMMs run. The i-th token to a peer belongs to part i mod chunks, so a partly filled
  // segment spreads over all parts; both caps are rounded up to chunks times a multiple of 4.
  int chunks = 1;
  // With chunks > 1: SMs the local GEMMs leave free for NCCL's kernels (persistent GEMMs fill
  // every SM they are planned for). -1: 16.
  int comm_sms = -1;
};

struct EpStatus {
  uint32_t nan_tokens = 0;       // this rank's tokens with a NaN router logit
  uint32_t dropped_routes = 0;   // this rank's routes whose id was outside [0, E)
  uint32_t overflow_routes = 0;  // this rank's routes past a peer's caps: not sent, their rows add nothing
};

struct EpStreams;  // the exchange's stream and events when chunks > 1 (src/dist/nccl/ep_layer.cpp)

struct EpPlan {
  Shape shape;  // this rank's most tokens per run; experts = all E
  Routing routing;
  Options options;
  ExpertParallel ep;
  // Options::deterministic: the owner returns one row per route (weighted, rounded to bf16) and the
  // sender sums a token's rows in slot order, bit for bit the one-GPU deterministic layer. Else
  // the owner sums each token's routes to its experts (its local layer's output) and returns one
  // row per (token, owner), fewer bytes back; rows_per_peer is then tokens_per_peer.
  bool route_returns = false;
  int64_t tokens_per_peer = 0, rows_per_peer = 0;  // with chunks > 1, chunks times a multiple of 4
  int chunks = 1;
  int64_t chunk_tokens = 0, chunk_rows = 0;  // the caps / chunks: a peer's rows in one part
  int comm_sms = 0;        // SMs left to NCCL (0 when chunks = 1)
  std::vector<int32_t> local_experts;  // this rank's experts (global ids) in local order
  std::vector<int32_t> owner, local_index;  // [E]
  Plan local;  // this rank's experts over one part's P x chunk_tokens token rows of k slots
  std::shared_ptr<EpStreams> streams;  // created on the plan's device; shared by the plan's copies
  // A rank's own segments never leave it: the send kernels write them into its receive buffers and
  // the owner's into its returned rows. true: they travel through NCCL as a peer's do (a send to
  // itself), so one GPU's tests run the NCCL exchange too.
  bool self_through_nccl = false;
  struct Layout {
    size_t topk_ids, topk_weights, nan_flags, dest, mark, tok_offsets, tok_row, bucket, ret_offsets, ret_row,
        row_token, row_weight, slice_counts, status, scratch_status, overflow, slot_row, send_x, send_scales,
        send_ids, send_w, send_ret, recv_x, recv_scales, recv_ids, recv_w, recv_ret, out_local, out_back, local,
        total;
  } layout{};
};

// Throws loom::Error for an invalid shape, routing or placement (docs/api.md: expert parallelism).
EpPlan plan_ep(const Shape& max_shape, const Routing& routing, const Options& options, const ExpertParallel& ep);
// For a described device (device_spec("h200")), without one present: what a rank would run.
EpPlan plan_ep(const Shape& max_shape, const Routing& routing, const Options& options, const ExpertParallel& ep,
               const DeviceSpec& device);
size_t workspace_bytes(const EpPlan& p);
std::string describe(const EpPlan& p);

// local: this rank's experts' weights, [E_local, ...] in local order (EpPlan::local_experts), laid
// out as Weights describes. output: bf16 [T, H]. Enqueues NCCL calls on `stream` through `comm`
// (chunks > 1: on the plan's exchange stream, ordered after and before `stream`'s work by events;
// runs of one plan must then be ordered, as they are on one stream).
void run_ep(const EpPlan& p, const Weights& local, const Inputs& in, void* output, void* workspace, ncclComm_t comm,
            cudaStream_t stream);

// Synchronous: the status of the last run on `stream`.
EpStatus read_status(const EpPlan& p, const void* workspace, cudaStream_t stream);

}  // namespace loom
