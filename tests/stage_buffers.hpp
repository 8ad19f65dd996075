// GPU tests: device buffers for the outputs of the routing, dispatch and quantise stages of one
// batch, poisoned, and the stage parameters that point at them.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "bench/device_buffer.hpp"
#include "common/cuda_check.hpp"
#include "gpu_test.hpp"
#include "dispatch/dispatch_sm90.cuh"
#include "loom/types.hpp"
#include "quant/quant_gather_sm90.cuh"
#include "route/route_topk_sm90.cuh"

namespace loom::test {

inline void poison(std::initializer_list<bench::DeviceBuffer*> buffers, int byte) {
  for (bench::DeviceBuffer* b : buffers) fill(b->get(), byte, b->bytes());
}

// The routing outputs of T tokens x k slots (ids, weights, NaN flags), every byte set to `byte`.
struct RouteOutputs {
  bench::DeviceBuffer ids, weights, flags;
  RouteOutputs(int T, int k, int byte)
      : ids(size_t(T) * size_t(k) * 4), weights(size_t(T) * size_t(k) * 4), flags(static_cast<size_t>(T)) {
    poison({&ids, &weights, &flags}, byte);
  }
  // Routing T tokens' logits over E experts into these buffers.
  RouteTopkParams params(const float* logits, int T, int E, int k, const Routing& routing) {
    RouteTopkParams p;
    p.logits = logits;
    p.topk_ids = ids.as<int32_t>();
    p.topk_weights = weights.as<float>();
    p.nan_flags = flags.as<uint8_t>();
    p.tokens = T;
    p.experts = E;
    p.topk = k;
    p.routing = routing;
    return p;
  }
};

// The dispatch outputs of T tokens x k slots over E experts, every byte set to `byte`.
struct DispatchOutputs {
  bench::DeviceBuffer offsets, route_row, row_token, row_weight, status, slice_counts;
  int tokens, topk, experts;
  DispatchOutputs(int T, int k, int E, int byte)
      : offsets(size_t(E + 1) * 4),
        route_row(size_t(T) * size_t(k) * 4),
        row_token(size_t(T) * size_t(k) * 4),
        row_weight(size_t(T) * size_t(k) * 4),
        status(sizeof(LayerStatus)),
        slice_counts(std::max<size_t>(4, dispatch_slice_count_bytes(T, k, E))),
        tokens(T),
        topk(k),
        experts(E) {
    poison({&offsets, &route_row, &row_token, &row_weight, &status, &slice_counts}, byte);
  }
  // The dispatch of these top-k ids and weights (and NaN flags, or null) into these buffers.
  DispatchParams params(const int32_t* ids, const float* weights, const uint8_t* nan_flags) {
    DispatchParams p;
    p.topk_ids = ids;
    p.topk_weights = weights;
    p.nan_flags = nan_flags;
    p.tokens = tokens;
    p.topk = topk;
    p.experts = experts;
    p.offsets = offsets.as<int32_t>();
    p.route_row = route_row.as<int32_t>();
    p.row_token = row_token.as<int32_t>();
    p.row_weight = row_weight.as<float>();
    p.status = status.as<LayerStatus>();
    p.slice_counts = slice_counts.as<int32_t>();
    return p;
  }
};

// The quantise outputs: `rows` rows of H codes, their scales ([ceil(H/128)][rows]) and a T x
// zero_cols fp32 output to clear, every byte set to `byte`.
struct QuantOutputs {
  bench::DeviceBuffer codes, scales, zero;
  int64_t rows;
  int zero_cols;
  QuantOutputs(int64_t rows_, int H, int T, int zero_cols_, int byte)
      : codes(size_t(rows_) * size_t(H)),
        scales(size_t(scale_floats((H + 127) / 128, rows_)) * 4),  // either scale layout
        zero(size_t(T) * size_t(zero_cols_) * 4),
        rows(rows_),
        zero_cols(zero_cols_) {
    poison({&codes, &scales, &zero}, byte);
  }
  // Quantising T tokens of H bf16 values into these buffers: by route_row into sorted rows, or in
  // token order (route_row null).
  QuantGatherParams params(const uint16_t* hidden, const int32_t* route_row, int T, int H, int k) {
    QuantGatherParams p;
    p.hidden = hidden;
    p.route_row = route_row;
    p.tokens = T;
    p.hidden_dim = H;
    p.topk = k;
    p.padded_rows = rows;
    p.a_sorted = codes.as<uint8_t>();
    p.a_scales = scales.as<float>();
    p.zero_out = zero.as<float>();
    p.zero_cols = zero_cols;
    return p;
  }
};

}  // namespace loom::test
