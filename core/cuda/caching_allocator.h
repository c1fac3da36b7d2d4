// The caching device-memory allocator: one per device, in front of cudaMalloc.
//
// Requests are rounded to 512 bytes and served from free blocks of the
// requesting stream's pool (best fit); a block larger than needed is split and
// the rest stays free. Requests up to 1 MiB come from 2 MiB segments (the small
// pool), larger ones from segments of their own (20 MiB for requests under
// 10 MiB, else the request rounded to 2 MiB). A freed block returns to its
// stream's pool at once: later work on that stream is ordered after the work
// that used it. A block also used on other streams (record_stream) returns
// only after events recorded on those streams at free time have completed.
// When the device is out of memory, the allocator waits for those events,
// releases every cached segment that is wholly free, and retries once before
// throwing an error that reports the request and its counters.
//
// Private pools are for CUDA graphs (cuda::Graph): between
// begin_private_pool(id, stream) and end_private_pool(stream), requests on
// `stream` are served from segments of pool `id` only, and the blocks of
// those segments, freed during the capture or after it, return to pool `id`:
// no other work reuses the memory a graph's replays write. Pending frees are
// not processed while a pool is being captured (an event query is not
// allowed then), and a block used on other streams (a collective's buffer on
// the NCCL stream, which joined the capture) that is freed during a capture
// records its events only once no capture runs: recorded on a capturing
// stream, they would be nodes of the graph that nothing could query.
// release_private_pool(id), once the graph is gone, hands the pool's
// segments back to the general pools.
//
// The bookkeeping is plain C++; the device calls go through an
// AllocatorBackend, so tests can drive it without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <loom/core/cuda/runtime.h>

namespace loom::cuda {

// What the allocator needs from a device. Implementations may throw
// loom::Error for failures other than running out of memory.
class AllocatorBackend {
 public:
  virtual ~AllocatorBackend() = default;
  // nullptr when the device has no memory left for `nbytes`.
  virtual void* allocate(size_t nbytes) = 0;
  virtual void free(void* ptr) = 0;
  // An event recorded now on `stream`; opaque to the allocator.
  virtual void* record_event(StreamHandle stream) = 0;
  virtual bool event_completed(void* event) = 0;
  virtual void synchronize_event(void* event) = 0;
  virtual void destroy_event(void* event) = 0;
  // Free and total device memory for error messages ("" when unknown).
  virtual std::string describe_device_memory() = 0;
};

class CachingAllocator {
 public:
  static constexpr size_t kRounding = 512;              // every size is a multiple of this
  static constexpr size_t kSmallRequest = 1 << 20;      // up to this: small pool
  static constexpr size_t kSmallSegment = 2 << 20;
  static constexpr size_t kLargeSegment = 20 << 20;     // for large requests under kMediumRequest
  static constexpr size_t kMediumRequest = 10 << 20;
  static constexpr size_t kLargeRounding = 2 << 20;     // segments of larger requests

  // Caching::off gives every request a device allocation of exactly its size
  // and every free back to the device (once the streams that use it are done),
  // as PyTorch's PYTORCH_NO_CUDA_MEMORY_CACHING=1 does: slow, but it lets
  // compute-sanitizer's memcheck see each tensor's bounds (LOOM_CUDA_NO_CACHING=1).
  enum class Caching { on, off };

  CachingAllocator(int device, std::unique_ptr<AllocatorBackend> backend, Caching caching = Caching::on);
  // LOOM_CUDA_NO_CACHING: unset, empty or 0 is Caching::on, 1 Caching::off;
  // anything else is an error that names the variable.
  static Caching caching_from_environment();
  // Returns every segment to the backend. Live allocations must be gone.
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // `nbytes` of device memory for work on `stream`; nullptr for 0 bytes.
  // Throws loom::Error when the device is out of memory even after the cache
  // was released.
  void* allocate(size_t nbytes, StreamHandle stream);
  // Gives back memory from allocate(). Never throws: errors go to stderr.
  void free(void* ptr) noexcept;
  // Marks that work on `stream` (not the allocating one) uses `ptr`, so that
  // free() waits for that work before the memory is reused.
  void record_stream(void* ptr, StreamHandle stream);
  // Releases cached segments that are wholly free (after waiting for pending frees).
  void empty_cache();

  // Serves the requests on `stream` from private pool `id` (non-zero) until
  // end_private_pool(stream): a graph's capture. A pool may be captured
  // into again (graphs that share memory) until released. Throws if
  // `stream` is already routed to a pool or `id` was released.
  void begin_private_pool(uint64_t id, StreamHandle stream);
  void end_private_pool(StreamHandle stream);
  // The pool's free blocks join the general pools (wholly free segments stay
  // cached); its live blocks do when freed. After the graph that used it is
  // destroyed.
  void release_private_pool(uint64_t id);
  // Bytes reserved by private pool `id`'s segments (0 for an unknown pool):
  // for tests and memory reports.
  size_t private_pool_bytes(uint64_t id) const;

  MemoryStats stats() const;
  void reset_peak();
  int device() const { return device_; }
  // The rounded size of the block behind `ptr` (0 if unknown): for tests.
  size_t block_size(const void* ptr) const;

  static size_t round_size(size_t nbytes);

 private:
  struct Block;
  struct BlockOrder {
    bool operator()(const Block* a, const Block* b) const;
  };
  using Pool = std::set<Block*, BlockOrder>;

  Pool& pool_for(size_t size) { return size <= kSmallRequest ? small_pool_ : large_pool_; }
  static size_t segment_size(size_t size);
  Block* find_free_block(Pool& pool, size_t size, StreamHandle stream, uint64_t private_pool);
  Block* new_segment(size_t size, StreamHandle stream, uint64_t private_pool);
  void split(Block* block, size_t size, Pool& pool);
  void release_block(Block* block);  // back to its pool, merged with free neighbours
  void record_free_events(Block* block);  // on the block's other streams; released once they completed
  void process_pending(bool wait);
  void release_cached_segments();
  void update_peaks();

  const int device_;
  std::unique_ptr<AllocatorBackend> backend_;
  const Caching caching_;
  mutable std::mutex mutex_;
  Pool small_pool_, large_pool_;
  std::unordered_map<void*, Block*> live_;
  struct PendingFree {
    Block* block;
    void* event;
  };
  std::vector<PendingFree> pending_;  // in free order
  std::vector<Block*> deferred_;      // freed during a capture, used on other streams: events once it ends
  std::unordered_map<StreamHandle, uint64_t> capturing_;  // stream -> private pool it allocates from
  std::set<uint64_t> released_pools_;
  MemoryStats stats_;
};

}  // namespace loom::cuda
