// What the C ABIs (loom_c.h, loom_dist_c.h) share: the exception-to-status guard and the
// conversions between the C structs and the C++ API's. Each library keeps its own last error.
#pragma once

#include <algorithm>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "loom/loom.hpp"
#include "loom/loom_c.h"

namespace loom::capi {

inline loom_status_code fail(std::string& last_error, loom_status_code code, const char* what) noexcept {
  try {
    last_error = what;
  } catch (...) {  // no memory for the message: the code still says what failed
    last_error.clear();
  }
  return code;
}

// Runs f, mapping exceptions to codes; clears the last error on success.
template <class F>
loom_status_code guarded(std::string& last_error, F&& f) {
  try {
    f();
    last_error.clear();
    return LOOM_OK;
  } catch (const CudaError& e) {
    return fail(last_error, LOOM_ERROR_CUDA, e.what());
  } catch (const Error& e) {
    return fail(last_error, LOOM_ERROR_INVALID_ARGUMENT, e.what());
  } catch (const std::bad_alloc&) {
    return fail(last_error, LOOM_ERROR_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception& e) {
    return fail(last_error, LOOM_ERROR_INTERNAL, e.what());
  } catch (...) {
    return fail(last_error, LOOM_ERROR_INTERNAL, "unknown exception");
  }
}

inline void require(const void* p, const char* what) {
  if (p == nullptr) throw Error(std::string(what) + " is NULL");
}

inline Shape to_shape(const loom_shape_t& c) {
  Shape s;
  s.tokens = c.tokens;
  s.hidden = c.hidden;
  s.inter = c.inter;
  s.experts = c.experts;
  s.topk = c.topk;
  if (c.mode == LOOM_MODE_SINGLE)
    s.mode = Mode::single;
  else if (c.mode == LOOM_MODE_FFN)
    s.mode = Mode::ffn;
  else
    throw Error("mode must be LOOM_MODE_SINGLE or LOOM_MODE_FFN, got " + std::to_string(c.mode));
  if (c.dtype == LOOM_DTYPE_FP8)
    s.dtype = DType::fp8;
  else if (c.dtype == LOOM_DTYPE_BF16)
    s.dtype = DType::bf16;
  else
    throw Error("dtype must be LOOM_DTYPE_FP8 or LOOM_DTYPE_BF16, got " + std::to_string(c.dtype));
  return s;
}

inline loom_shape_t from_shape(const Shape& s) {
  loom_shape_t c{};
  c.tokens = s.tokens;
  c.hidden = s.hidden;
  c.inter = s.inter;
  c.experts = s.experts;
  c.topk = s.topk;
  c.mode = s.mode == Mode::ffn ? LOOM_MODE_FFN : LOOM_MODE_SINGLE;
  c.dtype = s.dtype == DType::bf16 ? LOOM_DTYPE_BF16 : LOOM_DTYPE_FP8;
  return c;
}

inline Routing to_routing(const loom_routing_t& c) {
  Routing r;
  if (c.scoring == LOOM_SCORING_SOFTMAX)
    r.scoring = Scoring::softmax;
  else if (c.scoring == LOOM_SCORING_SIGMOID)
    r.scoring = Scoring::sigmoid;
  else
    throw Error("scoring must be LOOM_SCORING_SOFTMAX or LOOM_SCORING_SIGMOID, got " + std::to_string(c.scoring));
  r.softcap = c.softcap;
  r.renormalize = c.renormalize != 0;
  r.n_group = c.n_group;
  r.topk_group = c.topk_group;
  r.scale = c.scale;
  return r;
}

inline Options to_options(const loom_options_t& c) {
  Options o;
  o.deterministic = c.deterministic != 0;
  o.pdl = c.pdl != 0;
  o.debug_checks = c.debug_checks != 0;
  o.fuse_small_batch = c.fuse_small_batch != 0;
  o.expert_bins = c.expert_bins != 0;
  o.gemm_config = c.gemm_config ? c.gemm_config : "";
  o.gemm2_config = c.gemm2_config ? c.gemm2_config : "";
  return o;
}

inline Weights to_weights(const loom_weights_t& c) {
  Weights w;
  w.w1 = c.w1;
  w.w1_scales = c.w1_scales;
  w.w2 = c.w2;
  w.w2_scales = c.w2_scales;
  return w;
}

inline Inputs to_inputs(const loom_inputs_t& c) {
  Inputs in;
  in.tokens = c.tokens;
  in.hidden = c.hidden;
  in.router_logits = c.router_logits;
  in.expert_bias = c.expert_bias;
  in.topk_ids = c.topk_ids;
  in.topk_weights = c.topk_weights;
  return in;
}

// Copies at most capacity - 1 bytes of text and a NUL into buffer; *length gets the full length.
inline void copy_text(const std::string& text, char* buffer, size_t capacity, size_t* length) {
  if (capacity > 0) require(buffer, "buffer");
  if (length) *length = text.size();
  if (capacity > 0) {
    const size_t n = std::min(text.size(), capacity - 1);
    std::memcpy(buffer, text.data(), n);
    buffer[n] = '\0';
  }
}

}  // namespace loom::capi
