// Fresh random inputs for every run, reproducible on failure: the seed comes from LOOM_TEST_SEED
// when set, else from std::random_device; tests print it through SCOPED_TRACE.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>

namespace loom::test {

inline uint64_t fresh_seed() {
  if (const char* e = std::getenv("LOOM_TEST_SEED")) return std::strtoull(e, nullptr, 0);
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ rd();
}

inline std::string seed_note(uint64_t seed) { return "rerun with LOOM_TEST_SEED=" + std::to_string(seed); }

}  // namespace loom::test

// Declares `seed` for this test and attaches it to every failure message.
#define LOOM_FRESH_SEED()                                 \
  const uint64_t seed = ::loom::test::fresh_seed();       \
  SCOPED_TRACE(::loom::test::seed_note(seed))
