// The caching allocator's bookkeeping (see caching_allocator.h). Plain C++:
// compiled in every build so that its tests run without a GPU.
#include <loom/core/cuda/caching_allocator.h>
#include <loom/core/environment.h>

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <functional>

#include <loom/core/error.h>

namespace loom::cuda {

// One range of a segment: free (in its pool), live, or freed but waiting for
// events on other streams. The blocks of a segment form a list in address order.
struct CachingAllocator::Block {
  char* ptr = nullptr;
  size_t size = 0;       // rounded
  size_t requested = 0;  // while live
  StreamHandle stream = nullptr;
  bool small = false;      // belongs to the small pool
  bool allocated = false;  // live or pending; false only while in a pool
  int pending_events = 0;
  Block* prev = nullptr;
  Block* next = nullptr;
  std::vector<StreamHandle> other_streams;  // from record_stream
};

bool CachingAllocator::BlockOrder::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) return std::less<StreamHandle>()(a->stream, b->stream);
  if (a->size != b->size) return a->size < b->size;
  return std::less<char*>()(a->ptr, b->ptr);
}

namespace {
std::string bytes_text(size_t bytes) {
  char text[32];
  if (bytes >= (size_t{1} << 30)) {
    std::snprintf(text, sizeof(text), "%.2f GiB", static_cast<double>(bytes) / (1 << 30));
  } else if (bytes >= (size_t{1} << 20)) {
    std::snprintf(text, sizeof(text), "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
  } else {
    std::snprintf(text, sizeof(text), "%zu bytes", bytes);
  }
  return text;
}
}  // namespace

CachingAllocator::CachingAllocator(int device, std::unique_ptr<AllocatorBackend> backend, Caching caching)
    : device_(device), backend_(std::move(backend)), caching_(caching) {}

CachingAllocator::Caching CachingAllocator::caching_from_environment() {
  return environment_choice("LOOM_CUDA_NO_CACHING",
                            {{"0", "the default: the caching allocator"},
                             {"1", "no caching allocator, every tensor its own cudaMalloc"}}) == 1
             ? Caching::off
             : Caching::on;
}

CachingAllocator::~CachingAllocator() {
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    process_pending(true);
    release_cached_segments();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom: CUDA allocator of device %d could not release its cache: %s\n", device_, e.what());
  }
}

size_t CachingAllocator::round_size(size_t nbytes) {
  if (nbytes < kRounding) return kRounding;
  return (nbytes + kRounding - 1) / kRounding * kRounding;
}

size_t CachingAllocator::segment_size(size_t size) {
  if (size <= kSmallRequest) return kSmallSegment;
  if (size < kMediumRequest) return kLargeSegment;
  return (size + kLargeRounding - 1) / kLargeRounding * kLargeRounding;
}

CachingAllocator::Block* CachingAllocator::find_free_block(Pool& pool, size_t size, StreamHandle stream) {
  Block key;
  key.stream = stream;
  key.size = size;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  Block* block = *it;
  pool.erase(it);
  return block;
}

CachingAllocator::Block* CachingAllocator::new_segment(size_t size, StreamHandle stream) {
  const size_t bytes = caching_ == Caching::on ? segment_size(size) : size;
  void* ptr = backend_->allocate(bytes);
  if (ptr == nullptr) {
    // Memory may be held by frees waiting on other streams and by cached
    // segments nobody uses: give both back and try once more.
    ++stats_.oom_retries;
    process_pending(true);
    release_cached_segments();
    ptr = backend_->allocate(bytes);
  }
  if (ptr == nullptr) {
    ++stats_.ooms;
    const std::string device_memory = backend_->describe_device_memory();
    LOOM_FAIL("CUDA out of memory on cuda:", device_, ": tried to allocate ", bytes_text(size), " (", size,
              " bytes); loom tensors hold ", bytes_text(stats_.allocated_bytes), ", loom's caching allocator reserves ",
              bytes_text(stats_.reserved_bytes), " (", bytes_text(stats_.reserved_bytes - stats_.allocated_bytes),
              " of it cached)", device_memory.empty() ? "" : "; ", device_memory,
              ". Free tensors that are no longer needed or use a smaller batch");
  }
  ++stats_.device_allocs;
  ++stats_.segments;
  stats_.reserved_bytes += bytes;
  Block* block = new Block;
  block->ptr = static_cast<char*>(ptr);
  block->size = bytes;
  block->stream = stream;
  block->small = size <= kSmallRequest;
  return block;
}

void CachingAllocator::split(Block* block, size_t size, Pool& pool) {
  const size_t remaining = block->size - size;
  const bool worth_it = block->small ? remaining >= kRounding : remaining > kSmallRequest;
  if (!worth_it) return;
  Block* rest = new Block;
  rest->ptr = block->ptr + size;
  rest->size = remaining;
  rest->stream = block->stream;
  rest->small = block->small;
  rest->prev = block;
  rest->next = block->next;
  if (block->next != nullptr) block->next->prev = rest;
  block->next = rest;
  block->size = size;
  pool.insert(rest);
}

void* CachingAllocator::allocate(size_t nbytes, StreamHandle stream) {
  if (nbytes == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  process_pending(false);
  // Without caching, the request's exact size in a segment of its own: nothing to find or split.
  const size_t size = caching_ == Caching::on ? round_size(nbytes) : nbytes;
  Pool& pool = pool_for(size);
  Block* block = caching_ == Caching::on ? find_free_block(pool, size, stream) : nullptr;
  if (block != nullptr) {
    ++stats_.cache_hits;
  } else {
    block = new_segment(size, stream);
  }
  split(block, size, block->small ? small_pool_ : large_pool_);
  block->allocated = true;
  block->requested = nbytes;
  live_.emplace(block->ptr, block);
  stats_.allocated_bytes += block->size;
  stats_.requested_bytes += nbytes;
  ++stats_.allocations;
  update_peaks();
  return block->ptr;
}

void CachingAllocator::free(void* ptr) noexcept {
  if (ptr == nullptr) return;
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(ptr);
    if (it == live_.end()) {
      std::fprintf(stderr, "loom: CUDA allocator of device %d asked to free %p, which it did not allocate\n", device_,
                   ptr);
      return;
    }
    Block* block = it->second;
    live_.erase(it);
    stats_.allocated_bytes -= block->size;
    stats_.requested_bytes -= block->requested;
    --stats_.allocations;
    block->requested = 0;
    if (block->other_streams.empty()) {
      release_block(block);
      return;
    }
    // Other streams may still be using the memory: reuse it only once the work
    // they have queued so far is done.
    for (StreamHandle stream : block->other_streams) {
      pending_.push_back({block, backend_->record_event(stream)});
      ++block->pending_events;
    }
    block->other_streams.clear();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom: CUDA allocator of device %d could not free %p: %s\n", device_, ptr, e.what());
  }
}

void CachingAllocator::record_stream(void* ptr, StreamHandle stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  LOOM_CHECK(it != live_.end(), "record_stream: pointer ", ptr, " is not a live allocation of cuda:", device_);
  Block* block = it->second;
  if (stream == block->stream) return;
  auto& streams = block->other_streams;
  if (std::find(streams.begin(), streams.end(), stream) == streams.end()) streams.push_back(stream);
}

namespace {
// Merges `second`, the block right after `first` in their segment, into
// `first` and deletes it; returns `first`.
template <class Block>
Block* merge_blocks(Block* first, Block* second) {
  first->size += second->size;
  first->next = second->next;
  if (second->next != nullptr) second->next->prev = first;
  delete second;
  return first;
}
}  // namespace

void CachingAllocator::release_block(Block* block) {
  block->allocated = false;
  Pool& pool = block->small ? small_pool_ : large_pool_;
  if (caching_ == Caching::off) {
    pool.insert(block);  // a whole segment, released at once
    release_cached_segments();
    return;
  }
  if (Block* prev = block->prev; prev != nullptr && !prev->allocated) {
    pool.erase(prev);
    block = merge_blocks(prev, block);
  }
  if (Block* next = block->next; next != nullptr && !next->allocated) {
    pool.erase(next);
    merge_blocks(block, next);
  }
  pool.insert(block);
}

void CachingAllocator::process_pending(bool wait) {
  if (pending_.empty()) return;
  std::vector<PendingFree> still_pending;
  for (const PendingFree& p : pending_) {
    if (wait) backend_->synchronize_event(p.event);
    if (!wait && !backend_->event_completed(p.event)) {
      still_pending.push_back(p);
      continue;
    }
    backend_->destroy_event(p.event);
    if (--p.block->pending_events == 0) release_block(p.block);
  }
  pending_ = std::move(still_pending);
}

void CachingAllocator::release_cached_segments() {
  for (Pool* pool : {&small_pool_, &large_pool_}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* block = *it;
      if (block->prev != nullptr || block->next != nullptr) {
        ++it;
        continue;
      }
      backend_->free(block->ptr);
      stats_.reserved_bytes -= block->size;
      --stats_.segments;
      ++stats_.device_frees;
      it = pool->erase(it);
      delete block;
    }
  }
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  process_pending(true);
  release_cached_segments();
}

void CachingAllocator::update_peaks() {
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

size_t CachingAllocator::block_size(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(const_cast<void*>(ptr));
  return it == live_.end() ? 0 : it->second->size;
}

}  // namespace loom::cuda
