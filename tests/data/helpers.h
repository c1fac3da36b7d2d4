// Test helpers for the data tests: the shared self-deleting temporary
// directory (tests/support/temp_dir.h), raw and gzip byte writers, and the
// process's thread count.
#pragma once

#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"
#include "tests/support/temp_dir.h"

namespace loom::data::testing {

using ::loom::testing::TempDir;  // tests/support/temp_dir.h

inline void write_bytes(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

// Writes `bytes` gzip-compressed, independently of the library's writer.
inline void write_gzip(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  if (!file) throw std::runtime_error("cannot open " + path.string());
  gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(file);
}

inline std::vector<uint8_t> read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// An IDX header: magic then dimensions, big-endian 32-bit words.
inline std::vector<uint8_t> idx_header(std::initializer_list<uint32_t> words) {
  std::vector<uint8_t> out;
  for (uint32_t word : words) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(word >> shift));
  }
  return out;
}

// The message of the loom::Error `action` throws, or a note that it threw none.
template <class Action>
std::string error_message(Action&& action) {
  try {
    action();
  } catch (const loom::Error& error) {
    return error.what();
  }
  return "<no loom::Error was thrown>";
}

// Threads of this process, from /proc/self/task.
inline int thread_count() {
  int count = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) ++count;
  return count;
}

}  // namespace loom::data::testing
