#include "common/parallel.hpp"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace loom {

int cpu_threads() {
  static const int n = [] {
    if (const char* e = std::getenv("LOOM_THREADS")) {
      const int v = std::atoi(e);
      if (v > 0) return v;
    }
    return std::max(1, int(std::thread::hardware_concurrency()));
  }();
  return n;
}

namespace {
// Set on threads running a parallel_for body: a nested parallel_for runs inline instead of
// multiplying threads (N x N) and paying thread start-up for every inner call.
thread_local bool inside_parallel_for = false;
}  // namespace

void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t chunks = std::min<int64_t>(cpu_threads(), (n + grain - 1) / grain);
  if (chunks <= 1 || inside_parallel_for) {
    fn(0, n);
    return;
  }
  std::exception_ptr error;
  std::mutex error_mutex;
  std::vector<std::thread> threads;
  threads.reserve(size_t(chunks - 1));
  auto body = [&](int64_t c) {
    const int64_t begin = n * c / chunks, end = n * (c + 1) / chunks;
    const bool was_inside = inside_parallel_for;
    inside_parallel_for = true;
    try {
      fn(begin, end);
      inside_parallel_for = was_inside;
    } catch (...) {
      inside_parallel_for = was_inside;
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  };
  for (int64_t c = 1; c < chunks; ++c) threads.emplace_back(body, c);
  body(0);
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace loom
