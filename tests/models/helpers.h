// Shared by the model tests: a temporary directory removed on scope exit,
// raw file helpers for hand-made (often broken) safetensors files, and the
// Python with PyTorch that the interop and parity tests compare against.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

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

// The first Python that imports torch 2.x, torchvision and numpy: $LOOM_TORCH_PYTHON, the
// repository's .venv (scripts/setup.sh --peers), /usr/bin/python3; "" when none does (the tests then
// skip). Debian's python3-torch is 1.13, whose torchvision builds some models with other arguments.
inline std::string torch_python() {
  static const std::string found = [] {
    std::vector<std::string> candidates;
    if (const char* given = std::getenv("LOOM_TORCH_PYTHON")) candidates.push_back(given);
    candidates.push_back(std::string(LOOM_MODELS_TEST_DIR) + "/../../.venv/bin/python");
    candidates.push_back("/usr/bin/python3");
    for (const std::string& python : candidates) {
      if (std::filesystem::exists(python) &&
          std::system(("'" + python + "' -c 'import sys, torch, torchvision, numpy; "
                       "sys.exit(int(torch.__version__.split(\".\")[0]) < 2)' >/dev/null 2>&1")
                          .c_str()) == 0)
        return python;
    }
    return std::string();
  }();
  return found;
}

// Runs `python script arguments` with its output in `log`; the exit status.
inline int run_python(const std::string& python, const std::string& script, const std::string& arguments,
                      const std::filesystem::path& log) {
  return std::system(("'" + python + "' " + std::string(LOOM_MODELS_TEST_DIR) + "/" + script + " " + arguments + " >'" +
                      log.string() + "' 2>&1")
                         .c_str());
}

inline constexpr const char* kNoTorchMessage =
    "skipped: no Python with torch 2.x + torchvision + numpy ($LOOM_TORCH_PYTHON, .venv/bin/python from "
    "scripts/setup.sh --peers, or /usr/bin/python3 with them)";

}  // namespace loom::testing
