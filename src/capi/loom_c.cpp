// The C ABI (include/loom/loom_c.h) over the C++ API: every entry point catches what the C++ side
// throws, maps it to a status code and keeps the message for loom_last_error() on this thread.
#include "loom/loom_c.h"

#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "capi/capi_util.hpp"
#include "common/build_info.hpp"
#include "loom/loom.hpp"

static_assert(sizeof(loom_layer_status_t) == sizeof(loom::LayerStatus), "the C status mirrors loom::LayerStatus");

struct loom_plan_s {
  loom::Plan plan;
  size_t workspace = 0;
};

namespace {

thread_local std::string last_error;

template <class F>
loom_status_code guarded(F&& f) {
  return loom::capi::guarded(last_error, std::forward<F>(f));
}

using loom::capi::require;

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
    const loom::Shape s = loom::capi::to_shape(*shape);
    const loom::Routing r = loom::capi::to_routing(*routing);
    const loom::Options o = loom::capi::to_options(*options);
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
    *shape = loom::capi::from_shape(plan->plan.shape);
  });
}

loom_status_code loom_plan_describe(loom_plan_t plan, char* buffer, size_t capacity, size_t* length) {
  return guarded([&] {
    require(plan, "plan");
    loom::capi::copy_text(loom::describe(plan->plan), buffer, capacity, length);
  });
}

loom_status_code loom_run(loom_plan_t plan, const loom_weights_t* weights, const loom_inputs_t* inputs, void* output,
                          void* workspace, void* stream) {
  return guarded([&] {
    require(plan, "plan");
    require(weights, "weights");
    require(inputs, "inputs");
    const loom::Weights w = loom::capi::to_weights(*weights);
    const loom::Inputs in = loom::capi::to_inputs(*inputs);
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
