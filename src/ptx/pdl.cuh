// Programmatic dependent launch (griddepcontrol), sm_90. Not in cuda::ptx as of CUDA 13.0.
//
// Rule for every loom kernel launched with the PDL attribute: every CTA executes pdl_wait()
// before its first access to memory an earlier kernel of the chain writes or reads (RAW and WAR),
// and before it exits — even a CTA with no work — or the kernel after it may see stale data.
#pragma once

namespace loom::ptx {

// Blocks until every prerequisite grid has completed and its memory is visible.
// What the grids before this one wrote is read after the wait with coherent loads (__ldcg, plain
// or TMA loads), never __ldg: ld.global.nc promises the data is read-only for the kernel's life,
// which under PDL it is not, and ptxas then moved such loads above the wait (the chunk walk's
// expert counts in the gathering GEMM: wrong sums in 2 of 4 runs of a pipeline test).
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// Lets the next kernel in the stream start launching its CTAs (no memory visibility implied).
__device__ __forceinline__ void pdl_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

}  // namespace loom::ptx
