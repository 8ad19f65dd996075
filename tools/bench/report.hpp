// Benchmark records and their three renderings: JSON (one record per measurement), CSV, and the
// human table printed last on stdout.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/metrics.hpp"
#include "bench/stats.hpp"
#include "common/device_info.hpp"
#include "loom/types.hpp"

namespace loom::bench {

// One timed GPU quantity (end to end, GEMM alone, ...), cold L2 and warm.
struct Timed {
  std::string name;
  Stats cold, warm;
};

// The two speeds of light measured in the same run, timed by the same method.
struct SolFigures {
  bool measured = false;
  std::string why_not;  // when not measured
  Stats read;           // streaming read of exactly the routed experts' weight bytes
  std::string read_config;
  double read_loads_us = 0.0, read_bulk_us = 0.0;  // each reader's fastest median (the floor takes the faster)
  int64_t read_bytes = 0;
  Stats gemm;           // cuBLASLt dense GEMM(s) of the same FLOPs
  std::string gemm_algo;
  double floor_us() const { return read.median_us > gemm.median_us ? read.median_us : gemm.median_us; }
  const char* bound() const { return read.median_us >= gemm.median_us ? "memory" : "compute"; }
};

struct Record {
  std::string preset;
  Shape shape;
  Routing routing;
  std::string distribution;
  uint64_t seed = 0;
  std::string path;    // "gpu" or "cpu-reference"
  std::string config;  // the plan's choices
  std::string gemm_config;  // the GEMM config key this run launched (gpu path)
  std::string launches;     // what this run enqueued, in order (gpu path)
  std::string commit;
  std::optional<DeviceInfo> device;
  Work work;
  std::vector<Timed> gpu;         // GPU timings; empty on the CPU path
  double cpu_reference_ms = -1;   // wall time of the CPU reference (CPU path only; never a GPU figure)
  SolFigures sol;
  double check_overall = -1;    // relative Frobenius error of the GPU output vs the CPU reference
  double check_worst_row = -1;  // worst per-token-row relative error
  std::string note;

  const Timed* find(const std::string& name) const;
  // Headline GPU time (end to end, cold) or nullptr.
  const Stats* headline() const;
};

std::string to_json(const std::vector<Record>& records);
std::string to_csv(const std::vector<Record>& records);
std::string to_table(const std::vector<Record>& records);

void write_file(const std::string& path, const std::string& text);  // throws Error

}  // namespace loom::bench
