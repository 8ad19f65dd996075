// The whole send side in one launch for small batches with token returns (ep_send_sm90.cuh):
// every CTA builds the token layout of the whole batch in shared memory (each route's owner, each
// token's owner set, each token's position among the tokens to each rank, the per-rank counts),
// then does its share of ep_pack_tokens' work from it (ep_pack_device.cuh). The batch is small
// (ep_send_small_fits), so building the layout again in every CTA costs less than the two
// launches it replaces (ep_owner and the dispatch over the marks). CTA 0 also writes the status
// and the overflow, with plain stores.
#include <algorithm>

#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "dist/ep_pack_device.cuh"
#include "dist/ep_send_sm90.cuh"
#include "ptx/pdl.cuh"

namespace loom::dist {
namespace {

using namespace pack_detail;

constexpr int kMaxRanks = 64;  // a token's owner set is one 64-bit mask

// The layout in shared memory.
struct SmemLayout {
  static constexpr bool kPackCountsOverflow = false;  // the CTAs count the overflow themselves
  const int8_t* own;    // [T k] each route's owner, -1 when its id is out of range
  const int16_t* pos;   // [T, P] each token's position among the tokens to each rank it has a route to
  const int32_t* cnt;   // [P] the tokens to each rank
  int topk, ranks;
  __device__ int32_t dest(int s) const { return own[s]; }
  __device__ bool carries(int s) const {
    for (int j = s - s % topk; j < s; ++j)
      if (own[j] == own[s]) return false;
    return true;
  }
  __device__ int position(int s, int q) const { return pos[(s / topk) * ranks + q]; }
  __device__ int count(int q) const { return cnt[q]; }
};

__host__ __device__ inline size_t small_smem_bytes(int tokens, int topk, int ranks) {
  return size_t(tokens) * 8 + size_t(tokens) * size_t(ranks) * 2 + size_t(tokens) * size_t(topk);
}

__global__ void __launch_bounds__(kThreads)
    ep_send_small_kernel(const __grid_constant__ EpTables t, const EpSendParams p, int pack_blocks) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int T = p.tokens, k = p.topk, P = p.ranks, R = T * k;
  uint64_t* mask = reinterpret_cast<uint64_t*>(smem);                  // [T] each token's owner set
  int16_t* pos = reinterpret_cast<int16_t*>(smem + size_t(T) * 8);     // [T, P]
  int8_t* own = reinterpret_cast<int8_t*>(pos + size_t(T) * size_t(P));  // [T k]
  __shared__ int32_t cnt[kMaxRanks];
  __shared__ uint32_t drops, nans, over;
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  if (tid == 0) drops = nans = over = 0;
  // Launched with PDL: let the next kernel launch, then wait for the previous one's writes (the
  // routing's ids and weights) before any global access.
  ptx::pdl_launch_dependents();
  ptx::pdl_wait();
  __syncthreads();  // the counters zeroed
  uint32_t my_drops = 0, my_nans = 0;
  for (int s = tid; s < R; s += kThreads) {
    const int32_t e = p.ids[s];
    const int q = e >= 0 && e < p.experts ? int(t.owner[e]) : -1;
    own[s] = int8_t(q);
    my_drops += q < 0;
  }
  if (p.nan_flags)
    for (int i = tid; i < T; i += kThreads) my_nans += p.nan_flags[i] != 0;
  if (my_drops) atomicAdd(&drops, my_drops);
  if (my_nans) atomicAdd(&nans, my_nans);
  __syncthreads();  // own[] complete
  for (int i = tid; i < T; i += kThreads) {
    uint64_t m = 0;
    for (int j = 0; j < k; ++j) {
      const int q = own[i * k + j];
      if (q >= 0) m |= uint64_t(1) << q;
    }
    mask[i] = m;
  }
  __syncthreads();  // mask[] complete
  // Rank q's tokens in token order, by one warp: 32 tokens a step, each position its lower lanes'
  // count plus the steps before. The tokens past the cap are not sent: their routes to q overflow.
  for (int q = warp; q < P; q += kWarps) {
    int run = 0;
    uint32_t my_over = 0;
    for (int t0 = 0; t0 < T; t0 += 32) {  // warp-uniform trip count: every lane reaches the ballot
      const int i = t0 + lane;
      const bool to_q = i < T && (mask[i] >> q & 1u);
      const unsigned bits = __ballot_sync(0xffffffffu, to_q);
      if (to_q) {
        const int at = run + __popc(bits & ((1u << lane) - 1u));
        pos[i * P + q] = int16_t(at);
        if (at >= p.tokens_per_peer)
          for (int j = 0; j < k; ++j) my_over += own[i * k + j] == q;
      }
      run += __popc(bits);
    }
    if (lane == 0) cnt[q] = run;
    if (my_over) atomicAdd(&over, my_over);
  }
  __syncthreads();  // pos[], cnt[] and the counts complete
  if (blockIdx.x == 0 && tid == 0) {
    LayerStatus st;
    st.nan_tokens = nans;
    st.dropped_routes = drops;
    *p.status = st;
    *p.overflow = over;
  }
  const SmemLayout lay{own, pos, cnt, k, P};
  const int b = int(blockIdx.x);
  if (b < pack_blocks) {
    const int s = b * kWarps + warp;
    if (s < R) pack_route(t, p, lay, s, lane);
    return;
  }
  pad_slot(p, lay, (b - pack_blocks) * kThreads + tid);
}

}  // namespace

bool ep_send_small_fits(const EpSendParams& p) {
  return p.token_returns && p.tokens >= 1 && p.ranks <= kMaxRanks && p.tokens * p.topk <= kEpSendSmallRoutes &&
         small_smem_bytes(p.tokens, p.topk, p.ranks) <= kEpSendSmallSmem;
}

void launch_ep_send_small(const EpTables& t, const EpSendParams& p, cudaStream_t stream, bool pdl) {
  if (!ep_send_small_fits(p)) throw Error("ep_send_small: the batch is beyond the one-launch form's range");
  const int routes = p.tokens * p.topk, slots = p.ranks * p.tokens_per_peer * p.topk;
  const int pack = (routes + kWarps - 1) / kWarps, pad = std::max(1, (slots + kThreads - 1) / kThreads);
  launch_kernel(ep_send_small_kernel, dim3(unsigned(pack + pad)), dim3(kThreads),
                small_smem_bytes(p.tokens, p.topk, p.ranks), stream, pdl, t, p, pack);
}

}  // namespace loom::dist
