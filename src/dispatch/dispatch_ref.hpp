// CPU reference of the dispatch layout: per-expert counts, exclusive offsets, and where each
// (token, slot) route lands in expert-sorted order.
//
// Sorting is stable: inside one expert, rows follow ascending token, then ascending slot.
// Routes whose expert id is outside [0, E) are dropped (route_row = -1) and counted.
#pragma once

#include <cstdint>
#include <vector>

namespace loom {

struct Dispatch {
  int64_t experts = 0;
  int64_t routes = 0;              // T * k, dropped ones included
  int64_t dropped = 0;             // routes with an out-of-range expert id
  std::vector<int32_t> counts;     // [E]   routes per expert
  std::vector<int32_t> offsets;    // [E+1] exclusive scan of counts; offsets[E] = routes - dropped
  std::vector<int32_t> route_row;  // [T*k] sorted row of route t*k+j, or -1 when dropped
  std::vector<int32_t> row_route;  // [offsets[E]] inverse: route index t*k+j held by each sorted row
};

// ids: [T, k] expert ids.
Dispatch dispatch_ref(const int32_t* ids, int64_t tokens, int64_t topk, int64_t experts);

// The token masks of these ids (RouteTopkParams::token_masks): [ceil(T/32), E] words, bit t % 32 of
// word (t / 32, e) set when token t routes to expert e. Out-of-range ids set no bit.
std::vector<uint32_t> token_masks_ref(const int32_t* ids, int64_t tokens, int64_t topk, int64_t experts);

// The hit list of a layout (DispatchParams::hit_list) as int32 quads: {experts with rows, 0, 0, 0},
// then (expert, first row, rows, 0) of each of them, ascending.
std::vector<int32_t> hit_list_ref(const std::vector<int32_t>& offsets);

}  // namespace loom
