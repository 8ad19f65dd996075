// Internal: one stage of run_ep alone, on the workspace and inputs a whole run prepared, for the
// benchmark's dispatch and combine times. Every rank runs the same stage together (the stage's
// NCCL calls pair up). Plans in one part only: in parts the stages overlap.
#pragma once

#include <nccl.h>

#include "loom/dist.hpp"

namespace loom {

enum class EpStage {
  all,       // run_ep
  dispatch,  // routing, the send kernels and the token rows' exchange
  compute,   // the local experts on the received rows (and, deterministic, the return rows' copy)
  combine,   // the outputs' exchange back and the combine into the output
};

void run_ep_stage(const EpPlan& p, const Weights& local, const Inputs& in, void* output, void* workspace,
                  ncclComm_t comm, cudaStream_t stream, EpStage stage);

}  // namespace loom
