// The dispatch layout and the quantise+gather into expert-sorted rows in one launch, for routes
// that come from the routing kernel (each token's k ids are distinct, so an expert's routes are a
// set of tokens).
//
// Every CTA builds the whole layout in shared memory: a bit mask of tokens per expert (counted from
// the top-k ids, or copied from the routing kernel's token masks when DispatchParams::token_masks is
// given), per-32-token prefix popcounts, and the expert offsets (a scan over experts). A route's
// sorted row is then offsets[e] + the number of lower tokens in e's mask, exactly dispatch_ref's
// stable order, so each CTA knows every row without waiting for another. The grid writes the
// dispatch outputs (route_row, row_token, row_weight: each route once; CTA 0 the offsets and
// status) and quantises its share of (token, 128-group) units into the sorted rows (quant_gather's
// arithmetic, bit for bit), and clears the fast combine's output. One kernel boundary less than
// dispatch -> quantise.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "dispatch/dispatch_sm90.cuh"
#include "quant/quant_gather_sm90.cuh"

namespace loom {

// Whether the fused kernel takes this batch (its masks fit shared memory).
bool dispatch_quant_fits(int64_t tokens, int64_t topk, int64_t experts);

// dispatch: as launch_dispatch (ids distinct per token; out-of-range ids are dropped and counted).
// quant: gathered mode, route_row == dispatch.route_row, padded_rows >= T*k rounded to 4.
// grid_ctas: CTAs to launch (the SM count: each CTA builds the layout once, then strides).
// after_wait_only_kernel: true when the kernel launched just before this one in the stream executes
// its PDL wait before it triggers its dependents (the routing kernels do): everything before that
// kernel has then completed when this one starts, so the hidden rows (which that kernel does not
// write) are quantised and the output cleared before this kernel's own wait. False: after it.
void launch_dispatch_quant(const DispatchParams& dispatch, const QuantGatherParams& quant, int grid_ctas,
                           cudaStream_t stream, bool pdl, bool after_wait_only_kernel);

}  // namespace loom
