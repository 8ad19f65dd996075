// Helpers shared by the workload tests: small shapes, temporary replay files, error capture.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "loom/types.hpp"
#include "workload/workload.hpp"

namespace loom::test {

// A routing-sized shape; H and I are the smallest valid widths since routes ignore them.
inline Shape route_shape(int64_t tokens, int64_t experts, int64_t topk) {
  Shape s;
  s.tokens = tokens;
  s.hidden = 16;
  s.inter = 16;
  s.experts = experts;
  s.topk = topk;
  return s;
}

// A file under the temp directory, removed when the object dies. Names carry a random tag so
// parallel test runs do not collide.
class TempFile {
 public:
  TempFile(const std::string& stem, const std::string& text) {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("loom-workload-" + stem + "-" + std::to_string((uint64_t(rd()) << 32) ^ rd()) + ".json");
    std::ofstream(path_) << text;
  }
  ~TempFile() {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

inline std::string json_array(const std::vector<int32_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// Counts that a replay file may hold for (T, k, E), built independently of the generator: experts
// in a random order, each taking as many of the remaining routes as it may (at most T).
inline std::vector<int32_t> greedy_counts(int64_t T, int64_t k, int64_t E, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> c(static_cast<size_t>(E), 0);
  std::vector<size_t> order(static_cast<size_t>(E));
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), g);
  int64_t left = T * k;
  for (const size_t e : order) {
    // A random share first so that not every count is T; the remainder is topped up below.
    const int64_t take = std::min<int64_t>({left, T, int64_t(g() % uint64_t(T + 1))});
    c[e] = int32_t(take);
    left -= take;
  }
  for (const size_t e : order) {
    const int64_t more = std::min<int64_t>(left, T - c[e]);
    c[e] += int32_t(more);
    left -= more;
  }
  return c;
}

// The message of the loom::Error that fn throws, or a failure when it throws nothing (or
// something else).
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-loom exception: " << e.what();
    return {};
  }
  ADD_FAILURE() << "did not throw";
  return {};
}

}  // namespace loom::test
