// The tokens-on-M GEMM's phase profile: its kernel instantiated with PhaseProbe (cycle sums per
// phase, src/gemm/mainloop/fp8_tokens_on_m.cuh's Phase points), launched on the workspace a full
// product run prepared, N times from a cold L2; prints the cycles per phase and the SM clock the
// kernel ran at (cycles over the global timer). The clock reads cost the kernel ~7-8 % of its time.
#pragma once

#include <ostream>
#include <string>

namespace loom::lab {

struct PhaseProfileOptions {
  std::string preset = "qwen35-single";
  int64_t tokens = 2048;
  int runs = 200;
  uint64_t seed = 1;
};

// Throws loom::Error when the batch does not run the tokens-on-M kernel, or without a GPU.
void run_phase_profile(const PhaseProfileOptions& opt, std::ostream& log);

}  // namespace loom::lab
