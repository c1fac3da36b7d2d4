#include <loom/core/storage.h>

#include <loom/core/cpu_allocator.h>
#include <loom/core/cuda/runtime.h>
#include <loom/core/error.h>

namespace loom {

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device), owns_memory_(true) {
  if (device.is_cuda()) {
    data_ = cuda::allocate(nbytes, device.index);
    release_ = [index = device.index](void* p) { cuda::deallocate(p, index); };
    return;
  }
  const cpu_allocator::Block block = cpu_allocator::allocate(nbytes);
  data_ = block.data;
  release_ = [capacity = block.capacity](void* p) { cpu_allocator::deallocate({p, capacity}); };
}

Storage::Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> release)
    : data_(data), nbytes_(nbytes), device_(device), release_(std::move(release)) {}

Storage::~Storage() {
  if (release_ && data_ != nullptr) release_(data_);
}

size_t cpu_bytes_allocated() { return cpu_allocator::stats().allocated; }
size_t cpu_bytes_peak() { return cpu_allocator::stats().peak; }

}  // namespace loom
