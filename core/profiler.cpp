#include <loom/core/profiler.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include <loom/core/error.h>
#include <loom/core/json_string.h>

#if LOOM_HAVE_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

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

// ---- trace ----
struct TraceEvent {
  std::string name;
  const char* category = "";
  char phase = 'X';  // 'X' complete, 'i' instant
  int thread = 0;
  int64_t start_ns = 0;  // steady clock
  int64_t duration_ns = 0;
  std::string args;  // body of a JSON object, or empty
};
std::atomic<bool> g_tracing{false};
std::mutex g_trace_mutex;
std::vector<TraceEvent> g_events;
size_t g_event_cap = kDefaultTraceEventCap;
size_t g_dropped = 0;
std::map<int, std::string> g_thread_names;
std::string g_process_name;

int64_t nanoseconds(Clock::time_point at) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(at.time_since_epoch()).count();
}

void add_event(TraceEvent event) {
  std::lock_guard lock(g_trace_mutex);
  if (!g_tracing.load(std::memory_order_relaxed)) return;
  if (g_events.size() < g_event_cap) {
    g_events.push_back(std::move(event));
    return;
  }
  if (g_dropped++ == 0) {
    // One event past the cap marks where the trace stops.
    g_events.push_back({"trace event cap reached: later events were dropped", "trace", 'i', event.thread,
                        event.start_ns, 0, {}});
  }
}

#if LOOM_HAVE_CUDA
// Nsight Systems (or another NVTX tool) sets this before the program starts.
bool nvtx_tool_attached() {
  static const bool attached = std::getenv("NVTX_INJECTION64_PATH") != nullptr;
  return attached;
}
bool nvtx_wanted() { return g_tracing.load(std::memory_order_relaxed) || nvtx_tool_attached(); }
void nvtx_push(const char* name) { nvtxRangePushA(name); }
void nvtx_pop() { nvtxRangePop(); }
#else
bool nvtx_tool_attached() { return false; }
bool nvtx_wanted() { return false; }
void nvtx_push(const char*) {}
void nvtx_pop() {}
#endif

}  // namespace

bool enabled() { return g_enabled.load(std::memory_order_relaxed); }
void set_enabled(bool on) { g_enabled = on; }

void reset() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_entries.clear();
}

bool tracing() { return g_tracing.load(std::memory_order_relaxed); }
bool active() { return enabled() || tracing() || nvtx_tool_attached(); }

void start_tracing(size_t max_events) {
  LOOM_CHECK(max_events >= 1, "profiler::start_tracing: the event cap must be at least 1");
  std::lock_guard lock(g_trace_mutex);
  g_events.clear();
  g_events.reserve(std::min<size_t>(max_events, 65536));
  g_event_cap = max_events;
  g_dropped = 0;
  g_tracing = true;
}

void stop_tracing() { g_tracing = false; }

int current_thread_id() {
  static thread_local const int id = static_cast<int>(::syscall(SYS_gettid));
  return id;
}

void set_thread_name(const std::string& name) {
  std::lock_guard lock(g_trace_mutex);
  g_thread_names[current_thread_id()] = name;
}

void set_process_name(const std::string& name) {
  std::lock_guard lock(g_trace_mutex);
  g_process_name = name;
}

void record_complete(const std::string& name, const char* category, Clock::time_point start, Clock::time_point end,
                     int thread_id, const std::string& args) {
  if (!tracing()) return;
  add_event({name, category, 'X', thread_id, nanoseconds(start), std::max<int64_t>(0, nanoseconds(end) - nanoseconds(start)),
             args});
}

void record_instant(const std::string& name, const char* category, Clock::time_point at, int thread_id,
                    const std::string& args) {
  if (!tracing()) return;
  add_event({name, category, 'i', thread_id, nanoseconds(at), 0, args});
}

void write_chrome_trace(const std::string& path) {
  std::vector<TraceEvent> events;
  std::map<int, std::string> thread_names;
  std::string process_name;
  size_t dropped = 0, cap = 0;
  {
    std::lock_guard lock(g_trace_mutex);
    events = g_events;
    thread_names = g_thread_names;
    process_name = g_process_name;
    dropped = g_dropped;
    cap = g_event_cap;
  }
  const int pid = static_cast<int>(::getpid());
  for (const TraceEvent& event : events)
    if (!thread_names.count(event.thread))
      thread_names[event.thread] = event.thread == pid ? "main" : str("thread ", event.thread);
  // Written beside the target, then renamed: a failed write leaves no half file.
  const std::string temporary = path + ".partial";
  std::FILE* file = std::fopen(temporary.c_str(), "w");
  LOOM_CHECK(file != nullptr, "cannot write the trace file ", path, ": ", std::strerror(errno));
  std::fprintf(file, "{\"displayTimeUnit\": \"ms\",\n\"otherData\": {\"producer\": \"loom profiler\", "
                     "\"events\": %zu, \"event_cap\": %zu, \"dropped_events\": %zu",
               events.size(), cap, dropped);
  if (dropped > 0)
    std::fprintf(file, ", \"note\": \"the cap of %zu events was reached; %zu later events were dropped "
                       "(a shorter run or a larger cap keeps them)\"",
                 cap, dropped);
  std::fprintf(file, "},\n\"traceEvents\": [\n");
  bool first = true;
  auto separator = [&] {
    if (!first) std::fputs(",\n", file);
    first = false;
  };
  if (!process_name.empty()) {
    separator();
    std::fprintf(file, "{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": %d, \"tid\": 0, \"args\": {\"name\": %s}}",
                 pid, json_string(process_name).c_str());
  }
  for (const auto& [thread, name] : thread_names) {
    separator();
    std::fprintf(file, "{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": %d, \"tid\": %d, \"args\": {\"name\": %s}}",
                 pid, thread, json_string(name).c_str());
  }
  for (const TraceEvent& event : events) {
    separator();
    std::fprintf(file, "{\"ph\": \"%c\", \"name\": %s, \"cat\": \"%s\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f",
                 event.phase, json_string(event.name).c_str(), event.category, pid, event.thread,
                 static_cast<double>(event.start_ns) / 1000.0);
    if (event.phase == 'X') std::fprintf(file, ", \"dur\": %.3f", static_cast<double>(event.duration_ns) / 1000.0);
    if (event.phase == 'i') std::fputs(", \"s\": \"t\"", file);
    if (!event.args.empty()) std::fprintf(file, ", \"args\": {%s}", event.args.c_str());
    std::fputc('}', file);
  }
  std::fputs("\n]}\n", file);
  const bool written = std::ferror(file) == 0;
  const bool closed = std::fclose(file) == 0;
  if (!written || !closed || std::rename(temporary.c_str(), path.c_str()) != 0) {
    const int error = errno;
    std::remove(temporary.c_str());
    LOOM_FAIL("cannot write the trace file ", path, ": ", std::strerror(error));
  }
}

Range::Range(const char* name, const char* category) : name_(name), category_(category) {
  traced_ = tracing();
  nvtx_ = nvtx_wanted();
  if (nvtx_) nvtx_push(name);
  if (traced_) start_ = Clock::now();
}

Range::~Range() {
  if (nvtx_) nvtx_pop();
  if (traced_) record_complete(name_, category_, start_, Clock::now(), current_thread_id());
}

Scope::Scope(const char* name, const Tensor& shape_of) : active_(active()) {
  if (!active_) return;
  summed_ = enabled();
  traced_ = tracing();
  nvtx_ = nvtx_wanted();
  key_ = name;
  name_size_ = key_.size();
  if (shape_of.defined()) {
    key_ += ' ';  // (not " " + string: GCC 12 warns a false -Wrestrict on that)
    key_ += shape_str(shape_of.sizes());
  }
  parent_ = t_innermost;
  t_innermost = this;
  if (nvtx_) nvtx_push(name);
  start_ = std::chrono::steady_clock::now();
}

void add_flops(double flops) {
  if (t_innermost != nullptr) t_innermost->flops_ += flops;
}

Scope::~Scope() {
  if (!active_) return;
  const Clock::time_point end = Clock::now();
  const double seconds = std::chrono::duration<double>(end - start_).count();
  t_innermost = parent_;
  if (nvtx_) nvtx_pop();
  if (traced_) {
    std::string args;
    if (key_.size() > name_size_) args = str("\"shape\": ", json_string(key_.substr(name_size_ + 1)));
    if (flops_ > 0) args += str(args.empty() ? "" : ", ", "\"flops\": ", static_cast<int64_t>(flops_));
    record_complete(key_.substr(0, name_size_), "op", start_, end, current_thread_id(), args);
  }
  if (!summed_) return;
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
