// The C ABI (include/loom/loom_c.h) over the C++ API: every entry point catches what the C++ side
// throws, maps it to a status code and keeps the message for loom_last_error() on this thread.
#include "loom/loom_c.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>

#include "common/build_info.hpp"
#include "loom/loom.hpp"

static_assert(sizeof(loom_layer_status_t) == sizeof(loom::LayerStatus), "the C status mirrors loom::LayerStatus");

struct loom_plan_s {
  loom::Plan plan;
  size_t workspace = 0;
};

namespace {

thread_local std::string last_error;

loom_status_code fail(loom_status_code code, const char* what) noexcept {
  try {
    last_error = what;
  } catch (...) {  // no memory for the message: the code still says what failed
    last_error.clear();
  }
  return code;
}

// Runs f, mapping exceptions to codes; clears the last error on success.
template <class F>
loom_status_code guarded(F&& f) {
  try {
    f();
    last_error.clear();
    return LOOM_OK;
  } catch (const loom::CudaError& e) {
    return fail(LOOM_ERROR_CUDA, e.what());
  } catch (const loom::Error& e) {
    return fail(LOOM_ERROR_INVALID_ARGUMENT, e.what());
  } catch (const std::bad_alloc&) {
    return fail(LOOM_ERROR_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception& e) {
    return fail(LOOM_ERROR_INTERNAL, e.what());
  } catch (...) {
    return fail(LOOM_ERROR_INTERNAL, "unknown exception");
  }
}

void require(const void* p, const char* what) {
  if (p == nullptr) throw loom::Error(std::string(what) + " is NULL");
}

loom::Mode to_mode(int32_t m) {
  if (m == LOOM_MODE_SINGLE) return loom::Mode::single;
  if (m == LOOM_MODE_FFN) return loom::Mode::ffn;
  throw loom::Error("mode must be LOOM_MODE_SINGLE or LOOM_MODE_FFN, got " + std::to_string(m));
}

loom::DType to_dtype(int32_t d) {
  if (d == LOOM_DTYPE_FP8) return loom::DType::fp8;
  if (d == LOOM_DTYPE_BF16) return loom::DType::bf16;
  throw loom::Error("dtype must be LOOM_DTYPE_FP8 or LOOM_DTYPE_BF16, got " + std::to_string(d));
}

loom::Scoring to_scoring(int32_t s) {
  if (s == LOOM_SCORING_SOFTMAX) return loom::Scoring::softmax;
  if (s == LOOM_SCORING_SIGMOID) return loom::Scoring::sigmoid;
  throw loom::Error("scoring must be LOOM_SCORING_SOFTMAX or LOOM_SCORING_SIGMOID, got " + std::to_string(s));
}

loom_shape_t from_shape(const loom::Shape& s) {
  loom_shape_t c{};
  c.tokens = s.tokens;
  c.hidden = s.hidden;
  c.inter = s.inter;
  c.experts = s.experts;
  c.topk = s.topk;
  c.mode = s.mode == loom::Mode::ffn ? LOOM_MODE_FFN : LOOM_MODE_SINGLE;
  c.dtype = s.dtype == loom::DType::bf16 ? LOOM_DTYPE_BF16 : LOOM_DTYPE_FP8;
  return c;
}

}  // namespace

extern "C" {

uint32_t loom_abi_version(void) { return LOOM_ABI_VERSION; }

const char* loom_build_commit(void) { return loom::build_commit(); }

const char* loom_last_error(void) { return last_error.c_str(); }

void loom_routing_default(loom_routing_t* routing) {
  if (routing == nullptr) return;
  const loom::Routing r;
  routing->scoring = r.scoring == loom::Scoring::sigmoid ? LOOM_SCORING_SIGMOID : LOOM_SCORING_SOFTMAX;
  routing->softcap = r.softcap;
  routing->renormalize = r.renormalize ? 1 : 0;
  routing->n_group = r.n_group;
  routing->topk_group = r.topk_group;
  routing->scale = r.scale;
}

void loom_options_default(loom_options_t* options) {
  if (options == nullptr) return;
  const loom::Options o;
  options->deterministic = o.deterministic;
  options->pdl = o.pdl;
  options->debug_checks = o.debug_checks;
  options->fuse_small_batch = o.fuse_small_batch;
  options->expert_bins = o.expert_bins;
  options->gemm_config = nullptr;
  options->gemm2_config = nullptr;
}

loom_status_code loom_plan_create(const loom_shape_t* shape, const loom_routing_t* routing,
                                  const loom_options_t* options, const char* device, loom_plan_t* plan) {
  return guarded([&] {
    require(plan, "plan");
    *plan = nullptr;
    require(shape, "shape");
    require(routing, "routing");
    require(options, "options");
    loom::Shape s;
    s.tokens = shape->tokens;
    s.hidden = shape->hidden;
    s.inter = shape->inter;
    s.experts = shape->experts;
    s.topk = shape->topk;
    s.mode = to_mode(shape->mode);
    s.dtype = to_dtype(shape->dtype);
    loom::Routing r;
    r.scoring = to_scoring(routing->scoring);
    r.softcap = routing->softcap;
    r.renormalize = routing->renormalize != 0;
    r.n_group = routing->n_group;
    r.topk_group = routing->topk_group;
    r.scale = routing->scale;
    loom::Options o;
    o.deterministic = options->deterministic != 0;
    o.pdl = options->pdl != 0;
    o.debug_checks = options->debug_checks != 0;
    o.fuse_small_batch = options->fuse_small_batch != 0;
    o.expert_bins = options->expert_bins != 0;
    o.gemm_config = options->gemm_config ? options->gemm_config : "";
    o.gemm2_config = options->gemm2_config ? options->gemm2_config : "";
    auto handle = std::make_unique<loom_plan_s>();
    handle->plan = device ? loom::plan(s, r, o, loom::device_spec(device)) : loom::plan(s, r, o);
    handle->workspace = loom::workspace_bytes(handle->plan);
    *plan = handle.release();
  });
}

void loom_plan_destroy(loom_plan_t plan) { delete plan; }

size_t loom_plan_workspace_bytes(loom_plan_t plan) { return plan ? plan->workspace : 0; }

loom_status_code loom_plan_shape(loom_plan_t plan, loom_shape_t* shape) {
  return guarded([&] {
    require(plan, "plan");
    require(shape, "shape");
    *shape = from_shape(plan->plan.shape);
  });
}

loom_status_code loom_plan_describe(loom_plan_t plan, char* buffer, size_t capacity, size_t* length) {
  return guarded([&] {
    require(plan, "plan");
    if (capacity > 0) require(buffer, "buffer");
    const std::string text = loom::describe(plan->plan);
    if (length) *length = text.size();
    if (capacity > 0) {
      const size_t n = std::min(text.size(), capacity - 1);
      std::memcpy(buffer, text.data(), n);
      buffer[n] = '\0';
    }
  });
}

loom_status_code loom_run(loom_plan_t plan, const loom_weights_t* weights, const loom_inputs_t* inputs, void* output,
                          void* workspace, void* stream) {
  return guarded([&] {
    require(plan, "plan");
    require(weights, "weights");
    require(inputs, "inputs");
    loom::Weights w;
    w.w1 = weights->w1;
    w.w1_scales = weights->w1_scales;
    w.w2 = weights->w2;
    w.w2_scales = weights->w2_scales;
    loom::Inputs in;
    in.tokens = inputs->tokens;
    in.hidden = inputs->hidden;
    in.router_logits = inputs->router_logits;
    in.expert_bias = inputs->expert_bias;
    in.topk_ids = inputs->topk_ids;
    in.topk_weights = inputs->topk_weights;
    loom::run(plan->plan, w, in, output, workspace, static_cast<cudaStream_t>(stream));
  });
}

loom_status_code loom_read_status(loom_plan_t plan, const void* workspace, void* stream, loom_layer_status_t* status) {
  return guarded([&] {
    require(plan, "plan");
    require(workspace, "workspace");
    require(status, "status");
    const loom::LayerStatus st = loom::read_status(plan->plan, workspace, static_cast<cudaStream_t>(stream));
    std::memcpy(status, &st, sizeof st);
  });
}

}  // extern "C"
