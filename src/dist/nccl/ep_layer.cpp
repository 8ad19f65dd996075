// Expert parallelism's plan and run (include/loom/dist.hpp): route, the token rows (dist/ep_send),
// grouped NCCL send/recv of fixed segments, the local plan on the received token rows up to the
// weighted route rows, those rows back (dist/ep_return_rows), the slot-order combine
// (gemm/combine_rows). Built into libloom_dist (NCCL) apart from libloom.
#include <nccl.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "common/cuda_check.hpp"
#include "dist/ep_buffers.hpp"
#include "dist/ep_send_sm90.cuh"
#include "dist/placement.hpp"
#include "gemm/combine_rows_sm90.cuh"
#include "dist/nccl/ep_stage.hpp"
#include "loom/dist.hpp"
#include "pipeline/moe_pipeline.hpp"
#include "route/route_topk_sm90.cuh"

namespace loom {

// The exchange's stream and events (chunks > 1), made once on the device of the plan's first run.
// events: [0] the send rows packed, [1 + c] part c received, [1 + C + c] part c's outputs written,
// [1 + 2 C] every output returned.
struct EpStreams {
  std::mutex mutex;
  int device = -1;
  cudaStream_t exchange = nullptr;
  std::vector<cudaEvent_t> events;

  void ensure(int chunks) {
    std::lock_guard<std::mutex> lock(mutex);
    int dev = 0;
    LOOM_CUDA_CHECK(cudaGetDevice(&dev));
    if (exchange) {
      if (dev != device)
        throw Error("run_ep: the plan's exchange stream is on device " + std::to_string(device) + ", this run on " +
                    std::to_string(dev));
      return;
    }
    LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&exchange, cudaStreamNonBlocking));
    events.resize(size_t(2 * chunks + 2));
    for (cudaEvent_t& e : events) LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    device = dev;
  }
  ~EpStreams() {  // errors ignored: the context may already be gone at exit
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    if (exchange) cudaStreamDestroy(exchange);
  }
};

namespace {

void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw Error(std::string("run_ep: ") + what + ": " + ncclGetErrorString(r));
}

size_t carve(size_t& cursor, size_t bytes) {
  const size_t at = cursor;
  cursor += (bytes + 1023) / 1024 * 1024;
  return at;
}

template <class T>
T* at(void* ws, size_t offset) {
  return reinterpret_cast<T*>(static_cast<uint8_t*>(ws) + offset);
}

dist::EpTables tables(const EpPlan& p) {
  dist::EpTables t{};
  for (size_t e = 0; e < p.owner.size(); ++e) {
    t.owner[e] = uint16_t(p.owner[e]);
    t.local[e] = uint16_t(p.local_index[e]);
  }
  return t;
}

}  // namespace

EpPlan plan_ep(const Shape& max_shape, const Routing& routing, const Options& options, const ExpertParallel& ep) {
  EpPlan p = plan_ep(max_shape, routing, options, ep, current_device());
  if (p.chunks > 1) p.streams->ensure(p.chunks);  // here, not inside a caller's graph capture
  return p;
}

EpPlan plan_ep(const Shape& max_shape, const Routing& routing, const Options& options, const ExpertParallel& ep,
               const DeviceSpec& device) {
  validate(max_shape);
  validate(routing, max_shape);
  const Shape& s = max_shape;
  if (s.mode != Mode::ffn) throw Error("expert parallelism runs the ffn layer (mode ffn)");
  if (s.tokens < 1) throw Error("expert parallelism: the plan's most tokens must be at least 1");
  if (s.experts > kGpuMaxExperts || s.topk > kGpuMaxTopk)
    throw Error("expert parallelism: E <= " + std::to_string(kGpuMaxExperts) + " and k <= " +
                std::to_string(kGpuMaxTopk));
  dist::EpConfig c;
  c.size = ep.size;
  c.rank = ep.rank;
  c.first_expert = ep.first_expert;
  c.expert_count = ep.expert_count;
  c.expert_rank = ep.expert_rank;
  const dist::Placement pl = dist::make_placement(s.experts, c);
  dist::BufferSpec bs;
  bs.tokens = s.tokens;
  bs.topk = s.topk;
  bs.hidden = s.hidden;
  bs.dtype = s.dtype;  // bf16 rows, or the FP8 layer's codes and scales
  bs.ranks = ep.size;
  bs.tokens_per_peer = ep.tokens_per_peer;
  bs.rows_per_peer = ep.rows_per_peer;
  bs.chunks = ep.chunks;
  const dist::Buffers buf = dist::buffer_bytes(bs);
  const int comm_sms = ep.chunks > 1 ? (ep.comm_sms < 0 ? 16 : ep.comm_sms) : 0;
  if (comm_sms < 0 || comm_sms > device.sm_count / 2)
    throw Error("expert parallelism: comm_sms must be in [0, " + std::to_string(device.sm_count / 2) + "], got " +
                std::to_string(comm_sms));
  if (int64_t(ep.size) * std::max(buf.rows_per_peer, buf.tokens_per_peer * s.topk) * s.hidden >= (int64_t(1) << 31))
    throw Error("expert parallelism: P x rows_per_peer x H and P x tokens_per_peer x k x H must stay below 2^31 "
                "(32-bit row offsets)");

  EpPlan p;
  p.shape = s;
  p.routing = routing;
  p.options = options;
  p.ep = ep;
  p.route_returns = options.deterministic;
  p.tokens_per_peer = buf.tokens_per_peer;
  p.rows_per_peer = p.route_returns ? buf.rows_per_peer : buf.tokens_per_peer;
  p.chunks = ep.chunks;
  p.chunk_tokens = p.tokens_per_peer / p.chunks;
  p.chunk_rows = p.rows_per_peer / p.chunks;
  p.comm_sms = comm_sms;
  p.streams = std::make_shared<EpStreams>();
  p.local_experts = pl.local_experts;
  p.owner = pl.owner;
  p.local_index = pl.local_index;
  // The owner's run, once a part: the received token rows with the layer's k slots, -1 in the slots
  // of other ranks' experts and in padding rows. Deterministic, it stops at each route's weighted
  // row, GEMM 2's rounded to bf16, as the one-GPU combine sums them; else it is the whole layer on
  // the token rows, whose output rows go back. With parts, on the SMs NCCL's kernels leave.
  Shape ls{int64_t(ep.size) * p.chunk_tokens, s.hidden, s.inter, int64_t(pl.local_experts.size()), s.topk, Mode::ffn,
           s.dtype};
  Options lo = options;
  lo.debug_checks = false;  // the slots of other ranks' experts are dropped routes by design
  DeviceSpec ld = device;
  ld.sm_count -= comm_sms;
  p.local = plan_routed(ls, lo, ld);  // k slots, of which only this rank's experts are valid

  const int64_t R = s.tokens * s.topk, P = ep.size, H = s.hidden, k = s.topk;
  const int64_t tok_rows = P * p.tokens_per_peer, ret_rows = P * p.rows_per_peer;
  const bool fp8 = s.dtype == DType::fp8;
  const int64_t row_bytes = fp8 ? H : 2 * H, groups = (H + 127) / 128;
  const bool routes = p.route_returns;  // else no route return rows are made or sent
  size_t cur = 0;
  EpPlan::Layout& L = p.layout;
  L.topk_ids = carve(cur, size_t(R) * 4);
  L.topk_weights = carve(cur, size_t(R) * 4);
  L.nan_flags = carve(cur, size_t(s.tokens));
  L.dest = carve(cur, size_t(R) * 4);
  L.mark = carve(cur, size_t(R) * 4);
  L.tok_offsets = carve(cur, size_t(P + 2) * 4);
  L.tok_row = carve(cur, size_t(R) * 4);
  L.bucket = carve(cur, routes ? size_t(R) * 4 : 0);
  L.ret_offsets = carve(cur, routes ? size_t(P * p.chunks + 2) * 4 : 0);
  L.ret_row = carve(cur, routes ? size_t(R) * 4 : 0);
  L.row_token = carve(cur, size_t(R) * 4);
  L.row_weight = carve(cur, size_t(R) * 4);
  L.slice_counts = carve(cur, dist::ep_send_slice_count_bytes(s.tokens, s.topk, ep.size, p.chunks));
  L.status = carve(cur, sizeof(LayerStatus));
  L.scratch_status = carve(cur, sizeof(LayerStatus));
  L.overflow = carve(cur, 4);
  L.slot_row = carve(cur, size_t(R) * 4);
  L.send_x = carve(cur, size_t(tok_rows * row_bytes));
  L.send_scales = carve(cur, fp8 ? size_t(tok_rows * groups) * 4 : 0);
  L.send_ids = carve(cur, size_t(tok_rows * k) * 4);
  L.send_w = carve(cur, size_t(tok_rows * k) * 4);
  L.send_ret = carve(cur, routes ? size_t(tok_rows * k) * 4 : 0);
  L.recv_x = carve(cur, size_t(tok_rows * row_bytes));
  L.recv_scales = carve(cur, fp8 ? size_t(tok_rows * groups) * 4 : 0);
  L.recv_ids = carve(cur, size_t(tok_rows * k) * 4);
  L.recv_w = carve(cur, size_t(tok_rows * k) * 4);
  L.recv_ret = carve(cur, routes ? size_t(tok_rows * k) * 4 : 0);
  // The returned rows, then this rank's outputs to return: one block, so that with token returns
  // the combine reads a token's row from this rank's own experts past the returned ones.
  L.out_back = carve(cur, size_t(2 * ret_rows * H) * 2);
  L.out_local = L.out_back + size_t(ret_rows * H) * 2;
  L.local = carve(cur, workspace_bytes(p.local));
  L.total = cur;
  return p;
}

size_t workspace_bytes(const EpPlan& p) { return p.layout.total; }

std::string describe(const EpPlan& p) {
  dist::EpConfig c;
  c.size = p.ep.size;
  c.rank = p.ep.rank;
  c.expert_rank = p.ep.expert_rank;
  std::string parts;
  if (p.chunks > 1)
    parts = " in " + std::to_string(p.chunks) + " parts, the local GEMMs on " + std::to_string(p.local.sm_count) +
            " SMs";
  const EpPlan::Layout& L = p.layout;
  auto mib = [](size_t bytes) { return std::to_string((bytes + (1 << 19)) >> 20) + " MiB"; };
  const std::string memory = "workspace " + mib(L.total) + ": token rows sent " + mib(L.recv_x - L.send_x) +
                             ", received " + mib(L.out_back - L.recv_x) + ", outputs " +
                             mib(L.local - L.out_back) + " (both ways), the local plan's " +
                             mib(L.total - L.local) + ", routing tables " + mib(L.send_x);
  const std::string back = p.route_returns ? " and " + std::to_string(p.rows_per_peer) + " route outputs"
                                           : " (one output row back each, its routes summed by the owner)";
  return "expert parallelism: " + dist::describe(dist::make_placement(p.shape.experts, c)) + "; " +
         std::to_string(p.tokens_per_peer) + " tokens" + back + " per peer" + parts + "; " + describe(p.shape) +
         "\n" + memory + "\nlocal plan:\n" + describe(p.local);
}

void run_ep(const EpPlan& p, const Weights& local, const Inputs& in, void* output, void* workspace, ncclComm_t comm,
            cudaStream_t stream) {
  run_ep_stage(p, local, in, output, workspace, comm, stream, EpStage::all);
}

void run_ep_stage(const EpPlan& p, const Weights& local, const Inputs& in, void* output, void* workspace,
                  ncclComm_t comm, cudaStream_t stream, EpStage stage) {
  const bool all = stage == EpStage::all, do_dispatch = all || stage == EpStage::dispatch;
  const bool do_compute = all || stage == EpStage::compute, do_combine = all || stage == EpStage::combine;
  if (!all && p.chunks > 1) throw Error("run_ep: a stage alone is for plans in one part (their stages overlap)");
  const Shape& s = p.shape;
  const int T = int(in.tokens), k = int(s.topk), E = int(s.experts), P = p.ep.size, H = int(s.hidden);
  if (in.tokens < 0 || in.tokens > s.tokens)
    throw Error("run_ep: tokens must be in [0, " + std::to_string(s.tokens) + "], got " + std::to_string(in.tokens));
  if (!workspace || !comm) throw Error("run_ep: null workspace or communicator");
  const bool from_logits = in.router_logits != nullptr;
  if (T > 0 && (!in.hidden || !output || (!from_logits && (!in.topk_ids || !in.topk_weights))))
    throw Error("run_ep: hidden, the output and router_logits (or topk_ids with topk_weights) are required");
  int ranks = 0, me = 0;
  nccl_check(ncclCommCount(comm, &ranks), "ncclCommCount");
  nccl_check(ncclCommUserRank(comm, &me), "ncclCommUserRank");
  if (ranks != P || me != p.ep.rank)
    throw Error("run_ep: the communicator has rank " + std::to_string(me) + " of " + std::to_string(ranks) +
                ", the plan rank " + std::to_string(p.ep.rank) + " of " + std::to_string(P));

  const EpPlan::Layout& L = p.layout;
  const dist::EpTables tab = tables(p);
  const int32_t* ids = in.topk_ids;
  const float* weights = in.topk_weights;
  if (from_logits) {
    RouteTopkParams rp;
    rp.logits = in.router_logits;
    rp.bias = in.expert_bias;
    rp.topk_ids = at<int32_t>(workspace, L.topk_ids);
    rp.topk_weights = at<float>(workspace, L.topk_weights);
    rp.nan_flags = at<uint8_t>(workspace, L.nan_flags);
    rp.tokens = T;
    rp.experts = E;
    rp.topk = k;
    rp.routing = p.routing;
    if (T > 0 && do_dispatch) launch_route_topk(rp, stream, true);
    ids = rp.topk_ids;
    weights = rp.topk_weights;
  }
  dist::EpSendParams sp;
  sp.hidden = static_cast<const uint16_t*>(in.hidden);
  sp.ids = ids;
  sp.weights = weights;
  sp.nan_flags = from_logits ? at<uint8_t>(workspace, L.nan_flags) : nullptr;
  sp.tokens = T;
  sp.topk = k;
  sp.hidden_dim = H;
  sp.experts = E;
  sp.ranks = P;
  sp.chunks = p.chunks;
  sp.tokens_per_peer = int(p.tokens_per_peer);
  sp.token_returns = !p.route_returns;  // then no route cap: every route of a sent token is computed
  sp.rows_per_peer = int(p.route_returns ? p.rows_per_peer : p.tokens_per_peer * k);
  sp.dest = at<int32_t>(workspace, L.dest);
  sp.mark = at<int32_t>(workspace, L.mark);
  sp.tok_offsets = at<int32_t>(workspace, L.tok_offsets);
  sp.tok_row = at<int32_t>(workspace, L.tok_row);
  const bool routes = p.route_returns;  // else the route return rows' scratch has no room
  sp.bucket = routes ? at<int32_t>(workspace, L.bucket) : nullptr;
  sp.ret_offsets = routes ? at<int32_t>(workspace, L.ret_offsets) : nullptr;
  sp.ret_row = routes ? at<int32_t>(workspace, L.ret_row) : nullptr;
  sp.row_token = at<int32_t>(workspace, L.row_token);
  sp.row_weight = at<float>(workspace, L.row_weight);
  sp.slice_counts = at<int32_t>(workspace, L.slice_counts);
  sp.scratch_status = at<LayerStatus>(workspace, L.scratch_status);
  sp.status = at<LayerStatus>(workspace, L.status);
  const bool fp8 = s.dtype == DType::fp8;
  const int groups = (H + 127) / 128;
  const size_t row_bytes = fp8 ? size_t(H) : 2 * size_t(H);
  sp.fp8_rows = fp8;  // the rows travel as the codes and scales the owner would make of them
  if (fp8) {
    sp.send_scales = at<float>(workspace, L.send_scales);
    sp.recv_scales = at<float>(workspace, L.recv_scales);
  }
  sp.send_x = at<uint8_t>(workspace, L.send_x);
  sp.send_ids = at<int32_t>(workspace, L.send_ids);
  sp.send_w = at<float>(workspace, L.send_w);
  sp.send_ret = routes ? at<int32_t>(workspace, L.send_ret) : nullptr;
  sp.slot_row = at<int32_t>(workspace, L.slot_row);
  sp.overflow = at<uint32_t>(workspace, L.overflow);
  const int self = p.self_through_nccl ? -1 : me;
  sp.self_rank = self;  // this rank's own token rows straight into its receive buffers
  sp.recv_x = at<uint8_t>(workspace, L.recv_x);
  sp.recv_ids = at<int32_t>(workspace, L.recv_ids);
  sp.recv_w = at<float>(workspace, L.recv_w);
  sp.recv_ret = routes ? at<int32_t>(workspace, L.recv_ret) : nullptr;
  if (do_dispatch) dist::launch_ep_send(tab, sp, stream);

  // Every other peer's whole segments each way, part by part: sizes the host knows, so the exchange
  // is capturable (this rank's own segments never leave it: the kernels write them in place). Part
  // c's rows are [c][q][chunk rows] in every buffer (dist::ep_send_row); each route's output (or
  // token row's, when the owners sum) comes back to the row its token row named, where slot_row
  // finds it.
  const int C = p.chunks, tc = int(p.chunk_tokens), rc = int(p.chunk_rows);
  const size_t tok_part = size_t(P) * size_t(tc), ret_part = size_t(P) * size_t(rc);
  auto rows_at = [&](size_t offset, size_t row) { return at<uint16_t>(workspace, offset) + row * size_t(H); };
  auto token_rows_at = [&](size_t offset, size_t row) { return at<uint8_t>(workspace, offset) + row * row_bytes; };
  auto scales_at = [&](size_t offset, size_t row) { return at<float>(workspace, offset) + row * size_t(groups); };
  auto slots_at = [&](size_t offset, size_t row) { return at<int32_t>(workspace, offset) + row * size_t(k); };
  auto dispatch_part = [&](int c, cudaStream_t st) {
    if ((P == 1 && self >= 0) || tc == 0) return;
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (int q = 0; q < P; ++q) {
      if (q == self) continue;
      const size_t r = size_t(c) * tok_part + size_t(q) * size_t(tc), n = size_t(tc), nk = n * size_t(k);
      // Each buffer's segment to q out, and q's segment to this rank into the same rows of its
      // receive twin: the receiver posts the same list, so the pairs match in order.
      auto both = [&](size_t send, size_t recv, auto row_at, size_t count, ncclDataType_t type, const char* what) {
        nccl_check(ncclSend(row_at(send, r), count, type, q, comm, st), what);
        nccl_check(ncclRecv(row_at(recv, r), count, type, q, comm, st), what);
      };
      both(L.send_x, L.recv_x, token_rows_at, n * row_bytes, ncclUint8, "ncclSend/ncclRecv rows");
      if (fp8)
        both(L.send_scales, L.recv_scales, scales_at, n * size_t(groups), ncclFloat32, "ncclSend/ncclRecv scales");
      both(L.send_ids, L.recv_ids, slots_at, nk, ncclInt32, "ncclSend/ncclRecv ids");
      both(L.send_w, L.recv_w, slots_at, nk, ncclFloat32, "ncclSend/ncclRecv weights");
      if (p.route_returns)  // else the output comes back in the token row's own place
        both(L.send_ret, L.recv_ret, slots_at, nk, ncclInt32, "ncclSend/ncclRecv return rows");
    }
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
  };
  // This rank's experts on part c's token rows, up to each route's weighted row, then those rows
  // into the return segments (or the whole layer, when the owners sum); slots with id -1 (other
  // ranks' experts, padding) are dropped there.
  auto compute_part = [&](int c, cudaStream_t st) {
    const size_t r = size_t(c) * tok_part;
    void* lws = at<void>(workspace, L.local);
    Inputs li;
    li.tokens = int64_t(tok_part);
    li.hidden = fp8 ? nullptr : token_rows_at(L.recv_x, r);
    QuantisedHidden qh;  // FP8: the codes and scales that travelled
    qh.codes = token_rows_at(L.recv_x, r);
    qh.scales = scales_at(L.recv_scales, r);
    li.topk_ids = slots_at(L.recv_ids, r);
    li.topk_weights = reinterpret_cast<const float*>(slots_at(L.recv_w, r));
    if (li.tokens == 0) return;
    uint16_t* out_part = rows_at(L.out_local, size_t(c) * ret_part);
    if (!p.route_returns) {  // the layer's output on the token rows is what goes back
      run_stages(p.local, local, li, out_part, lws, st, Stages::all, nullptr, fp8 ? &qh : nullptr);
      return;
    }
    run_stages(p.local, local, li, out_part, lws, st, Stages::route_rows, nullptr, fp8 ? &qh : nullptr);
    dist::EpReturnParams rp;
    rp.recv_ret = slots_at(L.recv_ret, r);
    rp.route_row = at<int32_t>(lws, p.local.layout.route_row);
    rp.y = at<uint16_t>(lws, p.local.layout.y);
    rp.rows = int(tok_part);
    rp.topk = k;
    rp.hidden_dim = H;
    rp.tokens_per_source = tc;
    rp.rows_per_source = rc;
    rp.out = out_part;
    rp.self_source = self;  // this rank's own routes straight to where its returns land
    rp.self_out = rows_at(L.out_back, size_t(c) * ret_part);
    dist::launch_ep_return_rows(rp, st, true);
  };
  auto return_part = [&](int c, cudaStream_t st) {
    if ((P == 1 && self >= 0) || rc == 0) return;
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (int q = 0; q < P; ++q) {
      if (q == self) continue;
      const size_t r = size_t(c) * ret_part + size_t(q) * size_t(rc), n = size_t(rc) * size_t(H);
      nccl_check(ncclSend(rows_at(L.out_local, r), n, ncclBfloat16, q, comm, st), "ncclSend outputs");
      nccl_check(ncclRecv(rows_at(L.out_back, r), n, ncclBfloat16, q, comm, st), "ncclRecv outputs");
    }
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
  };
  if (C == 1) {
    if (do_dispatch) dispatch_part(0, stream);
    if (do_compute) compute_part(0, stream);
    if (do_combine) return_part(0, stream);
  } else {
    // NCCL on the exchange stream, in the same order on every rank: all parts out, then each
    // part's outputs back once its GEMMs are done. The GEMMs stay on `stream`, so part c + 1's
    // rows travel while part c computes, and part c's outputs travel while part c + 1 computes.
    if (!p.streams) throw Error("run_ep: the plan has no exchange stream (make plans with plan_ep)");
    p.streams->ensure(C);
    const cudaStream_t ex = p.streams->exchange;
    const std::vector<cudaEvent_t>& ev = p.streams->events;
    LOOM_CUDA_CHECK(cudaEventRecord(ev[0], stream));
    LOOM_CUDA_CHECK(cudaStreamWaitEvent(ex, ev[0], 0));
    for (int c = 0; c < C; ++c) {
      dispatch_part(c, ex);
      LOOM_CUDA_CHECK(cudaEventRecord(ev[size_t(1 + c)], ex));
    }
    for (int c = 0; c < C; ++c) {
      LOOM_CUDA_CHECK(cudaStreamWaitEvent(stream, ev[size_t(1 + c)], 0));
      compute_part(c, stream);
      LOOM_CUDA_CHECK(cudaEventRecord(ev[size_t(1 + C + c)], stream));
    }
    for (int c = 0; c < C; ++c) {
      LOOM_CUDA_CHECK(cudaStreamWaitEvent(ex, ev[size_t(1 + C + c)], 0));
      return_part(c, ex);
    }
    LOOM_CUDA_CHECK(cudaEventRecord(ev[size_t(1 + 2 * C)], ex));
    LOOM_CUDA_CHECK(cudaStreamWaitEvent(stream, ev[size_t(1 + 2 * C)], 0));
  }

  CombineRowsParams cp;
  cp.y_bf16 = at<const uint16_t>(workspace, L.out_back);
  cp.route_row = sp.slot_row;
  cp.tokens = T;
  cp.topk = k;
  cp.cols = H;
  cp.out_bf16 = static_cast<uint16_t*>(output);
  if (T > 0 && do_combine) launch_combine_rows(cp, stream, true);
  if (all && p.options.debug_checks) {
    const EpStatus st = read_status(p, workspace, stream);
    if (st.dropped_routes || st.nan_tokens || st.overflow_routes)
      throw Error("run_ep: " + std::to_string(st.dropped_routes) + " routes with ids outside [0, " + std::to_string(E) +
                  "), " + std::to_string(st.nan_tokens) + " tokens with NaN logits, " +
                  std::to_string(st.overflow_routes) + " routes beyond a peer's caps");
  }
}

EpStatus read_status(const EpPlan& p, const void* workspace, cudaStream_t stream) {
  LayerStatus ls;
  uint32_t over = 0;
  const auto* ws = static_cast<const uint8_t*>(workspace);
  LOOM_CUDA_CHECK(cudaMemcpyAsync(&ls, ws + p.layout.status, sizeof ls, cudaMemcpyDeviceToHost, stream));
  LOOM_CUDA_CHECK(cudaMemcpyAsync(&over, ws + p.layout.overflow, sizeof over, cudaMemcpyDeviceToHost, stream));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
  EpStatus st;
  st.nan_tokens = ls.nan_tokens;
  st.dropped_routes = ls.dropped_routes;
  st.overflow_routes = over;
  return st;
}

}  // namespace loom
