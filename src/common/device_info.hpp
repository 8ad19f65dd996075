// What the library needs to know about the GPU, read off the device (never hard-coded).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace loom {

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int major = 0, minor = 0;
  int sm_count = 0;
  int64_t l2_bytes = 0;
  int64_t global_bytes = 0;
  int64_t smem_per_block_optin = 0;
  int clock_mhz = 0;         // SM clock the driver reports (max boost)
  int memory_clock_mhz = 0;
  int memory_bus_bits = 0;
};

// The current device, or nullopt with `why` set when none is usable.
std::optional<DeviceInfo> query_device(std::string* why = nullptr);

}  // namespace loom
