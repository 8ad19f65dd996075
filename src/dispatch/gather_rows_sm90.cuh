// The BF16 layer's activations (issue 47): each token's bf16 hidden row copied to its routes'
// expert-sorted rows, as the BF16 GEMM's A reads them by TMA. No quantisation: the rows are the
// hidden rows bit for bit. Dropped routes (route_row < 0) copy nothing.
//
// Host-includable: plain declarations only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace loom {

struct GatherRowsParams {
  const uint16_t* hidden = nullptr;    // [T, H] bf16 bits, 16-byte aligned
  const int32_t* route_row = nullptr;  // [T * k]: the dispatch's sorted row of each route, or -1
  uint16_t* rows = nullptr;            // [padded rows, H] bf16 bits, 16-byte aligned
  int tokens = 0, topk = 0, hidden_dim = 0;  // hidden_dim a multiple of 8
};

// One warp per token: its row read once, written to each of its routes' rows. Launched with PDL
// when asked (it waits for the dispatch before reading route_row). tokens = 0 enqueues nothing.
// Throws loom::Error on bad sizes or pointers.
void launch_gather_rows(const GatherRowsParams& p, cudaStream_t stream, bool pdl);

}  // namespace loom
