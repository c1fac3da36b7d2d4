// Shared by the model tests: a temporary directory removed on scope exit, and
// raw file helpers for hand-made (often broken) safetensors files.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "tests/support/temp_dir.h"  // TempDir, in this namespace

namespace loom::testing {

inline std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

// A safetensors file from a header text and data bytes; header_length
// overrides the length field (to make it lie).
inline std::string safetensors_bytes(const std::string& header, const std::string& data,
                                     int64_t header_length = -1) {
  uint64_t length = header_length < 0 ? header.size() : static_cast<uint64_t>(header_length);
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  return out + header + data;
}

}  // namespace loom::testing
