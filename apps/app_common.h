// What the apps share: flag errors as one line, durations printed like
// Python's timedelta, thread setup.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

namespace loom::apps {

// "0:00:12.345678", as the tutorials print datetime.now() - start.
std::string format_duration(std::chrono::steady_clock::duration elapsed);

// Peak resident set size of this process in bytes (VmHWM), 0 if unknown.
long peak_rss_bytes();

}  // namespace loom::apps

#include <CLI/CLI.hpp>

namespace loom::apps {

// Flag validators whose messages a user can act on, e.g.
// "--epochs: must be a number >= 0, got '-1'".
CLI::Validator at_least(double minimum);
// The same for whole numbers.
CLI::Validator whole_at_least(long long minimum);

}  // namespace loom::apps
