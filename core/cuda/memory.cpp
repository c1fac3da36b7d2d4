// CUDA memory as loom sees it (runtime.h): the per-device caching allocators,
// pinned host memory and copies.
#include <loom/core/cuda/runtime.h>

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

// ---- device memory ----

namespace {
// The CUDA side of a CachingAllocator: cudaMalloc / cudaFree and events on one device.
class CudaAllocatorBackend final : public AllocatorBackend {
 public:
  explicit CudaAllocatorBackend(int device) : device_(device) {}

  void* allocate(size_t nbytes) override {
    DeviceGuard guard(device_);
    void* ptr = nullptr;
    const cudaError_t status = cudaMalloc(&ptr, nbytes);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return nullptr;
    }
    LOOM_CHECK_CUDA(status);
    return ptr;
  }
  void free(void* ptr) override {
    DeviceGuard guard(device_);
    LOOM_CHECK_CUDA(cudaFree(ptr));
  }
  void* record_event(StreamHandle stream) override {
    DeviceGuard guard(device_);
    cudaEvent_t event = nullptr;
    LOOM_CHECK_CUDA(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    LOOM_CHECK_CUDA(cudaEventRecord(event, stream));
    return event;
  }
  bool event_completed(void* event) override {
    return LOOM_CUDA_FINISHED(cudaEventQuery(static_cast<cudaEvent_t>(event)));
  }
  void synchronize_event(void* event) override {
    detail::count_host_sync(HostSync::event_synchronize);
    LOOM_CHECK_CUDA(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
  }
  void destroy_event(void* event) override { cudaEventDestroy(static_cast<cudaEvent_t>(event)); }
  std::string describe_device_memory() override {
    DeviceGuard guard(device_);
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
      cudaGetLastError();
      return "";
    }
    char text[96];
    std::snprintf(text, sizeof(text), "the device has %.2f GiB free of %.2f GiB",
                  static_cast<double>(free_bytes) / (1 << 30), static_cast<double>(total_bytes) / (1 << 30));
    return text;
  }

 private:
  int device_;
};

constexpr int kMaxDevices = 64;

// The allocator of `device`, created on first use and never destroyed: tensors
// held in static objects are freed during process exit, after which cudaFree
// must not be called.
CachingAllocator& device_allocator(int device) {
  static std::array<std::once_flag, kMaxDevices> once;
  static std::array<CachingAllocator*, kMaxDevices> allocators{};
  require_device(device);
  LOOM_CHECK(device < kMaxDevices, "loom supports at most ", kMaxDevices, " CUDA devices per process");
  std::call_once(once[device], [device] {
    allocators[device] = new CachingAllocator(device, std::make_unique<CudaAllocatorBackend>(device),
                                              CachingAllocator::caching_from_environment());
  });
  return *allocators[device];
}

std::string bytes_mib(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return text;
}
}  // namespace

void* allocate(size_t nbytes, int device) {
  if (nbytes == 0) {
    require_device(device);
    return nullptr;
  }
  return device_allocator(device).allocate(nbytes, current_stream(device).handle());
}

void deallocate(void* ptr, int device) noexcept {
  if (ptr == nullptr) return;
  try {
    device_allocator(device).free(ptr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom: could not free CUDA memory on cuda:%d: %s\n", device, e.what());
  }
}

void record_stream(void* ptr, int device, StreamView stream) {
  if (ptr == nullptr) return;
  LOOM_CHECK(stream.device() == device, "record_stream: memory of cuda:", device, " and a stream of cuda:",
             stream.device());
  device_allocator(device).record_stream(ptr, stream.handle());
}

MemoryStats memory_stats(int device) { return device_allocator(device).stats(); }
void reset_peak_memory_stats(int device) { device_allocator(device).reset_peak(); }
void empty_cache(int device) { device_allocator(device).empty_cache(); }
void begin_private_pool(int device, uint64_t pool, StreamView stream) {
  device_allocator(device).begin_private_pool(pool, stream.handle());
}
void end_private_pool(int device, StreamView stream) { device_allocator(device).end_private_pool(stream.handle()); }
void release_private_pool(int device, uint64_t pool) noexcept {
  try {
    device_allocator(device).release_private_pool(pool);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom: could not release the CUDA graph memory pool %llu of cuda:%d: %s\n",
                 static_cast<unsigned long long>(pool), device, e.what());
  }
}

std::string memory_summary(int device) {
  const MemoryStats s = memory_stats(device);
  return str("cuda:", device, " allocated ", bytes_mib(s.allocated_bytes), " (peak ", bytes_mib(s.peak_allocated_bytes),
             "), reserved ", bytes_mib(s.reserved_bytes), " (peak ", bytes_mib(s.peak_reserved_bytes), "), ",
             s.allocations, " live allocations, ", s.device_allocs, " cudaMalloc / ", s.device_frees, " cudaFree, ",
             s.cache_hits, " cache hits, ", s.oom_retries, " OOM retries");
}

// ---- pinned host memory ----

namespace {
// Page-locked blocks cached by rounded size. A freed block is reused once the
// copies recorded against it (record_pinned_use) have completed.
class PinnedAllocator {
 public:
  void* allocate(size_t nbytes) {
    if (nbytes == 0) return nullptr;
    const size_t size = (nbytes + kRounding - 1) / kRounding * kRounding;
    std::lock_guard<std::mutex> lock(mutex_);
    collect_completed();
    auto& cached = free_[size];
    if (!cached.empty()) {
      char* ptr = cached.back();
      cached.pop_back();
      blocks_[ptr].in_use = true;
      return ptr;
    }
    void* ptr = nullptr;
    cudaError_t status = cudaHostAlloc(&ptr, size, cudaHostAllocPortable);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      release_cached();
      status = cudaHostAlloc(&ptr, size, cudaHostAllocPortable);
    }
    LOOM_CHECK_CUDA(status);
    blocks_[static_cast<char*>(ptr)] = Block{size, true, {}};
    return ptr;
  }

  void free(void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.find(static_cast<char*>(ptr));
    if (it == blocks_.end() || !it->second.in_use) {
      std::fprintf(stderr, "loom: free_pinned(%p): not a live pinned block\n", ptr);
      return;
    }
    it->second.in_use = false;
    if (it->second.events.empty()) {
      free_[it->second.size].push_back(it->first);
    } else {
      waiting_.push_back(it->first);
    }
  }

  bool contains(const void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    return find_live(ptr) != nullptr;
  }

  void record_use(const void* ptr, StreamView stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    Block* block = find_live(ptr);
    if (block == nullptr) return;  // ordinary host memory: nothing to protect
    drop_completed(block->events);  // a buffer reused for every batch must not pile up events
    DeviceGuard guard(stream.device());
    cudaEvent_t event = nullptr;
    LOOM_CHECK_CUDA(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    LOOM_CHECK_CUDA(cudaEventRecord(event, stream.handle()));
    block->events.push_back(event);
  }

 private:
  static constexpr size_t kRounding = 4096;
  struct Block {
    size_t size = 0;
    bool in_use = false;
    std::vector<cudaEvent_t> events;  // copies still using the block
  };

  Block* find_live(const void* ptr) {
    auto it = blocks_.upper_bound(static_cast<char*>(const_cast<void*>(ptr)));
    if (it == blocks_.begin()) return nullptr;
    --it;
    const char* p = static_cast<const char*>(ptr);
    if (!it->second.in_use || p >= it->first + it->second.size) return nullptr;
    return &it->second;
  }

  // Destroys the events whose work has completed.
  static void drop_completed(std::vector<cudaEvent_t>& events) {
    events.erase(std::remove_if(events.begin(), events.end(),
                                [](cudaEvent_t e) {
                                  const cudaError_t status = cudaEventQuery(e);
                                  if (status == cudaErrorNotReady) {
                                    cudaGetLastError();
                                    return false;
                                  }
                                  cudaEventDestroy(e);
                                  return true;
                                }),
                 events.end());
  }

  // Moves freed blocks whose copies have completed to the free lists.
  void collect_completed() {
    std::vector<char*> still_waiting;
    for (char* ptr : waiting_) {
      Block& block = blocks_[ptr];
      drop_completed(block.events);
      if (block.events.empty()) {
        free_[block.size].push_back(ptr);
      } else {
        still_waiting.push_back(ptr);
      }
    }
    waiting_ = std::move(still_waiting);
  }

  void release_cached() {
    for (auto& [size, list] : free_) {
      for (char* ptr : list) {
        cudaFreeHost(ptr);
        blocks_.erase(ptr);
      }
      list.clear();
    }
  }

  std::mutex mutex_;
  std::map<char*, Block> blocks_;  // every block, by address
  std::unordered_map<size_t, std::vector<char*>> free_;
  std::vector<char*> waiting_;  // freed, copies pending
};

PinnedAllocator& pinned_allocator() {
  static PinnedAllocator* allocator = new PinnedAllocator;  // never destroyed, as the device allocators
  return *allocator;
}
}  // namespace

void* allocate_pinned(size_t nbytes) {
  require_device(0);
  return pinned_allocator().allocate(nbytes);
}

void free_pinned(void* ptr) noexcept {
  if (ptr == nullptr) return;
  try {
    pinned_allocator().free(ptr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom: free_pinned failed: %s\n", e.what());
  }
}

bool is_pinned(const void* ptr) { return ptr != nullptr && device_count() > 0 && pinned_allocator().contains(ptr); }

void record_pinned_use(const void* ptr, StreamView stream) { pinned_allocator().record_use(ptr, stream); }

// ---- copies ----

namespace {
cudaMemcpyKind copy_kind(bool dst_on_device, bool src_on_device) {
  return dst_on_device ? (src_on_device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                       : (src_on_device ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
}

void enqueue_copy(void* dst, bool dst_on_device, const void* src, bool src_on_device, size_t nbytes,
                  StreamView stream) {
  DeviceGuard guard(stream.device());
  detail::count_device_copy();
  LOOM_CHECK_CUDA(cudaMemcpyAsync(dst, src, nbytes, copy_kind(dst_on_device, src_on_device), stream.handle()));
}
}  // namespace

void copy_bytes(void* dst, bool dst_on_device, const void* src, bool src_on_device, size_t nbytes, int device) {
  if (nbytes == 0) return;
  require_device(device);
  const StreamView stream = current_stream(device);
  // One wait of the host, counted once by what it waits for (before the
  // copy: inside a CUDA graph's capture the copy itself fails).
  detail::count_host_sync(src_on_device && !dst_on_device ? HostSync::device_to_host_copy : HostSync::blocking_copy);
  enqueue_copy(dst, dst_on_device, src, src_on_device, nbytes, stream);
  DeviceGuard guard(device);
  LOOM_CHECK_CUDA(cudaStreamSynchronize(stream.handle()));
}

void copy_bytes_async(void* dst, bool dst_on_device, const void* src, bool src_on_device, size_t nbytes,
                      StreamView stream) {
  if (nbytes == 0) return;
  // The runtime returns from a copy into pageable host memory only once it is done.
  if (src_on_device && !dst_on_device && !is_pinned(dst)) detail::count_host_sync(HostSync::device_to_host_copy);
  enqueue_copy(dst, dst_on_device, src, src_on_device, nbytes, stream);
}

void copy_between_devices(void* dst, int dst_device, const void* src, int src_device, size_t nbytes,
                          StreamView stream) {
  if (nbytes == 0) return;
  LOOM_CHECK(stream.device() == dst_device, "copy_between_devices: the stream must be on the destination device");
  // The copy waits for the source's pending writes; the source device's later
  // work (which may reuse the source memory) waits for the copy.
  const StreamView source_stream = current_stream(src_device);
  Event source_ready(src_device);
  source_ready.record(source_stream);
  stream.wait(source_ready);
  {
    DeviceGuard guard(dst_device);
    detail::count_device_copy();
    LOOM_CHECK_CUDA(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, nbytes, stream.handle()));
  }
  Event copied(dst_device);
  copied.record(stream);
  source_stream.wait(copied);
}

}  // namespace loom::cuda
