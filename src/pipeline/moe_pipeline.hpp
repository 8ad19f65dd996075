// Internal entry points of the pipeline beyond the public plan()/run(): the benchmark times the
// GEMM alone on a workspace a full run prepared.
#pragma once

#include "loom/loom.hpp"

namespace loom {

enum class Stages {
  all,        // the whole layer (what run() does)
  gemm_only,  // just the grouped GEMM, on the routing, layout and activations a full run left
};

void run_stages(const Plan& p, const Weights& w, const Inputs& in, void* output, void* workspace, cudaStream_t stream,
                Stages stages);

}  // namespace loom
