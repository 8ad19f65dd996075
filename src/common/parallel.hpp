// A minimal parallel-for for the CPU references and generators: static chunks over all cores.
#pragma once

#include <cstdint>
#include <functional>

namespace loom {

// Number of worker threads parallel_for uses (hardware concurrency, or LOOM_THREADS when set).
int cpu_threads();

// Calls fn(begin, end) on disjoint chunks that cover [0, n), at most one chunk per thread, each
// at least `grain` long. Deterministic results are the caller's job: chunks must not share output.
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain = 1);

}  // namespace loom
