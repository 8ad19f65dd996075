/* loom's C ABI: the MoE layer behind an opaque plan handle, for callers that cannot use C++ (the
 * Python package loads it with ctypes). No C++ type crosses it; every call catches what the C++ API
 * throws and returns a status code, the message in loom_last_error(). The C++ API (loom/loom.hpp)
 * stays the primary one; this is a thin, stable layer over it.
 *
 *   loom_options_t o;  loom_options_default(&o);
 *   loom_routing_t r;  loom_routing_default(&r);
 *   loom_shape_t s = {128, 2048, 512, 256, 8, LOOM_MODE_FFN, LOOM_DTYPE_FP8};
 *   loom_plan_t p;
 *   if (loom_plan_create(&s, &r, &o, NULL, &p) != LOOM_OK) puts(loom_last_error());
 *   size_t bytes = loom_plan_workspace_bytes(p);   // cudaMalloc that once
 *   loom_run(p, &weights, &inputs, out, workspace, stream);  // capturable, no host sync
 *   loom_plan_destroy(p);
 *
 * Versioning: LOOM_ABI_VERSION changes whenever a struct's layout or a function's meaning changes;
 * loom_abi_version() returns the value the library was built with, which a caller compares with
 * the header it was compiled against. Structs are passed by pointer and filled by the caller. */
#ifndef LOOM_LOOM_C_H
#define LOOM_LOOM_C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define LOOM_C_API __declspec(dllexport)
#else
#define LOOM_C_API __attribute__((visibility("default")))
#endif

#define LOOM_ABI_VERSION 2

typedef enum loom_status_code {
  LOOM_OK = 0,
  LOOM_ERROR_INVALID_ARGUMENT = 1, /* a null pointer, a bad shape, option or config key */
  LOOM_ERROR_CUDA = 2,             /* a CUDA call failed (no device, launch error, ...) */
  LOOM_ERROR_OUT_OF_MEMORY = 3,    /* host allocation */
  LOOM_ERROR_INTERNAL = 4          /* anything else: a bug in loom */
} loom_status_code;

enum { LOOM_MODE_SINGLE = 0, LOOM_MODE_FFN = 1 };
enum { LOOM_DTYPE_FP8 = 0, LOOM_DTYPE_BF16 = 1 };
enum { LOOM_SCORING_SOFTMAX = 0, LOOM_SCORING_SIGMOID = 1 };

/* As loom::Shape: tokens is the most tokens one run may carry. single: K = hidden, N = inter, fp32
 * out [T, N]; ffn: w13 (hidden -> 2 inter), SiLU(gate)*up, w2 (inter -> hidden), bf16 out [T, H]. */
typedef struct loom_shape_t {
  int64_t tokens, hidden, inter, experts, topk;
  int32_t mode;  /* LOOM_MODE_* */
  int32_t dtype; /* LOOM_DTYPE_* */
} loom_shape_t;

/* As loom::Routing. */
typedef struct loom_routing_t {
  int32_t scoring;     /* LOOM_SCORING_* */
  float softcap;       /* > 0: logit -> softcap * tanh(logit / softcap) before the softmax */
  int32_t renormalize; /* nonzero: divide the k weights by their sum */
  int32_t n_group;     /* sigmoid only: experts form n_group equal groups ... */
  int32_t topk_group;  /* ... of which the topk_group best survive the group stage */
  float scale;         /* multiplies the final weights */
} loom_routing_t;

/* As loom::Options (booleans as nonzero ints; config keys may be NULL or "" for the chooser's). */
typedef struct loom_options_t {
  int32_t deterministic;
  int32_t pdl;
  int32_t debug_checks;
  int32_t fuse_small_batch;
  int32_t expert_bins;
  const char* gemm_config;
  const char* gemm2_config;
} loom_options_t;

/* As loom::Weights (device pointers). */
typedef struct loom_weights_t {
  const void* w1;
  const float* w1_scales;
  const void* w2;
  const float* w2_scales;
} loom_weights_t;

/* As loom::Inputs (device pointers; router_logits, or topk_ids with topk_weights). */
typedef struct loom_inputs_t {
  int64_t tokens;
  const void* hidden;
  const float* router_logits;
  const float* expert_bias;
  const int32_t* topk_ids;
  const float* topk_weights;
} loom_inputs_t;

/* As loom::LayerStatus. */
typedef struct loom_layer_status_t {
  uint32_t nan_tokens;
  uint32_t dropped_routes;
  uint32_t reserved[2];
} loom_layer_status_t;

typedef struct loom_plan_s* loom_plan_t;

LOOM_C_API uint32_t loom_abi_version(void);
/* The library's build: "<commit>", static storage. */
LOOM_C_API const char* loom_build_commit(void);
/* The message of the last call on this thread that did not return LOOM_OK ("" if none); valid
 * until the next loom call on this thread. */
LOOM_C_API const char* loom_last_error(void);

LOOM_C_API void loom_routing_default(loom_routing_t* routing);
LOOM_C_API void loom_options_default(loom_options_t* options);

/* device: NULL for the current CUDA device, or a described one ("h200", "h100") to plan without a
 * GPU (such a plan describes what it would launch; it runs on any sm_90 GPU). */
LOOM_C_API loom_status_code loom_plan_create(const loom_shape_t* shape, const loom_routing_t* routing,
                                             const loom_options_t* options, const char* device, loom_plan_t* plan);
LOOM_C_API void loom_plan_destroy(loom_plan_t plan); /* NULL is fine */

/* 0 for a NULL plan. */
LOOM_C_API size_t loom_plan_workspace_bytes(loom_plan_t plan);
/* The plan's shape as planned (tokens = the most per run). */
LOOM_C_API loom_status_code loom_plan_shape(loom_plan_t plan, loom_shape_t* shape);
/* describe(plan): copies at most capacity - 1 bytes and a NUL into buffer (buffer may be NULL with
 * capacity 0); *length (if not NULL) receives the full length without the NUL. */
LOOM_C_API loom_status_code loom_plan_describe(loom_plan_t plan, char* buffer, size_t capacity, size_t* length);

/* Enqueues the layer on stream (a cudaStream_t; NULL = the legacy default stream). output: single
 * fp32 [T, N], ffn bf16 [T, H]; workspace: loom_plan_workspace_bytes() of device memory, 256-byte
 * aligned. Capturable in a CUDA graph; no host synchronisation, no allocation. */
LOOM_C_API loom_status_code loom_run(loom_plan_t plan, const loom_weights_t* weights, const loom_inputs_t* inputs,
                                     void* output, void* workspace, void* stream);

/* Synchronises stream and copies the status word of the last run from the workspace. */
LOOM_C_API loom_status_code loom_read_status(loom_plan_t plan, const void* workspace, void* stream,
                                             loom_layer_status_t* status);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_LOOM_C_H */
