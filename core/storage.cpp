#include "core/storage.h"

#include <atomic>
#include <cstdlib>
#include <new>

#include "core/cuda/runtime.h"
#include "core/error.h"

namespace loom {
namespace {
std::atomic<size_t> g_cpu_allocated{0};
std::atomic<size_t> g_cpu_peak{0};
constexpr size_t kCpuAlignment = 64;
}  // namespace

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  if (device.is_cuda()) {
    data_ = cuda::allocate(nbytes, device.index);
    release_ = [index = device.index](void* p) { cuda::deallocate(p, index); };
    return;
  }
  const size_t rounded = (nbytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
  data_ = std::aligned_alloc(kCpuAlignment, rounded == 0 ? kCpuAlignment : rounded);
  if (data_ == nullptr) LOOM_FAIL("out of CPU memory allocating ", nbytes, " bytes");
  size_t now = g_cpu_allocated.fetch_add(nbytes) + nbytes;
  size_t peak = g_cpu_peak.load();
  while (now > peak && !g_cpu_peak.compare_exchange_weak(peak, now)) {
  }
  release_ = [nbytes](void* p) {
    std::free(p);
    g_cpu_allocated.fetch_sub(nbytes);
  };
}

Storage::Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> release)
    : data_(data), nbytes_(nbytes), device_(device), release_(std::move(release)) {}

Storage::~Storage() {
  if (release_ && data_ != nullptr) release_(data_);
}

size_t cpu_bytes_allocated() { return g_cpu_allocated.load(); }
size_t cpu_bytes_peak() { return g_cpu_peak.load(); }

}  // namespace loom
