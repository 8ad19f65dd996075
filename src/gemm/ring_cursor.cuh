// The slot and phase parity of one side of an mbarrier-guarded ring of kSlots slots (TMA stages,
// unit records, scale quads): waits for the full barrier use `phase`, for the empty one `phase ^ 1`.
#pragma once

#include <cstdint>

#include "ptx/mbarrier.cuh"

namespace loom {

// A consumer warp's release of a ring slot once every lane's own reads of it are done. Every lane
// arrives (the barrier counts threads, kReleaseArrivalsPerWarp a warp), so each read is ordered
// before the refill by its own thread's arrival. (A single lane's arrival after __syncwarp orders
// them as well and ran no faster, but the race checker cannot see that it does.)
inline constexpr uint32_t kReleaseArrivalsPerWarp = 32;
__device__ __forceinline__ void release_slot(uint64_t* bar) { ptx::mbar_arrive(bar); }

template <int kSlots>
struct PipelineState {
  static_assert(kSlots > 0, "a ring has at least one slot");
  uint32_t stage = 0, phase = 0;
  __device__ void advance() {
    if (++stage == kSlots) {
      stage = 0;
      phase ^= 1;
    }
  }
};

}  // namespace loom
