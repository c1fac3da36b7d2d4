// A per-op profiler for CPU training steps: ops and autograd nodes open a
// Scope; when profiling is on, time is summed per (name, input shape) so every
// layer of a network gets its own forward and backward line.
#pragma once

#include <chrono>
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
  double flops_ = 0;
  Scope* parent_ = nullptr;
  std::string key_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace loom::profiler
