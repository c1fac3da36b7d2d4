// Counts of what loom's CUDA layer asks of the GPU and of the host's waits
// for it, process-wide (every thread, every device), since the start or the
// last reset_counters(): the figures behind a benchmark's "launches per step"
// and "host syncs per step". Plain C++ in every build (a build without CUDA
// counts nothing unless told to).
//
// Counted where loom makes the call:
//   kernel_launches   loom's own kernels: LOOM_CHECK_LAUNCH() (core/cuda/check.h),
//                     which every launch site runs once per launch
//   library_calls     cuDNN convolution passes and cuBLAS matrix products loom issues
//                     (each may launch one or more kernels of its own)
//   device_copies     copies loom enqueues on a stream (cudaMemcpyAsync / cudaMemcpyPeerAsync)
//   host-blocking calls, each kind once per call:
//     stream_synchronizes, event_synchronizes, device_synchronizes
//     device_to_host_copies   a copy to host memory that returns only when done: Tensor::to(cpu),
//                             item(), an asynchronous copy into pageable memory
//     blocking_copies         other synchronous copies (host to device, within a device)
//   graph_fallbacks   fused cuDNN graphs refused (ops/cuda/conv2d_graph.h), each
//                     call whose caller then runs the unfused ops
//   graph_runs        fused cuDNN graphs run; each also counts as one library call
// Not counted: work that cuDNN or cuBLAS launch inside a call, cudaMemsetAsync,
// cudaFree (which waits for the device; MemoryStats::device_frees counts it).
#pragma once

#include <cstdint>

namespace loom::cuda {

struct Counters {
  int64_t kernel_launches = 0;
  int64_t library_calls = 0;
  int64_t device_copies = 0;
  int64_t stream_synchronizes = 0;
  int64_t event_synchronizes = 0;
  int64_t device_synchronizes = 0;
  int64_t device_to_host_copies = 0;
  int64_t blocking_copies = 0;
  int64_t graph_fallbacks = 0;
  int64_t graph_runs = 0;

  // Every call that made the host wait for the device.
  int64_t host_syncs() const {
    return stream_synchronizes + event_synchronizes + device_synchronizes + device_to_host_copies + blocking_copies;
  }
  // Work loom put on a stream: its kernels, library calls and copies.
  int64_t launches() const { return kernel_launches + library_calls + device_copies; }
  // What happened between two readings (later - earlier), and sums, field by field.
  Counters operator-(const Counters& earlier) const;
  Counters operator+(const Counters& other) const;
  bool operator==(const Counters&) const = default;
};

// A reading of the counters (each field read atomically; fields counted by
// other threads meanwhile may be one call apart).
Counters counters();
// Sets every counter to 0.
void reset_counters();

enum class HostSync { stream_synchronize, event_synchronize, device_synchronize, device_to_host_copy, blocking_copy };
// "stream_synchronize", ...: the kind's name, for messages.
const char* host_sync_name(HostSync kind);

// The host syncs the calling thread asked for while it captured a CUDA graph
// (cuda::Graph::capture, which sets the mark): a capture cannot hold one, and
// its error names the first.
struct CaptureSyncs {
  int64_t count = 0;
  HostSync first = HostSync::stream_synchronize;
};

namespace detail {
// Called by the CUDA layer where it makes the call; cheap (one relaxed atomic add).
void count_kernel_launch() noexcept;
void count_library_call() noexcept;
void count_device_copy() noexcept;
void count_host_sync(HostSync kind) noexcept;
void count_graph_fallback() noexcept;
void count_graph_run() noexcept;  // also counts the library call
// Marks the calling thread as capturing a graph (true) or not, and returns
// the host syncs it counted since the mark was set.
CaptureSyncs set_capturing(bool capturing) noexcept;
}  // namespace detail

}  // namespace loom::cuda
