// loom's diagnostic log: lines on stderr filtered by LOOM_LOG_LEVEL
// (error, warn, info, debug), prefixed "[rank N] " once the rank is known.
#pragma once

#include <string>
#include <string_view>

#include <loom/core/error.h>

namespace loom {

// Ordered from the fewest lines to the most: a level shows its own lines and
// those of every level before it.
enum class LogLevel { error, warn, info, debug };

// What a line is printed at when LOOM_LOG_LEVEL is not set: info keeps the
// informational lines loom has always printed (which backend "auto" chose).
inline constexpr LogLevel kDefaultLogLevel = LogLevel::info;

const char* log_level_name(LogLevel level);

// "error", "warn", "info" or "debug" (any case) as a level; throws loom::Error
// naming `source` (the variable or flag the text came from) and the accepted
// values for anything else.
LogLevel parse_log_level(const std::string& text, const std::string& source = "LOOM_LOG_LEVEL");

// The level in force: set_log_level()'s, else LOOM_LOG_LEVEL's (read once),
// else kDefaultLogLevel. Throws loom::Error for a LOOM_LOG_LEVEL that is not
// a level; programs call it at startup so that the error comes first.
LogLevel log_level();
void set_log_level(LogLevel level);

// Whether lines of `level` are printed. Never throws: with an invalid
// LOOM_LOG_LEVEL it answers for kDefaultLogLevel (log_level() reports the
// error), so that logging is safe in destructors and background threads.
bool log_enabled(LogLevel level) noexcept;

// Every line from now on starts with "[rank N] "; a negative rank removes the
// prefix. init_process_group sets it for groups of more than one rank.
void set_log_rank(int rank) noexcept;
int log_rank() noexcept;

// Prints one line (the prefix, "debug: " / "warning: " / "error: " for those
// levels, `message`, a newline) with a single write to stderr, whatever the
// level; safe from any thread, lines never interleave.
void write_log_line(LogLevel level, std::string_view message) noexcept;

// log_debug("rendezvous: store at ", host, ":", port): builds the line only
// when its level is enabled.
template <class... Parts>
void log_at(LogLevel level, const Parts&... parts) {
  if (log_enabled(level)) write_log_line(level, str(parts...));
}
template <class... Parts>
void log_error(const Parts&... parts) { log_at(LogLevel::error, parts...); }
template <class... Parts>
void log_warn(const Parts&... parts) { log_at(LogLevel::warn, parts...); }
template <class... Parts>
void log_info(const Parts&... parts) { log_at(LogLevel::info, parts...); }
template <class... Parts>
void log_debug(const Parts&... parts) { log_at(LogLevel::debug, parts...); }

}  // namespace loom
