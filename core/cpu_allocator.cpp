#include <loom/core/cpu_allocator.h>

#include <cstdlib>
#include <map>
#include <mutex>

#include <loom/core/error.h>

namespace loom::cpu_allocator {
namespace {

constexpr size_t kAlignment = 64;
// Blocks below this come straight from malloc, which caches small sizes itself.
constexpr size_t kCachedMinimum = size_t{64} << 10;
constexpr size_t kPage = size_t{4} << 10;
// Freed blocks beyond this total go back to the system.
constexpr size_t kCacheLimit = size_t{2} << 30;

struct State {
  std::mutex mutex;
  std::multimap<size_t, void*> free_blocks;  // capacity -> block
  Stats stats;
};

State& state() {
  static State* s = new State();  // never destroyed: tensors may outlive static destruction
  return *s;
}

void* system_allocate(size_t bytes) {
  void* p = std::aligned_alloc(kAlignment, bytes);
  if (p == nullptr) {
    empty_cache();
    p = std::aligned_alloc(kAlignment, bytes);
  }
  if (p == nullptr) LOOM_FAIL("out of CPU memory allocating ", bytes, " bytes");
  return p;
}

}  // namespace

Block allocate(size_t nbytes) {
  State& s = state();
  Block block;
  if (nbytes < kCachedMinimum) {
    block.capacity = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
    if (block.capacity == 0) block.capacity = kAlignment;
    block.data = system_allocate(block.capacity);
  } else {
    const size_t wanted = (nbytes + kPage - 1) / kPage * kPage;
    {
      // Best fit among cached blocks, wasting at most a quarter.
      std::lock_guard<std::mutex> lock(s.mutex);
      auto it = s.free_blocks.lower_bound(wanted);
      if (it != s.free_blocks.end() && it->first <= wanted + wanted / 4) {
        block = {it->second, it->first};
        s.stats.cached -= it->first;
        s.free_blocks.erase(it);
      }
    }
    if (block.data == nullptr) block = {system_allocate(wanted), wanted};
  }
  std::lock_guard<std::mutex> lock(s.mutex);
  s.stats.allocated += block.capacity;
  if (s.stats.allocated > s.stats.peak) s.stats.peak = s.stats.allocated;
  return block;
}

void deallocate(const Block& block) {
  if (block.data == nullptr) return;
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.stats.allocated -= block.capacity;
    if (block.capacity >= kCachedMinimum && s.stats.cached + block.capacity <= kCacheLimit) {
      s.free_blocks.emplace(block.capacity, block.data);
      s.stats.cached += block.capacity;
      return;
    }
  }
  std::free(block.data);
}

Stats stats() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.stats;
}

void empty_cache() {
  State& s = state();
  std::multimap<size_t, void*> blocks;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    blocks.swap(s.free_blocks);
    s.stats.cached = 0;
  }
  for (auto& [size, p] : blocks) std::free(p);
}

}  // namespace loom::cpu_allocator
