// The diagnostic log: LOOM_LOG_LEVEL parsed once, rank prefix, one write per line.
#include <loom/core/log.h>

#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <mutex>

namespace loom {

namespace {

// LOOM_LOG_LEVEL as read at the first use: its level, or the error to report.
struct EnvironmentLevel {
  LogLevel level = kDefaultLogLevel;
  std::string error;  // "" when the variable is unset or valid
};

const EnvironmentLevel& environment_level() {
  static const EnvironmentLevel parsed = [] {
    EnvironmentLevel result;
    const char* text = std::getenv("LOOM_LOG_LEVEL");
    if (text == nullptr) return result;
    try {
      result.level = parse_log_level(text);
    } catch (const Error& error) {
      result.error = error.what();
    }
    return result;
  }();
  return parsed;
}

constexpr int kNoOverride = -1;
std::atomic<int> level_override{kNoOverride};
std::atomic<int> line_rank{-1};
std::mutex write_mutex;  // whole lines, in order, even if a write is cut short

LogLevel level_in_force(bool report_errors) {
  int forced = level_override.load(std::memory_order_relaxed);
  if (forced != kNoOverride) return static_cast<LogLevel>(forced);
  const EnvironmentLevel& environment = environment_level();
  if (report_errors && !environment.error.empty()) throw Error(environment.error);
  return environment.level;
}

}  // namespace

const char* log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::error: return "error";
    case LogLevel::warn: return "warn";
    case LogLevel::info: return "info";
    case LogLevel::debug: return "debug";
  }
  return "unknown";
}

LogLevel parse_log_level(const std::string& text, const std::string& source) {
  std::string lower;
  for (unsigned char c : text) lower += static_cast<char>(std::tolower(c));
  for (LogLevel level : {LogLevel::error, LogLevel::warn, LogLevel::info, LogLevel::debug})
    if (lower == log_level_name(level)) return level;
  if (lower == "warning") return LogLevel::warn;
  LOOM_FAIL(source, "='", text, "' is not a log level; expected error, warn, info or debug (default ",
            log_level_name(kDefaultLogLevel), ")");
}

LogLevel log_level() { return level_in_force(true); }

void set_log_level(LogLevel level) { level_override.store(static_cast<int>(level), std::memory_order_relaxed); }

bool log_enabled(LogLevel level) noexcept { return level <= level_in_force(false); }

void set_log_rank(int rank) noexcept { line_rank.store(rank < 0 ? -1 : rank, std::memory_order_relaxed); }

int log_rank() noexcept { return line_rank.load(std::memory_order_relaxed); }

void write_log_line(LogLevel level, std::string_view message) noexcept {
  try {
    std::string line;
    line.reserve(message.size() + 32);
    if (int rank = log_rank(); rank >= 0) line += str("[rank ", rank, "] ");
    switch (level) {
      case LogLevel::error: line += "error: "; break;
      case LogLevel::warn: line += "warning: "; break;
      case LogLevel::info: break;
      case LogLevel::debug: line += "debug: "; break;
    }
    line += message;
    line += '\n';
    std::lock_guard lock(write_mutex);
    // One write for the line: a pipe takes up to PIPE_BUF bytes atomically,
    // so lines of other processes sharing it do not cut into this one.
    size_t written = 0;
    while (written < line.size()) {
      ssize_t n = ::write(STDERR_FILENO, line.data() + written, line.size() - written);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // stderr is gone: nothing sensible left to do with a log line
      written += static_cast<size_t>(n);
    }
  } catch (...) {
    // Out of memory while building a log line: drop the line, never the program.
  }
}

}  // namespace loom
