// CPU memory for tensor storage: 64-byte aligned, with large blocks cached
// after they are freed. A training step frees and re-allocates the same
// activation sizes every iteration; without the cache each of them would be a
// fresh mmap whose pages fault in and are zeroed by the kernel again.
#pragma once

#include <cstddef>

namespace loom::cpu_allocator {

struct Block {
  void* data = nullptr;
  size_t capacity = 0;  // bytes actually reserved (>= the request)
};

// Never returns null; throws loom::Error when memory is exhausted.
Block allocate(size_t nbytes);
void deallocate(const Block& block);

struct Stats {
  size_t allocated = 0;  // bytes handed out and not yet returned
  size_t peak = 0;       // the largest `allocated` seen
  size_t cached = 0;     // bytes freed and kept for reuse
};
Stats stats();
// Returns every cached block to the system.
void empty_cache();

}  // namespace loom::cpu_allocator
