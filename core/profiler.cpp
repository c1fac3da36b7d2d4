#include "core/profiler.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>
#include <vector>

namespace loom::profiler {
namespace {
std::atomic<bool> g_enabled{false};
struct Entry {
  double seconds = 0;
  int64_t calls = 0;
};
std::mutex g_mutex;
std::map<std::string, Entry> g_entries;
}  // namespace

bool enabled() { return g_enabled.load(std::memory_order_relaxed); }
void set_enabled(bool on) { g_enabled = on; }

void reset() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_entries.clear();
}

Scope::Scope(const char* name, const Tensor& shape_of) : active_(enabled()) {
  if (!active_) return;
  key_ = name;
  if (shape_of.defined()) key_ += " " + shape_str(shape_of.sizes());
  start_ = std::chrono::steady_clock::now();
}

Scope::~Scope() {
  if (!active_) return;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::lock_guard<std::mutex> lock(g_mutex);
  Entry& e = g_entries[key_];
  e.seconds += seconds;
  ++e.calls;
}

std::string report() {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<std::pair<std::string, Entry>> rows(g_entries.begin(), g_entries.end());
  std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.second.seconds > b.second.seconds; });
  // Rows named "... (all)" are aggregates of the others: not part of the total.
  double total = 0;
  for (auto& [k, e] : rows) {
    if (k.find("(all)") == std::string::npos) total += e.seconds;
  }
  std::string out;
  char line[512];
  std::snprintf(line, sizeof(line), "%10s %8s %6s  %s\n", "total ms", "calls", "share", "op [input shape]");
  out += line;
  for (auto& [k, e] : rows) {
    std::snprintf(line, sizeof(line), "%10.2f %8lld %5.1f%%  %s\n", 1000 * e.seconds, static_cast<long long>(e.calls),
                  total > 0 ? 100 * e.seconds / total : 0.0, k.c_str());
    out += line;
  }
  return out;
}

}  // namespace loom::profiler
