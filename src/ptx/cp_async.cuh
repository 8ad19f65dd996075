// Non-bulk cp.async (sm_80+) wrappers: per-thread 16- and 4-byte global -> shared copies whose
// completion an mbarrier tracks. CCCL's cuda::ptx has no non-bulk cp.async, hence inline PTX.
//
// The writes land through the generic proxy: a reader that feeds them to wgmma (async proxy) must
// execute fence.proxy.async after it observed the mbarrier phase and before the MMA.
#pragma once

#include <cstdint>

namespace loom::ptx {

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

// Copies src_bytes (0 or 16) from `src` and zero-fills the rest of the 16-byte destination; with
// src_bytes = 0 nothing is read (src must still be a valid address expression).
__device__ __forceinline__ void cp_async_16_zfill(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// 16 bytes with an L2 cache-policy hint (createpolicy).
__device__ __forceinline__ void cp_async_16_zfill_hint(uint32_t dst, const void* src, uint32_t src_bytes,
                                                       uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(dst), "l"(src),
               "r"(src_bytes), "l"(policy)
               : "memory");
}

// 4-byte variant (.ca: .cg takes 16 bytes only).
__device__ __forceinline__ void cp_async_4_zfill(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// Closes this thread's group of cp.async copies issued so far; waits until at most kPending of
// its groups are still in flight.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// One arrival on `bar` once every cp.async this thread issued so far has landed. .noinc: the arrival
// counts against the barrier's expected count (init it with one arrival per calling thread).
__device__ __forceinline__ void cp_async_mbar_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(bar)) : "memory");
}

}  // namespace loom::ptx
