// What the fuzz harnesses share: the loaders read files, so each input is
// written to a file of this process first (the name carries the pid, as
// libFuzzer's -fork/-jobs workers run side by side).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

namespace loom::fuzz {

// Writes `data` to <temp dir>/loom-fuzz-<pid>-<name> and returns the path.
inline std::filesystem::path write_input(const uint8_t* data, size_t size, const std::string& name) {
  const auto path = std::filesystem::temp_directory_path() / ("loom-fuzz-" + std::to_string(::getpid()) + "-" + name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

}  // namespace loom::fuzz
