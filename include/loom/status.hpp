// The status word every run leaves in its workspace.
#pragma once

#include <cstdint>

namespace loom {

struct LayerStatus {
  uint32_t nan_tokens = 0;      // tokens with at least one NaN router logit (those experts ranked last)
  uint32_t dropped_routes = 0;  // routes whose expert id was outside [0, E): ignored
  uint32_t reserved[2] = {0, 0};
};
static_assert(sizeof(LayerStatus) == 16);

}  // namespace loom
