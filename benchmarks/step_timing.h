// Timing training steps for the throughput benchmarks, as scripts/gpu-perf.sh
// reads it: `repeats` runs of `steps` steps after the warm-up. On a GPU each
// run is timed between two CUDA events on the current stream, and the CUDA
// layer's counters (core/cuda/counters.h) are read before the run and after
// its steps are queued, before the host waits for them, so the harness's own
// waits are not counted; on the CPU the steady clock times each run (after
// nothing is left to wait for) and the counters stay 0.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <loom/core/cuda/counters.h>
#include <loom/core/cuda/runtime.h>
#include <loom/core/cuda/stream.h>
#include <loom/core/device.h>
#include <loom/core/error.h>
#include <loom/core/tensor.h>
#include "benchmarks/stats.h"

namespace loom::bench {

struct StepTiming {
  std::vector<double> ms_per_step;  // one per run: its time / its steps
  cuda::Counters counters;          // summed over every timed step
  int64_t timed_steps = 0;
  double total_ms = 0;  // of every run
  std::string clock;  // "cuda_events" or "steady_clock"
  cuda::MemoryStats before_runs;  // GPU: the allocator's counters (its peaks: the warm-up's) before the first run

  double median_ms() const { return median(ms_per_step); }
  double min_ms() const { return ms_per_step.empty() ? 0 : *std::min_element(ms_per_step.begin(), ms_per_step.end()); }
  double max_ms() const { return ms_per_step.empty() ? 0 : *std::max_element(ms_per_step.begin(), ms_per_step.end()); }
  double per_step(int64_t count) const { return timed_steps == 0 ? 0 : static_cast<double>(count) / timed_steps; }
};

// Runs `repeats` x `steps` calls of step() on `device` (the warm-up is the caller's).
inline StepTiming time_steps(const Device& device, int64_t repeats, int64_t steps, const std::function<void()>& step) {
  LOOM_CHECK(repeats > 0 && steps > 0, "time_steps: repeats and steps must be positive, not ", repeats, " and ", steps);
  StepTiming timing;
  timing.clock = device.is_cuda() ? "cuda_events" : "steady_clock";
  if (device.is_cuda()) {
    cuda::synchronize(device.index);
    // The peak since the start is kept here; the allocator's own then covers the runs alone.
    timing.before_runs = cuda::memory_stats(device.index);
    cuda::reset_peak_memory_stats(device.index);
  }
  for (int64_t run = 0; run < repeats; ++run) {
    if (device.is_cuda()) {
      const cuda::StreamView stream = cuda::current_stream(device.index);
      cuda::Event start(device.index, cuda::EventTiming::enabled), end(device.index, cuda::EventTiming::enabled);
      const cuda::Counters before = cuda::counters();
      start.record(stream);
      for (int64_t i = 0; i < steps; ++i) step();
      end.record(stream);
      const cuda::Counters queued = cuda::counters() - before;
      end.synchronize();
      const double ms = start.elapsed_ms(end);
      timing.ms_per_step.push_back(ms / static_cast<double>(steps));
      timing.total_ms += ms;
      timing.counters = timing.counters + queued;
    } else {
      const auto start = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < steps; ++i) step();
      const std::chrono::duration<double, std::milli> elapsed = std::chrono::steady_clock::now() - start;
      timing.ms_per_step.push_back(elapsed.count() / static_cast<double>(steps));
      timing.total_ms += elapsed.count();
    }
    timing.timed_steps += steps;
  }
  return timing;
}

// On a GPU, one more step() between cudaProfilerStart and cudaProfilerStop,
// with nothing else queued around it: the one step that a profiler started
// with `ncu --profile-from-start off` records (scripts/gpu-perf.sh's per-kernel times).
inline void profiled_step(const Device& device, const std::function<void()>& step) {
  if (!device.is_cuda()) return;
  cuda::synchronize(device.index);
  cuda::profiler_start();
  step();
  cuda::synchronize(device.index);
  cuda::profiler_stop();
}

// What time_training measured: the timing, and the loss of every warm-up and
// timed step, in order.
struct TrainingTiming {
  StepTiming timing;
  std::vector<double> losses;
};

// A throughput benchmark's run of train_step() (one training step, returning
// its loss): `warmup` steps, then time_steps(), then profiled_step() when
// `profile_one_step`. The losses are read only after the timing, so the host
// never waits for the device inside it; they are checked to be finite.
inline TrainingTiming time_training(const Device& device, int64_t warmup, int64_t repeats, int64_t steps,
                                    bool profile_one_step, const std::function<Tensor()>& train_step) {
  std::vector<Tensor> loss_tensors;
  for (int64_t step = 0; step < warmup; ++step) loss_tensors.push_back(train_step());
  TrainingTiming run{time_steps(device, repeats, steps, [&] { loss_tensors.push_back(train_step()); }), {}};
  if (profile_one_step) profiled_step(device, [&] { train_step(); });
  for (const Tensor& loss : loss_tensors) run.losses.push_back(loss.item());
  for (double loss : run.losses) {
    if (!std::isfinite(loss)) throw Error("loss is not finite");
  }
  return run;
}

// The allocator's counters of `device` now, with its peaks since the start
// (time_steps resets them before the first run).
inline cuda::MemoryStats memory_since_start(const StepTiming& t, int device) {
  cuda::MemoryStats m = cuda::memory_stats(device);
  m.peak_allocated_bytes = std::max(m.peak_allocated_bytes, t.before_runs.peak_allocated_bytes);
  m.peak_reserved_bytes = std::max(m.peak_reserved_bytes, t.before_runs.peak_reserved_bytes);
  return m;
}

// The fields every throughput benchmark adds to its JSON line (a leading
// ", "): the runs, median / min / max ms per step, launches and host waits
// per timed step (loom's own: core/cuda/counters.h; fused graphs refused
// among them), and on a GPU the
// allocator's peaks since the start (warm-up and cuDNN's algorithm search
// included, as PyTorch's max_memory_allocated after a reset at the start)
// and during the runs alone, and the device's name.
inline std::string step_timing_json(const StepTiming& t, const Device& device) {
  std::string runs;
  for (double ms : t.ms_per_step) runs += str(runs.empty() ? "" : ", ", ms);
  const cuda::Counters& c = t.counters;
  std::string json =
      str(", \"timing\": \"", t.clock, "\", \"repeats\": ", t.ms_per_step.size(), ", \"ms_per_step\": [", runs,
          "], \"median_ms\": ", t.median_ms(), ", \"min_ms\": ", t.min_ms(), ", \"max_ms\": ", t.max_ms(),
          ", \"launches_per_step\": ", t.per_step(c.launches()), ", \"kernel_launches_per_step\": ",
          t.per_step(c.kernel_launches), ", \"library_calls_per_step\": ", t.per_step(c.library_calls),
          ", \"device_copies_per_step\": ", t.per_step(c.device_copies), ", \"syncs_per_step\": ",
          t.per_step(c.host_syncs()), ", \"sync_kinds_per_step\": {\"stream\": ", t.per_step(c.stream_synchronizes),
          ", \"event\": ", t.per_step(c.event_synchronizes), ", \"device\": ", t.per_step(c.device_synchronizes),
          ", \"device_to_host_copy\": ", t.per_step(c.device_to_host_copies),
          ", \"blocking_copy\": ", t.per_step(c.blocking_copies), "}, \"graph_fallbacks_per_step\": ",
          t.per_step(c.graph_fallbacks), ", \"graph_runs_per_step\": ", t.per_step(c.graph_runs));
  if (device.is_cuda()) {
    const cuda::MemoryStats runs = cuda::memory_stats(device.index), all = memory_since_start(t, device.index);
    json += str(", \"peak_allocated_bytes\": ", all.peak_allocated_bytes, ", \"peak_reserved_bytes\": ",
                all.peak_reserved_bytes, ", \"peak_allocated_bytes_runs\": ", runs.peak_allocated_bytes,
                ", \"peak_reserved_bytes_runs\": ", runs.peak_reserved_bytes, ", \"gpu\": \"",
                cuda::device_name(device.index), "\"");
  }
  return json;
}

}  // namespace loom::bench
