// The CUDA runtime of a build without CUDA: no devices, clear errors, and
// destructors / frees that do nothing.
#include <loom/core/cuda/graph.h>
#include <loom/core/cuda/runtime.h>
#include <loom/core/cuda/tensor_kernels.h>
#include <loom/core/error.h>

namespace loom::cuda {
namespace {
[[noreturn]] void no_cuda() {
  LOOM_FAIL("loom was built without CUDA; rebuild with -DLOOM_CUDA=ON on a machine with the CUDA toolkit, or use --device cpu");
}
}  // namespace

bool built_with_cuda() { return false; }
int device_count() { return 0; }
std::string device_count_error() { return {}; }
void require_device(int) { no_cuda(); }
std::string device_name(int) { no_cuda(); }
int compute_capability(int) { no_cuda(); }
double peak_memory_bandwidth_gbs(int) { no_cuda(); }
int current_device() { no_cuda(); }
void set_device(int) { no_cuda(); }
int local_rank_device() { no_cuda(); }
DeviceMemory device_memory(int) { no_cuda(); }
void synchronize(int) { no_cuda(); }
void profiler_start() { no_cuda(); }
void profiler_stop() { no_cuda(); }

void StreamView::synchronize() const { no_cuda(); }
bool StreamView::query() const { no_cuda(); }
void StreamView::wait(const Event&) const { no_cuda(); }
Stream::Stream(int device, StreamPriority) : DeviceHandleOwner(device) { no_cuda(); }
Event::Event(int device, EventTiming) : DeviceHandleOwner(device) { no_cuda(); }
void detail::release_stream(StreamHandle) noexcept {}
void detail::release_event(EventHandle) noexcept {}
void Event::record(StreamView) { no_cuda(); }
bool Event::query() const { return true; }
void Event::synchronize() const {}
float Event::elapsed_ms(const Event&) const { no_cuda(); }
StreamView current_stream(int device) { return {device, nullptr}; }
void set_current_stream(StreamView) { no_cuda(); }
StreamView pooled_stream(int, StreamPriority) { no_cuda(); }
StreamGuard::StreamGuard(StreamView) { no_cuda(); }
StreamGuard::~StreamGuard() = default;
DeviceGuard::DeviceGuard(int) { no_cuda(); }
DeviceGuard::~DeviceGuard() = default;

void* allocate(size_t, int) { no_cuda(); }
void deallocate(void*, int) noexcept {}
void record_stream(void*, int, StreamView) { no_cuda(); }
MemoryStats memory_stats(int) { no_cuda(); }
void reset_peak_memory_stats(int) { no_cuda(); }
void empty_cache(int) { no_cuda(); }
void begin_private_pool(int, uint64_t, StreamView) { no_cuda(); }
void end_private_pool(int, StreamView) { no_cuda(); }
void release_private_pool(int, uint64_t) noexcept {}

struct Graph::Captured {};
Graph::Graph(int device) : device_(device), pool_(0) { require_device(device); }
Graph::~Graph() = default;
void Graph::capture(const std::function<void()>&) { no_cuda(); }
void Graph::replay() { no_cuda(); }
bool Graph::captured() const { return false; }
std::string memory_summary(int) { no_cuda(); }

void* allocate_pinned(size_t) { no_cuda(); }
void free_pinned(void*) noexcept {}
bool is_pinned(const void*) { return false; }
void record_pinned_use(const void*, StreamView) {}

void copy_bytes(void*, bool, const void*, bool, size_t, int) { no_cuda(); }
void copy_bytes_async(void*, bool, const void*, bool, size_t, StreamView) { no_cuda(); }
void copy_between_devices(void*, int, const void*, int, size_t, StreamView) { no_cuda(); }

void fill(void*, DType, const std::vector<int64_t>&, const std::vector<int64_t>&, double, StreamView) { no_cuda(); }
void copy_strided(void*, DType, const std::vector<int64_t>&, const void*, DType, const std::vector<int64_t>&,
                  const std::vector<int64_t>&, StreamView) {
  no_cuda();
}
void add_scaled(void*, const void*, DType, int64_t, double, StreamView) { no_cuda(); }
void scale(void*, DType, int64_t, double, StreamView) { no_cuda(); }

}  // namespace loom::cuda
