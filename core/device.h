// Where a tensor lives: the CPU or CUDA device i.
#pragma once

#include <cstdint>
#include <string>

namespace loom {

enum class DeviceKind : uint8_t { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;

  static Device cpu() { return {DeviceKind::cpu, 0}; }
  static Device cuda(int index = 0) { return {DeviceKind::cuda, index}; }
  bool is_cpu() const { return kind == DeviceKind::cpu; }
  bool is_cuda() const { return kind == DeviceKind::cuda; }
  bool operator==(const Device&) const = default;
  std::string str() const;
};

// Parses "cpu", "cuda", "cuda:1". "auto" is resolved by the caller.
Device parse_device(const std::string& text);

}  // namespace loom
