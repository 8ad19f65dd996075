// Each (token, owner) pair's row into the owner's segment, with its k slots' local ids, weights and
// return rows, every route's slot_row, and the padding of every segment past its rank's count
// (ep_send_sm90.cuh), from the layout ep_owner and the dispatch left in global memory. One launch,
// two kinds of block (ep_pack_device.cuh):
//   blocks [0, pack)        a warp per route (pack_route)
//   blocks [pack, pack+pad) a thread per (segment row, slot) (pad_slot); thread 0 of the first
//                           also writes the route returns' overflow
// The two write disjoint rows (positions below and at or past a rank's count), so they need no order.
#include <algorithm>

#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "dist/ep_pack_device.cuh"
#include "dist/ep_send_sm90.cuh"
#include "ptx/pdl.cuh"

namespace loom::dist {
namespace {

using namespace pack_detail;

// The layout in global memory: dest and mark from ep_owner, the positions and counts from the
// dispatch over the marks.
struct GlobalLayout {
  static constexpr bool kPackCountsOverflow = true;
  const EpSendParams& p;
  __device__ int32_t dest(int s) const { return p.dest[s]; }
  __device__ bool carries(int s) const { return p.mark[s] == p.dest[s]; }
  __device__ int position(int s, int q) const { return p.tok_row[s] - p.tok_offsets[q]; }
  __device__ int count(int q) const { return p.tok_offsets[q + 1] - p.tok_offsets[q]; }
};

__global__ void __launch_bounds__(kThreads)
    ep_pack_tokens_kernel(const __grid_constant__ EpTables t, const EpSendParams p, int pack_blocks) {
  // Launched with PDL: let the next kernel launch, then wait for the previous one's writes
  // before any global access.
  ptx::pdl_launch_dependents();
  ptx::pdl_wait();
  const GlobalLayout lay{p};
  const int b = int(blockIdx.x);
  if (b < pack_blocks) {
    const int s = b * kWarps + int(threadIdx.x) / 32;
    if (s < p.tokens * p.topk) pack_route(t, p, lay, s, int(threadIdx.x) % 32);
    return;
  }
  const int j = (b - pack_blocks) * kThreads + int(threadIdx.x);
  if (j == 0 && !p.token_returns) {
    // Routes whose token was beyond a token cap (bucket P C), and routes beyond a return cap.
    const int buckets = p.ranks * p.chunks, per_part = p.rows_per_peer / p.chunks;
    uint32_t over = uint32_t(p.ret_offsets[buckets + 1] - p.ret_offsets[buckets]);
    for (int q = 0; q < buckets; ++q)
      over += uint32_t(max(0, p.ret_offsets[q + 1] - p.ret_offsets[q] - per_part));
    *p.overflow = over;
  }
  pad_slot(p, lay, j);
}

}  // namespace

void launch_ep_pack_tokens(const EpTables& t, const EpSendParams& p, cudaStream_t stream, bool pdl) {
  const int routes = p.tokens * p.topk, slots = p.ranks * p.tokens_per_peer * p.topk;
  const int pack = (routes + kWarps - 1) / kWarps, pad = std::max(1, (slots + kThreads - 1) / kThreads);
  launch_kernel(ep_pack_tokens_kernel, dim3(unsigned(pack + pad)), dim3(kThreads), 0, stream, pdl, t, p, pack);
}

}  // namespace loom::dist
