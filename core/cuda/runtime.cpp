// The CUDA runtime as loom sees it (runtime.h, stream.h): errors, devices,
// streams, events and guards; memory and copies are in memory.cpp.
// Works on a machine without a GPU: device_count() is 0 there.
#include <loom/core/cuda/runtime.h>

#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <loom/core/cuda/caching_allocator.h>
#include <loom/core/cuda/check.h>
#include <loom/core/error.h>

namespace loom::cuda {

// ---- errors ----

namespace detail {
namespace {
// "core/cuda/runtime.cpp" rather than the absolute path of the build machine.
const char* repository_path(const char* file) {
  const char* best = file;
  for (const char* top : {"/core/", "/ops/", "/optim/", "/dist/", "/nn/", "/data/", "/tests/", "/benchmarks/", "/apps/"}) {
    for (const char* p = std::strstr(file, top); p != nullptr; p = std::strstr(p + 1, top)) best = std::max(best, p + 1);
  }
  return best;
}
}  // namespace

void throw_library_error(const char* library, const char* call, const char* file, int line, long long code,
                         const char* message) {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    device = -1;
  }
  throw Error(str(call, " failed at ", repository_path(file), ":", line, " on cuda:", device, ": ", message, " (",
                  library, " error ", code, ")"));
}

bool work_finished(int status_code, const char* call, const char* file, int line) {
  const auto status = static_cast<cudaError_t>(status_code);
  if (status == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw_library_error("CUDA", call, file, line, status_code, cudaGetErrorString(status));
  }
  return true;
}
}  // namespace detail

// ---- devices ----

bool built_with_cuda() { return true; }

namespace {
struct DeviceCount {
  int count = 0;
  std::string error;
};
const DeviceCount& query_device_count() {
  static const DeviceCount result = [] {
    DeviceCount r;
    const cudaError_t status = cudaGetDeviceCount(&r.count);
    if (status != cudaSuccess) {
      cudaGetLastError();  // clear the "no driver" / "no device" error
      r.count = 0;
      r.error = std::string(cudaGetErrorString(status)) + " (CUDA error " +
                std::to_string(static_cast<int>(status)) + ")";
    }
    return r;
  }();
  return result;
}
}  // namespace

int device_count() { return query_device_count().count; }
std::string device_count_error() { return query_device_count().error; }

void require_device(int index) {
  const int count = device_count();
  if (count == 0) {
    LOOM_FAIL("no CUDA device is visible (no GPU, no driver, or CUDA_VISIBLE_DEVICES is empty); use --device cpu");
  }
  if (index < 0 || index >= count) LOOM_FAIL(device_ordinal_error(index, count, std::getenv("CUDA_VISIBLE_DEVICES")));
}

std::string device_name(int index) {
  require_device(index);
  cudaDeviceProp prop{};
  LOOM_CHECK_CUDA(cudaGetDeviceProperties(&prop, index));
  char memory[32];
  std::snprintf(memory, sizeof(memory), "%.1f GiB", static_cast<double>(prop.totalGlobalMem) / (1 << 30));
  return str(prop.name, " (sm_", prop.major, prop.minor, ", ", prop.multiProcessorCount, " SMs, ", memory, ")");
}

int compute_capability(int index) {
  require_device(index);
  int major = 0, minor = 0;
  LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index));
  LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index));
  return major * 10 + minor;
}

double peak_memory_bandwidth_gbs(int index) {
  require_device(index);
  int clock_khz = 0, bus_bits = 0;
  LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, index));
  LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, index));
  return 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;
}

int current_device() {
  int device = 0;
  LOOM_CHECK_CUDA(cudaGetDevice(&device));
  return device;
}

namespace {
// Whether the calling thread has left CUDA's implicit device 0: by
// set_device, or by a DeviceGuard that changed its device (whose device then
// stays the thread's own; see stream.h).
thread_local bool t_device_chosen = false;
}  // namespace

void set_device(int index) {
  require_device(index);
  LOOM_CHECK_CUDA(cudaSetDevice(index));
  t_device_chosen = true;
}

int local_rank_device() {
  const int count = device_count();
  if (count == 0) require_device(0);  // throws the one-line reason
  for (const char* name : {"LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"}) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') continue;
    char* end = nullptr;
    const long rank = std::strtol(value, &end, 10);
    LOOM_CHECK(*end == '\0' && rank >= 0, name, "='", value, "' is not a local rank (a number >= 0)");
    return static_cast<int>(rank % count);
  }
  return 0;
}

DeviceMemory device_memory(int index) {
  require_device(index);
  DeviceGuard guard(index);
  DeviceMemory memory;
  LOOM_CHECK_CUDA(cudaMemGetInfo(&memory.free_bytes, &memory.total_bytes));
  return memory;
}

void synchronize(int device) {
  require_device(device);
  DeviceGuard guard(device);
  detail::count_host_sync(HostSync::device_synchronize);
  LOOM_CHECK_CUDA(cudaDeviceSynchronize());
}

void profiler_start() { LOOM_CHECK_CUDA(cudaProfilerStart()); }
void profiler_stop() { LOOM_CHECK_CUDA(cudaProfilerStop()); }

// ---- streams, events, guards ----

namespace {
// The calling thread's current stream of each device (nullptr: the default stream).
std::vector<StreamHandle>& thread_streams() {
  thread_local std::vector<StreamHandle> streams;
  return streams;
}
}  // namespace

StreamView current_stream(int device) {
  const auto& streams = thread_streams();
  return {device, device >= 0 && device < static_cast<int>(streams.size()) ? streams[device] : nullptr};
}

void set_current_stream(StreamView stream) {
  require_device(stream.device());
  auto& streams = thread_streams();
  if (static_cast<int>(streams.size()) <= stream.device()) streams.resize(stream.device() + 1, nullptr);
  streams[stream.device()] = stream.handle();
}

StreamView pooled_stream(int device, StreamPriority priority) {
  require_device(device);
  struct Pool {
    std::vector<Stream> streams;  // never destroyed (see stream.h)
    int next = 0;
  };
  static std::mutex mutex;
  static auto* pools = new std::map<std::pair<int, StreamPriority>, Pool>;  // outlives static destructors
  std::lock_guard lock(mutex);
  Pool& pool = (*pools)[{device, priority}];
  if (static_cast<int>(pool.streams.size()) < kPooledStreams) {
    pool.streams.emplace_back(device, priority);
    return pool.streams.back().view();
  }
  return pool.streams[pool.next++ % kPooledStreams].view();
}

StreamGuard::StreamGuard(StreamView stream) : previous_(current_stream(stream.device())) { set_current_stream(stream); }
StreamGuard::~StreamGuard() {
  auto& streams = thread_streams();
  if (previous_.device() < static_cast<int>(streams.size())) streams[previous_.device()] = previous_.handle();
}

DeviceGuard::DeviceGuard(int device) {
  LOOM_CHECK_CUDA(cudaGetDevice(&previous_));
  if (previous_ == device) return;
  LOOM_CHECK_CUDA(cudaSetDevice(device));
  if (!t_device_chosen) previous_ = -1;  // the implicit device 0 is not restored: see stream.h
  t_device_chosen = true;
}
DeviceGuard::~DeviceGuard() {
  int now = -1;
  if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
}

void StreamView::synchronize() const {
  DeviceGuard guard(device_);
  detail::count_host_sync(HostSync::stream_synchronize);
  LOOM_CHECK_CUDA(cudaStreamSynchronize(handle_));
}

bool StreamView::query() const {
  DeviceGuard guard(device_);
  return LOOM_CUDA_FINISHED(cudaStreamQuery(handle_));
}

void StreamView::wait(const Event& event) const {
  if (event.handle() == nullptr) return;
  DeviceGuard guard(device_);
  LOOM_CHECK_CUDA(cudaStreamWaitEvent(handle_, event.handle(), 0));
}

Stream::Stream(int device, StreamPriority priority) : DeviceHandleOwner(device) {
  require_device(device);
  DeviceGuard guard(device);
  int least = 0, greatest = 0;
  LOOM_CHECK_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  const int value = priority == StreamPriority::high ? greatest : least;
  LOOM_CHECK_CUDA(cudaStreamCreateWithPriority(&handle_, cudaStreamNonBlocking, value));
}

Event::Event(int device, EventTiming timing) : DeviceHandleOwner(device) {
  require_device(device);
  DeviceGuard guard(device);
  LOOM_CHECK_CUDA(
      cudaEventCreateWithFlags(&handle_, timing == EventTiming::enabled ? cudaEventDefault : cudaEventDisableTiming));
}

namespace detail {
void release_stream(StreamHandle handle) noexcept { cudaStreamDestroy(handle); }
void release_event(EventHandle handle) noexcept { cudaEventDestroy(handle); }
}  // namespace detail

void Event::record(StreamView stream) {
  LOOM_CHECK(handle_ != nullptr, "Event::record on a moved-from event");
  LOOM_CHECK(stream.device() == device_, "Event of cuda:", device_, " recorded on a stream of cuda:", stream.device());
  DeviceGuard guard(device_);
  LOOM_CHECK_CUDA(cudaEventRecord(handle_, stream.handle()));
}

bool Event::query() const {
  return handle_ == nullptr || LOOM_CUDA_FINISHED(cudaEventQuery(handle_));
}

void Event::synchronize() const {
  if (handle_ == nullptr) return;
  detail::count_host_sync(HostSync::event_synchronize);
  LOOM_CHECK_CUDA(cudaEventSynchronize(handle_));
}

float Event::elapsed_ms(const Event& later) const {
  float ms = 0;
  LOOM_CHECK_CUDA(cudaEventElapsedTime(&ms, handle_, later.handle_));
  return ms;
}

}  // namespace loom::cuda
