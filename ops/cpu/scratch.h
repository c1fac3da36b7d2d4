// Per-thread scratch buffers of the CPU kernels that keep their capacity
// between calls: column matrices and transformed tiles are megabytes, and a
// fresh allocation of that size is a fresh mmap and a page fault per 4 KiB on
// every call. Each Owner (a tag type of the calling file) has its own slots,
// so one kernel's buffers are never another's.
#pragma once

#include <cstdint>
#include <vector>

namespace loom::ops::cpu {

template <class Owner, class T = float, int Slots = 8>
T* thread_scratch(int slot, int64_t elements) {
  thread_local std::vector<T> buffers[Slots];
  std::vector<T>& buffer = buffers[slot];
  if (static_cast<int64_t>(buffer.size()) < elements) buffer.resize(static_cast<size_t>(elements));
  return buffer.data();
}

}  // namespace loom::ops::cpu
