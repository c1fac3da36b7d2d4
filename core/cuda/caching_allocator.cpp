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
  uint64_t pool = 0;       // the private pool of its segment, 0 for the general pools
  bool small = false;      // belongs to the small pool
  bool allocated = false;  // live or pending; false only while in a pool
  int pending_events = 0;
  Block* prev = nullptr;
  Block* next = nullptr;
  std::vector<StreamHandle> other_streams;  // from record_stream
};

bool CachingAllocator::BlockOrder::operator()(const Block* a, const Block* b) const {
  if (a->pool != b->pool) return a->pool < b->pool;
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
  return environment_switch("LOOM_CUDA_NO_CACHING", {"0", "the default: the caching allocator"}, Caching::on,
                            {"1", "no caching allocator, every tensor its own cudaMalloc"}, Caching::off);
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

CachingAllocator::Block* CachingAllocator::find_free_block(Pool& pool, size_t size, StreamHandle stream,
                                                           uint64_t private_pool) {
  Block key;
  key.pool = private_pool;
  key.stream = stream;
  key.size = size;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->pool != private_pool || (*it)->stream != stream) return nullptr;
  Block* block = *it;
  pool.erase(it);
  return block;
}

CachingAllocator::Block* CachingAllocator::new_segment(size_t size, StreamHandle stream, uint64_t private_pool) {
  const size_t bytes = caching_ == Caching::on ? segment_size(size) : size;
  void* ptr = backend_->allocate(bytes);
  // (During a capture nothing may wait for the device: no retry then.)
  if (ptr == nullptr && capturing_.empty()) {
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
  block->pool = private_pool;
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
  rest->pool = block->pool;
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
  if (capturing_.empty()) process_pending(false);  // no event queries during a capture
  const auto captured = capturing_.find(stream);
  const uint64_t private_pool = captured == capturing_.end() ? 0 : captured->second;
  // Without caching, the request's exact size in a segment of its own: nothing to find or split.
  const size_t size = caching_ == Caching::on ? round_size(nbytes) : nbytes;
  Pool& pool = pool_for(size);
  Block* block = caching_ == Caching::on ? find_free_block(pool, size, stream, private_pool) : nullptr;
  if (block != nullptr) {
    ++stats_.cache_hits;
  } else {
    block = new_segment(size, stream, private_pool);
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
    if (!capturing_.empty()) {
      deferred_.push_back(block);  // its events once the capture ended
      return;
    }
    record_free_events(block);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom: CUDA allocator of device %d could not free %p: %s\n", device_, ptr, e.what());
  }
}

void CachingAllocator::record_free_events(Block* block) {
  // Other streams may still be using the memory: reuse it only once the work
  // they have queued so far is done.
  for (StreamHandle stream : block->other_streams) {
    pending_.push_back({block, backend_->record_event(stream)});
    ++block->pending_events;
  }
  block->other_streams.clear();
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
      // Split segments are in use; a private pool's belong to its graph.
      if (block->prev != nullptr || block->next != nullptr || block->pool != 0) {
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

void CachingAllocator::begin_private_pool(uint64_t id, StreamHandle stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  LOOM_CHECK(id != 0, "CUDA allocator: private pool 0 is the general pool");
  LOOM_CHECK(caching_ == Caching::on, "CUDA graphs need the caching allocator; unset LOOM_CUDA_NO_CACHING");
  LOOM_CHECK(!released_pools_.contains(id), "CUDA allocator: private pool ", id, " was released");
  LOOM_CHECK(!capturing_.contains(stream), "CUDA allocator: the stream already allocates from private pool ",
             capturing_.at(stream));
  capturing_.emplace(stream, id);
}

void CachingAllocator::end_private_pool(StreamHandle stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  LOOM_CHECK(capturing_.erase(stream) == 1, "CUDA allocator: end_private_pool on a stream that began none");
  if (!capturing_.empty()) return;
  for (Block* block : deferred_) record_free_events(block);
  deferred_.clear();
}

void CachingAllocator::release_private_pool(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (id == 0 || !released_pools_.insert(id).second) return;
  for (const auto& [stream, pool] : capturing_) {
    LOOM_CHECK(pool != id, "CUDA allocator: private pool ", id, " released while a capture allocates from it");
  }
  for (Pool* pool : {&small_pool_, &large_pool_}) {
    std::vector<Block*> moved;
    for (auto it = pool->begin(); it != pool->end();) {
      if ((*it)->pool == id) {
        moved.push_back(*it);
        it = pool->erase(it);
      } else {
        ++it;
      }
    }
    for (Block* block : moved) {
      block->pool = 0;
      pool->insert(block);
    }
  }
  for (auto& [ptr, block] : live_) {
    if (block->pool == id) block->pool = 0;
  }
  for (const PendingFree& p : pending_) {
    if (p.block->pool == id) p.block->pool = 0;
  }
}

size_t CachingAllocator::private_pool_bytes(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (id == 0) return 0;
  size_t bytes = 0;
  for (const Pool* pool : {&small_pool_, &large_pool_}) {
    for (const Block* block : *pool) {
      if (block->pool == id) bytes += block->size;
    }
  }
  for (const auto& [ptr, block] : live_) {
    if (block->pool == id) bytes += block->size;
  }
  std::set<const Block*> waiting;  // a block waits for one event per stream that used it
  for (const PendingFree& p : pending_) {
    if (p.block->pool == id && waiting.insert(p.block).second) bytes += p.block->size;
  }
  return bytes;
}

size_t CachingAllocator::block_size(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(const_cast<void*>(ptr));
  return it == live_.end() ? 0 : it->second->size;
}

}  // namespace loom::cuda
