// The slot and phase parity of one side of an mbarrier-guarded ring of kSlots slots (TMA stages,
// unit records, scale quads): waits for the full barrier use `phase`, for the empty one `phase ^ 1`.
#pragma once

#include <cstdint>

namespace loom {

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
