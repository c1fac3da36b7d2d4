// Storage: one owned allocation (CPU, 64-byte aligned, or CUDA) shared by all
// views of it.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include <loom/core/device.h>

namespace loom {

class Storage {
 public:
  // Allocates nbytes on the device. CPU memory is 64-byte aligned and
  // uninitialised; CUDA memory comes from the caching allocator.
  Storage(size_t nbytes, Device device);
  // Wraps memory owned elsewhere; `release` frees it when the storage dies.
  Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> release);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  // True when this storage allocated its memory (the first constructor): no
  // one outside loom can see it.
  bool owns_memory() const { return owns_memory_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  std::function<void(void*)> release_;
  bool owns_memory_ = false;
};

// Bytes of CPU tensor storage currently allocated and the peak since start.
size_t cpu_bytes_allocated();
size_t cpu_bytes_peak();

}  // namespace loom
