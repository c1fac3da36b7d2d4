#include <loom/core/profiler.h>

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
  double flops = 0;
  int64_t calls = 0;
};
thread_local Scope* t_innermost = nullptr;
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
  if (shape_of.defined()) {
    key_ += ' ';  // (not " " + string: GCC 12 warns a false -Wrestrict on that)
    key_ += shape_str(shape_of.sizes());
  }
  parent_ = t_innermost;
  t_innermost = this;
  start_ = std::chrono::steady_clock::now();
}

void add_flops(double flops) {
  if (t_innermost != nullptr) t_innermost->flops_ += flops;
}

Scope::~Scope() {
  if (!active_) return;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  t_innermost = parent_;
  std::lock_guard<std::mutex> lock(g_mutex);
  Entry& e = g_entries[key_];
  e.seconds += seconds;
  e.flops += flops_;
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
  std::snprintf(line, sizeof(line), "%10s %8s %6s %8s  %s\n", "total ms", "calls", "share", "GFLOP/s",
                "op [input shape]");
  out += line;
  // Per op name (the key up to its shape): time and operations over all layers.
  std::map<std::string, Entry> per_op;
  for (auto& [k, e] : rows) {
    char rate[16] = "";
    if (e.flops > 0 && e.seconds > 0) std::snprintf(rate, sizeof(rate), "%.1f", e.flops / e.seconds / 1e9);
    std::snprintf(line, sizeof(line), "%10.2f %8lld %5.1f%% %8s  %s\n", 1000 * e.seconds,
                  static_cast<long long>(e.calls), total > 0 ? 100 * e.seconds / total : 0.0, rate, k.c_str());
    out += line;
    if (e.flops > 0) {
      Entry& op = per_op[k.substr(0, k.find(" ["))];
      op.seconds += e.seconds;
      op.flops += e.flops;
      op.calls += e.calls;
    }
  }
  for (auto& [name, e] : per_op) {
    std::snprintf(line, sizeof(line), "all layers: %-18s %9.2f ms %9.3f GFLOP %7.1f GFLOP/s\n", name.c_str(),
                  1000 * e.seconds, e.flops / 1e9, e.seconds > 0 ? e.flops / e.seconds / 1e9 : 0.0);
    out += line;
  }
  return out;
}

}  // namespace loom::profiler
