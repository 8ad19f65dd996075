/* Expert parallelism's C ABI (libloom_dist.so, over libloom.so and NCCL): loom::plan_ep and
 * loom::run_ep (loom/dist.hpp) behind an opaque handle, and the few NCCL calls a caller without
 * NCCL headers needs to make the communicator from a unique id (the Python package broadcasts the
 * id through a torch.distributed process group). Conventions as in loom_c.h: structs by pointer,
 * status codes, the message in loom_ep_last_error() (this library's own, per thread).
 *
 *   uint8_t id[LOOM_NCCL_ID_BYTES];           // rank 0: loom_nccl_unique_id(id), then send it to all
 *   void* comm;  loom_nccl_comm_create(id, size, rank, &comm);   // every rank
 *   loom_ep_t ep;  loom_ep_default(&ep);  ep.size = size;  ep.rank = rank;
 *   loom_ep_plan_t p;  loom_ep_plan_create(&shape, &routing, &options, &ep, &p);
 *   loom_ep_run(p, &local_weights, &inputs, out, workspace, comm, stream);  // every rank
 *   loom_ep_plan_destroy(p);  loom_nccl_comm_destroy(comm);
 *
 * The communicator made here is NCCL_NVLS_ENABLE=0 unless the environment says otherwise. */
#ifndef LOOM_LOOM_DIST_C_H
#define LOOM_LOOM_DIST_C_H

#include "loom/loom_c.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_NCCL_ID_BYTES 128

/* As loom::ExpertParallel. expert_rank: NULL (contiguous blocks) or expert_rank_count = E owners. */
typedef struct loom_ep_t {
  int32_t size;
  int32_t rank;
  int64_t first_expert, expert_count; /* -1, -1: not given */
  const int32_t* expert_rank;
  int64_t expert_rank_count;
  int64_t rows_per_peer;   /* route outputs a peer returns; 0: the default cap */
  int32_t chunks;          /* 1: unsplit */
  int32_t comm_sms;        /* -1: the default */
  int64_t tokens_per_peer; /* token rows sent to a peer; 0: the default cap */
} loom_ep_t;

/* As loom::EpStatus. */
typedef struct loom_ep_status_t {
  uint32_t nan_tokens;
  uint32_t dropped_routes;
  uint32_t overflow_routes;
  uint32_t reserved;
} loom_ep_status_t;

typedef struct loom_ep_plan_s* loom_ep_plan_t;

LOOM_C_API uint32_t loom_ep_abi_version(void); /* LOOM_ABI_VERSION of the build */
LOOM_C_API const char* loom_ep_last_error(void);
LOOM_C_API void loom_ep_default(loom_ep_t* ep);

/* ncclGetUniqueId into id[LOOM_NCCL_ID_BYTES]. */
LOOM_C_API loom_status_code loom_nccl_unique_id(uint8_t* id);
/* ncclCommInitRank on the current CUDA device; *comm receives the ncclComm_t. Blocks until all
 * `size` ranks have called it with the same id. */
LOOM_C_API loom_status_code loom_nccl_comm_create(const uint8_t* id, int32_t size, int32_t rank, void** comm);
LOOM_C_API loom_status_code loom_nccl_comm_destroy(void* comm); /* NULL is fine */

/* The shape's experts are all E; tokens = the most one rank's run carries. */
LOOM_C_API loom_status_code loom_ep_plan_create(const loom_shape_t* shape, const loom_routing_t* routing,
                                                const loom_options_t* options, const loom_ep_t* ep,
                                                loom_ep_plan_t* plan);
LOOM_C_API void loom_ep_plan_destroy(loom_ep_plan_t plan); /* NULL is fine */
LOOM_C_API size_t loom_ep_plan_workspace_bytes(loom_ep_plan_t plan);
/* This rank's experts (global ids, in the order its weights hold them): copies at most capacity
 * into experts (may be NULL with capacity 0); *count receives how many there are. */
LOOM_C_API loom_status_code loom_ep_plan_local_experts(loom_ep_plan_t plan, int32_t* experts, int64_t capacity,
                                                       int64_t* count);
LOOM_C_API loom_status_code loom_ep_plan_describe(loom_ep_plan_t plan, char* buffer, size_t capacity,
                                                  size_t* length);

/* Every rank calls it for the same run. weights: this rank's experts only; comm: an ncclComm_t of
 * `size` ranks in which this process is `rank`. Capturable in a CUDA graph. */
LOOM_C_API loom_status_code loom_ep_run(loom_ep_plan_t plan, const loom_weights_t* weights,
                                        const loom_inputs_t* inputs, void* output, void* workspace, void* comm,
                                        void* stream);
/* Synchronises stream and reads the last run's status. */
LOOM_C_API loom_status_code loom_ep_read_status(loom_ep_plan_t plan, const void* workspace, void* stream,
                                                loom_ep_status_t* status);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_LOOM_DIST_C_H */
