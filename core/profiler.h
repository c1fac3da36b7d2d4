// A per-op profiler for CPU training steps: ops and autograd nodes open a
// Scope; when profiling is on, time is summed per (name, input shape) so every
// layer of a network gets its own forward and backward line. When tracing is
// on, every Scope and Range is also kept as an event with its thread and
// times, and write_chrome_trace() saves them for Perfetto / chrome://tracing.
// In CUDA builds the same scopes are NVTX ranges while tracing or while an
// NVTX tool (Nsight Systems) is attached.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include <loom/core/tensor.h>

namespace loom::profiler {

bool enabled();
void set_enabled(bool on);
void reset();
// A table of total ms, calls, share and (where counted) GFLOP/s per
// (name, shape), largest first, then the GFLOP/s of each op summed over its
// layers ("conv2d", "conv2d backward", ...).
std::string report();

// Counts floating-point operations (a multiply-add is 2) against the
// innermost open Scope on this thread; nothing when profiling is off.
void add_flops(double flops);

// ---- Chrome trace (Trace Event Format) ----

using Clock = std::chrono::steady_clock;

// Events kept at most: about 150 bytes each with their names, so some 75 MB
// at the cap (a ResNet-50 step makes about 1,000). Later events are counted,
// not kept, and the file says how many were dropped.
inline constexpr size_t kDefaultTraceEventCap = 500000;

// Starts keeping events (dropping any kept before); stop_tracing() stops.
void start_tracing(size_t max_events = kDefaultTraceEventCap);
void stop_tracing();
bool tracing();
// Profiling, tracing or an NVTX tool attached: a Scope records something.
bool active();

// Writes the events kept since start_tracing() as Trace Event Format JSON
// (object form): "X" complete events and "i" instants with ts / dur in
// microseconds of the steady clock, pid, tid, name, cat and args, plus
// process and thread names ("M" metadata). Throws loom::Error naming `path`
// when it cannot be written.
void write_chrome_trace(const std::string& path);

// This thread's id as the trace (and the OS) shows it.
int current_thread_id();
// Names the calling thread / this process in the trace ("gloo communication",
// "rank 1"); unnamed threads show as "thread <id>", the main one as "main".
void set_thread_name(const std::string& name);
void set_process_name(const std::string& name);

// An event the caller timed itself (a bucket's collective, seen after the
// fact), on thread `thread_id`. `args` is the body of a JSON object
// ("\"bytes\": 4096") or empty. Nothing when tracing is off.
void record_complete(const std::string& name, const char* category, Clock::time_point start, Clock::time_point end,
                     int thread_id, const std::string& args = {});
void record_instant(const std::string& name, const char* category, Clock::time_point at, int thread_id,
                    const std::string& args = {});

// A traced span that is not an op (the consumer waiting for a batch): a
// complete event of `category` while tracing, an NVTX range in CUDA builds;
// not part of report(). `name` and `category` must outlive the Range.
class Range {
 public:
  Range(const char* name, const char* category);
  ~Range();
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  const char* name_;
  const char* category_;
  bool traced_ = false;
  bool nvtx_ = false;
  Clock::time_point start_;
};

class Scope {
 public:
  // `shape_of` names the layer by its input shape; may be undefined.
  explicit Scope(const char* name, const Tensor& shape_of = Tensor());
  explicit Scope(const std::string& name, const Tensor& shape_of = Tensor()) : Scope(name.c_str(), shape_of) {}
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  friend void add_flops(double flops);
  bool active_;
  bool summed_ = false;  // profiling: counted in report()
  bool traced_ = false;  // tracing: kept as an "op" event
  bool nvtx_ = false;
  double flops_ = 0;
  Scope* parent_ = nullptr;
  std::string key_;    // "name [shape]"
  size_t name_size_ = 0;  // key_'s name part
  std::chrono::steady_clock::time_point start_;
};

}  // namespace loom::profiler
