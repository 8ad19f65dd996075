#include "diag/chain_trace.cuh"

#include <cuda_runtime.h>

#include <utility>

namespace loom::trace {

namespace {
std::vector<std::pair<ResetFn, ReadFn>>& units() {
  static std::vector<std::pair<ResetFn, ReadFn>> u;
  return u;
}
}  // namespace

const char* event_name(int event) {
  static const char* const names[kEventCount] = {
      "small: start", "small: waited", "small: routed", "small: layout written", "small: routing CTA end",
      "small: quantise CTAs end",
      "route: start", "route: waited", "route: end",
      "token 0: logits loaded", "token 0: max", "token 0: ranked", "token 0: weighted",
      "dispatch+quant: start", "dispatch+quant: early quantise done", "dispatch+quant: waited",
      "dispatch+quant: ids counted", "dispatch+quant: layout", "dispatch+quant: routes scattered", "dispatch+quant: end",
      "dispatch: start", "dispatch: waited", "dispatch: own routes counted", "dispatch: other slices added",
      "dispatch: scanned", "dispatch: rows assigned", "dispatch: end",
      "quantise: start", "quantise: waited", "quantise: end",
      "gemm: start", "gemm: waited", "gemm: units known", "gemm: producer role (registers released)",
      "gemm: producer's first unit decoded",
      "gemm: first unit's rows read", "gemm: first weight TMA issued",
      "gemm: a stage full (consumer 0)", "gemm: epilogue start (consumer 0)", "gemm: end", "gemm: SM"};
  return event >= 0 && event < kEventCount ? names[event] : "?";
}

bool enabled() {
#ifdef LOOM_CHAIN_TRACE
  return true;
#else
  return false;
#endif
}

int register_unit(ResetFn reset, ReadFn read) {
  units().emplace_back(reset, read);
  return int(units().size());
}

void reset(void* stream) {
  for (auto& u : units()) u.first(stream);
}

Stamps read() {
  Stamps s;
  s.first.assign(kEventCount, ~uint64_t(0));
  s.last.assign(kEventCount, 0);
  s.cta.assign(size_t(kEventCount) * kMaxCtas, 0);
  for (auto& u : units()) u.second(s);
  return s;
}

}  // namespace loom::trace
