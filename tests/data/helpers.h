// Test helpers for the data tests: the shared self-deleting temporary
// directory (tests/support/temp_dir.h), raw and gzip byte writers, and the
// process's thread count.
#pragma once

#include <zlib.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <loom/core/error.h>
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

// A Python 3 interpreter that can import every module in `modules` (e.g.
// "numpy PIL"): python3 from PATH, else Debian's /usr/bin/python3 (a PATH
// python3 from pyenv or a venv may lack Debian's python3-numpy and
// python3-pil). Empty when none can.
inline std::string python_with(const std::string& modules) {
  std::string imports;
  for (size_t start = 0; start < modules.size();) {
    size_t end = modules.find(' ', start);
    if (end == std::string::npos) end = modules.size();
    imports += "import " + modules.substr(start, end - start) + ";";
    start = end + 1;
  }
  for (const char* python : {"python3", "/usr/bin/python3"}) {
    const std::string command = std::string(python) + " -c '" + imports + "' >/dev/null 2>&1";
    if (std::system(command.c_str()) == 0) return python;
  }
  return {};
}

// Joins the pieces of a command line with spaces (no quoting: test paths have none).
template <class... Parts>
std::string str_args(const Parts&... parts) {
  std::string out;
  ((out += (out.empty() ? "" : " "), out += std::string(parts)), ...);
  return out;
}

// Runs a generator script from tests/data with `python`; throws with the command on failure.
inline void run_python(const std::string& python, const std::string& script_and_arguments) {
  const std::string command = python + " " + LOOM_TESTS_DATA_DIR + "/" + script_and_arguments;
  if (std::system(command.c_str()) != 0) throw std::runtime_error("failed: " + command);
}

// Threads of this process, from /proc/self/task.
inline int thread_count() {
  int count = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) ++count;
  return count;
}

// thread_count() once it has dropped to `expected`, or after 2 s. A joined
// thread can still be listed for a moment: the kernel wakes the joiner
// (clearing the thread's id) before it removes the thread from
// /proc/self/task, and on a loaded machine (CI's sanitizer run) a count read
// right after the join saw it. A thread that is really left over stays and
// fails the check.
inline int thread_count_settled(int expected) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  int count = thread_count();
  while (count != expected && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    count = thread_count();
  }
  return count;
}

}  // namespace loom::data::testing
