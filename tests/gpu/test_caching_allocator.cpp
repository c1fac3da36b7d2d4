// The caching allocator's bookkeeping, driven through a fake device (no GPU):
// rounding, pools and segments, splitting and merging, per-stream reuse,
// frees deferred by record_stream, release-and-retry on out-of-memory, the
// error message, the counters, and the allocator without caching
// (LOOM_CUDA_NO_CACHING, for compute-sanitizer's memcheck); private pools
// for CUDA graphs.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <loom/core/cuda/caching_allocator.h>
#include <loom/core/error.h>
#include "tests/gpu/compare.h"

using namespace loom;
using namespace loom::cuda;
using loom::gpu_testing::check_mentions;
using loom::gpu_testing::error_message;

namespace {

// A device of `capacity` bytes that hands out fake, never-reused addresses,
// and events the test completes by hand.
class FakeDevice final : public AllocatorBackend {
 public:
  explicit FakeDevice(size_t capacity) : capacity_(capacity) {}

  void* allocate(size_t nbytes) override {
    ++allocate_calls;
    if (used_ + nbytes > capacity_) return nullptr;
    used_ += nbytes;
    void* ptr = reinterpret_cast<void*>(next_);
    next_ += nbytes + 4096;
    sizes_.push_back({ptr, nbytes});
    return ptr;
  }
  void free(void* ptr) override {
    for (auto it = sizes_.begin(); it != sizes_.end(); ++it) {
      if (it->first == ptr) {
        used_ -= it->second;
        sizes_.erase(it);
        ++free_calls;
        return;
      }
    }
    FAIL("freed a pointer the fake device never handed out");
  }
  void* record_event(StreamHandle stream) override {
    events_.push_back(std::make_unique<Event>(Event{stream, false}));
    return events_.back().get();
  }
  bool event_completed(void* event) override { return static_cast<Event*>(event)->done; }
  void synchronize_event(void* event) override { static_cast<Event*>(event)->done = true; }
  void destroy_event(void* event) override { ++destroyed_events; }
  std::string describe_device_memory() override { return "the fake device has " + std::to_string(capacity_ - used_) + " bytes free"; }

  void complete_events() {
    for (auto& e : events_) e->done = true;
  }
  size_t used() const { return used_; }
  size_t recorded_events() const { return events_.size(); }

  int allocate_calls = 0, free_calls = 0, destroyed_events = 0;

 private:
  struct Event {
    StreamHandle stream;
    bool done;
  };
  size_t capacity_;
  size_t used_ = 0;
  uintptr_t next_ = 0x100000000;
  std::vector<std::pair<void*, size_t>> sizes_;
  std::vector<std::unique_ptr<Event>> events_;
};

StreamHandle fake_stream(uintptr_t id) { return reinterpret_cast<StreamHandle>(id); }

constexpr size_t MiB = size_t{1} << 20;

struct Fixture {
  explicit Fixture(size_t capacity = 1024 * MiB) {
    auto owned = std::make_unique<FakeDevice>(capacity);
    device = owned.get();
    allocator = std::make_unique<CachingAllocator>(0, std::move(owned));
  }
  FakeDevice* device;
  std::unique_ptr<CachingAllocator> allocator;
};

}  // namespace

TEST_CASE("sizes round to 512 bytes and small requests share 2 MiB segments") {
  Fixture f;
  CHECK(CachingAllocator::round_size(1) == 512);
  CHECK(CachingAllocator::round_size(512) == 512);
  CHECK(CachingAllocator::round_size(513) == 1024);
  void* a = f.allocator->allocate(1000, nullptr);
  void* b = f.allocator->allocate(3000, nullptr);
  CHECK(f.allocator->block_size(a) == 1024);
  CHECK(f.allocator->block_size(b) == 3072);
  CHECK(static_cast<char*>(b) == static_cast<char*>(a) + 1024);  // split from the same segment
  MemoryStats s = f.allocator->stats();
  CHECK(s.device_allocs == 1);
  CHECK(s.reserved_bytes == 2 * MiB);
  CHECK(s.allocated_bytes == 1024 + 3072);
  CHECK(s.requested_bytes == 4000);
  CHECK(s.allocations == 2);
  CHECK(f.allocator->allocate(0, nullptr) == nullptr);
  f.allocator->free(a);
  f.allocator->free(b);
  CHECK(f.allocator->stats().allocated_bytes == 0);
}

TEST_CASE("a freed block is reused by the next request of its stream, without a device allocation") {
  Fixture f;
  void* a = f.allocator->allocate(5 * MiB, nullptr);
  f.allocator->free(a);
  void* b = f.allocator->allocate(5 * MiB - 100, nullptr);
  CHECK(b == a);
  MemoryStats s = f.allocator->stats();
  CHECK(s.device_allocs == 1);
  CHECK(s.cache_hits == 1);
  f.allocator->free(b);
}

TEST_CASE("large requests: 20 MiB segments under 10 MiB, split and merged back") {
  Fixture f;
  void* a = f.allocator->allocate(3 * MiB, nullptr);
  void* b = f.allocator->allocate(3 * MiB, nullptr);
  CHECK(f.allocator->stats().reserved_bytes == 20 * MiB);
  CHECK(static_cast<char*>(b) == static_cast<char*>(a) + 3 * MiB);
  void* big = f.allocator->allocate(33 * MiB, nullptr);  // its own segment, rounded to 2 MiB
  CHECK(f.allocator->stats().reserved_bytes == (20 + 34) * MiB);
  f.allocator->free(a);
  f.allocator->free(b);
  f.allocator->free(big);
  // Everything merged back into whole segments, which empty_cache returns.
  f.allocator->empty_cache();
  MemoryStats s = f.allocator->stats();
  CHECK(s.reserved_bytes == 0);
  CHECK(s.segments == 0);
  CHECK(s.device_frees == 2);
  CHECK(f.device->used() == 0);
}

TEST_CASE("a remainder of at most 1 MiB is not split off a large block") {
  Fixture f;
  void* a = f.allocator->allocate(19 * MiB + 512, nullptr);  // leaves 512 KiB of the 20 MiB segment
  CHECK(f.allocator->block_size(a) == 20 * MiB);
  CHECK(f.allocator->stats().allocated_bytes == 20 * MiB);
  f.allocator->free(a);
}

TEST_CASE("blocks are not shared between streams") {
  Fixture f;
  void* a = f.allocator->allocate(4096, fake_stream(1));
  f.allocator->free(a);
  void* b = f.allocator->allocate(4096, fake_stream(2));
  CHECK(b != a);
  CHECK(f.allocator->stats().device_allocs == 2);
  void* c = f.allocator->allocate(4096, fake_stream(1));
  CHECK(c == a);
  f.allocator->free(b);
  f.allocator->free(c);
}

TEST_CASE("record_stream: the memory is reused only after the other stream's work completes") {
  Fixture f;
  void* a = f.allocator->allocate(8192, fake_stream(1));
  f.allocator->record_stream(a, fake_stream(2));
  f.allocator->record_stream(a, fake_stream(1));  // the allocating stream: nothing to wait for
  f.allocator->free(a);
  CHECK(f.allocator->stats().allocated_bytes == 0);  // freed, from the user's view
  void* b = f.allocator->allocate(8192, fake_stream(1));
  CHECK(b != a);  // still in use by stream 2's queued work
  f.device->complete_events();
  f.allocator->free(b);
  void* c = f.allocator->allocate(8192, fake_stream(1));
  CHECK((c == a || c == b));
  CHECK(f.device->destroyed_events == 1);
  f.allocator->free(c);
  CHECK_THROWS_AS(f.allocator->record_stream(reinterpret_cast<void*>(0x42), fake_stream(2)), Error);
}

TEST_CASE("out of memory: cached segments are released and the request retried") {
  Fixture f(64 * MiB);
  void* a = f.allocator->allocate(30 * MiB, nullptr);
  void* b = f.allocator->allocate(30 * MiB, nullptr);
  f.allocator->free(a);
  f.allocator->free(b);  // 60 MiB cached in two segments of 30 MiB
  void* c = f.allocator->allocate(50 * MiB, nullptr);
  CHECK(c != nullptr);
  MemoryStats s = f.allocator->stats();
  CHECK(s.oom_retries == 1);
  CHECK(s.reserved_bytes == 50 * MiB);
  CHECK(s.device_frees == 2);
  f.allocator->free(c);
}

TEST_CASE("out of memory: pending cross-stream frees are waited for before the retry") {
  Fixture f(64 * MiB);
  void* a = f.allocator->allocate(40 * MiB, fake_stream(1));
  f.allocator->record_stream(a, fake_stream(2));
  f.allocator->free(a);  // pending on stream 2
  void* b = f.allocator->allocate(40 * MiB, fake_stream(1));
  CHECK(b != nullptr);
  CHECK(f.allocator->stats().oom_retries == 1);
  f.allocator->free(b);
}

TEST_CASE("out of memory after the retry: an error with the request and the counters") {
  Fixture f(64 * MiB);
  void* a = f.allocator->allocate(30 * MiB, nullptr);
  check_mentions(error_message([&] { f.allocator->allocate(size_t{80} << 30, nullptr); }),
                 {"CUDA out of memory on cuda:0", "tried to allocate 80.00 GiB", "loom tensors hold 30.00 MiB",
                  "reserves 30.00 MiB", "the fake device has"});
  CHECK(f.allocator->stats().ooms == 1);
  // The allocator still works afterwards.
  void* b = f.allocator->allocate(1 * MiB, nullptr);
  CHECK(b != nullptr);
  f.allocator->free(a);
  f.allocator->free(b);
}

TEST_CASE("peaks follow the high-water marks and reset to the current values") {
  Fixture f;
  void* a = f.allocator->allocate(4 * MiB, nullptr);
  void* b = f.allocator->allocate(4 * MiB, nullptr);
  f.allocator->free(a);
  MemoryStats s = f.allocator->stats();
  CHECK(s.peak_allocated_bytes == 8 * MiB);
  CHECK(s.allocated_bytes == 4 * MiB);
  CHECK(s.peak_reserved_bytes == 20 * MiB);
  f.allocator->reset_peak();
  CHECK(f.allocator->stats().peak_allocated_bytes == 4 * MiB);
  f.allocator->free(b);
  f.allocator->free(reinterpret_cast<void*>(0x42));  // unknown: reported on stderr, no throw
  f.allocator->free(nullptr);
}

TEST_CASE("many mixed allocations and frees leave no leak") {
  Fixture f;
  std::vector<void*> live;
  uint64_t state = 12345;
  for (int i = 0; i < 2000; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const size_t size = 1 + (state >> 33) % (3 * MiB);
    const bool release = !live.empty() && ((state >> 20) & 1);
    if (release) {
      const size_t k = (state >> 40) % live.size();
      f.allocator->free(live[k]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    } else {
      void* p = f.allocator->allocate(size, fake_stream(1 + (state >> 50) % 2));
      // The new block must not overlap a live one.
      const char* begin = static_cast<char*>(p);
      const char* end = begin + f.allocator->block_size(p);
      for (void* q : live) {
        const char* other = static_cast<char*>(q);
        REQUIRE((end <= other || other + f.allocator->block_size(q) <= begin));
      }
      live.push_back(p);
    }
  }
  for (void* p : live) f.allocator->free(p);
  MemoryStats s = f.allocator->stats();
  CHECK(s.allocated_bytes == 0);
  CHECK(s.allocations == 0);
  f.allocator->empty_cache();
  CHECK(f.allocator->stats().reserved_bytes == 0);
  CHECK(f.device->used() == 0);
}

TEST_CASE("without caching, each request is a device allocation of its exact size, freed at once") {
  auto owned = std::make_unique<FakeDevice>(1024 * MiB);
  FakeDevice* device = owned.get();
  CachingAllocator allocator(0, std::move(owned), CachingAllocator::Caching::off);
  void* a = allocator.allocate(1000, nullptr);
  void* b = allocator.allocate(3000, nullptr);
  CHECK(device->allocate_calls == 2);
  CHECK(device->used() == 4000);  // not rounded to 512 bytes, not in a 2 MiB segment
  CHECK(allocator.block_size(a) == 1000);
  CHECK(static_cast<char*>(b) != static_cast<char*>(a) + 1000);
  allocator.free(a);
  CHECK(device->free_calls == 1);
  CHECK(device->used() == 3000);
  void* c = allocator.allocate(1000, nullptr);  // a new device allocation, not a cached block
  CHECK(device->allocate_calls == 3);
  CHECK(allocator.stats().cache_hits == 0);
  // Memory another stream uses goes back to the device once that stream's work is done.
  allocator.record_stream(b, fake_stream(2));
  allocator.free(b);
  CHECK(device->free_calls == 1);
  allocator.free(c);
  CHECK(device->free_calls == 2);
  device->complete_events();
  void* d = allocator.allocate(512, nullptr);  // the next request first gives back the completed frees
  CHECK(device->free_calls == 3);
  allocator.free(d);
  MemoryStats s = allocator.stats();
  CHECK(s.reserved_bytes == 0);
  CHECK(s.allocated_bytes == 0);
  CHECK(s.segments == 0);
  CHECK(device->used() == 0);
}

TEST_CASE("LOOM_CUDA_NO_CACHING: 1 turns caching off, 0 or unset leaves it on, anything else is an error") {
  const char* saved = std::getenv("LOOM_CUDA_NO_CACHING");
  const std::string previous = saved == nullptr ? "" : saved;
  ::unsetenv("LOOM_CUDA_NO_CACHING");
  CHECK(CachingAllocator::caching_from_environment() == CachingAllocator::Caching::on);
  ::setenv("LOOM_CUDA_NO_CACHING", "0", 1);
  CHECK(CachingAllocator::caching_from_environment() == CachingAllocator::Caching::on);
  ::setenv("LOOM_CUDA_NO_CACHING", "1", 1);
  CHECK(CachingAllocator::caching_from_environment() == CachingAllocator::Caching::off);
  ::setenv("LOOM_CUDA_NO_CACHING", "yes", 1);
  CHECK_THROWS_WITH_AS(CachingAllocator::caching_from_environment(), doctest::Contains("LOOM_CUDA_NO_CACHING"), Error);
  if (saved != nullptr) {
    ::setenv("LOOM_CUDA_NO_CACHING", previous.c_str(), 1);
  } else {
    ::unsetenv("LOOM_CUDA_NO_CACHING");
  }
}

TEST_CASE("a private pool (a CUDA graph's capture) keeps its memory from other work until released") {
  Fixture f;
  const StreamHandle captured = fake_stream(1), other = fake_stream(2);
  void* before = f.allocator->allocate(4000, captured);  // general pool, outside any capture
  f.allocator->free(before);
  f.allocator->begin_private_pool(7, captured);
  // The general pool's free block is not used by the capture: a segment of its own.
  void* a = f.allocator->allocate(4000, captured);
  CHECK(a != before);
  void* b = f.allocator->allocate(3 * MiB, captured);
  CHECK(f.allocator->private_pool_bytes(7) == 2 * MiB + 20 * MiB);
  // Freed during the capture, a block is reused within the same capture.
  f.allocator->free(a);
  void* a_again = f.allocator->allocate(4000, captured);
  CHECK(a_again == a);
  // Another stream, not captured, allocates from the general pools.
  void* elsewhere = f.allocator->allocate(4000, other);
  CHECK(f.allocator->private_pool_bytes(7) == 22 * MiB);
  f.allocator->end_private_pool(captured);
  // After the capture the pool's memory is the graph's: freed blocks go back
  // to it, not to the general pools, and empty_cache keeps its segments.
  f.allocator->free(a_again);
  f.allocator->free(b);
  void* later = f.allocator->allocate(4000, captured);
  CHECK(later != a);
  f.allocator->free(later);
  f.allocator->free(elsewhere);
  f.allocator->empty_cache();
  CHECK(f.allocator->stats().reserved_bytes == 22 * MiB);
  CHECK(f.allocator->private_pool_bytes(7) == 22 * MiB);
  // A second capture into the same pool (graphs that share memory) reuses it.
  f.allocator->begin_private_pool(7, captured);
  void* shared = f.allocator->allocate(3 * MiB, captured);
  CHECK(shared == b);
  f.allocator->free(shared);
  f.allocator->end_private_pool(captured);
  // Released (the graph destroyed), the pool's segments become ordinary cache.
  f.allocator->release_private_pool(7);
  CHECK(f.allocator->private_pool_bytes(7) == 0);
  void* reused = f.allocator->allocate(4000, captured);
  CHECK(reused == a);
  f.allocator->free(reused);
  f.allocator->empty_cache();
  CHECK(f.allocator->stats().reserved_bytes == 0);
  CHECK(f.device->used() == 0);
}

TEST_CASE("a block another stream used, freed during a capture, records its events only after the capture") {
  // A collective's buffer: allocated in the capture, used on the NCCL stream
  // (which joined the capture), freed before the capture ends. An event
  // recorded then would be a node of the graph, never completed on its own.
  Fixture f;
  const StreamHandle captured = fake_stream(1), nccl = fake_stream(2), elsewhere = fake_stream(3);
  f.allocator->begin_private_pool(4, captured);
  f.allocator->begin_private_pool(9, elsewhere);  // a second capture, on another thread
  void* staged = f.allocator->allocate(4000, captured);
  f.allocator->record_stream(staged, nccl);
  f.allocator->free(staged);
  CHECK(f.device->recorded_events() == 0);
  void* next = f.allocator->allocate(4000, captured);
  CHECK(next != staged);  // not reused inside the capture: the NCCL stream's captured work may still read it
  f.allocator->end_private_pool(captured);
  CHECK(f.device->recorded_events() == 0);  // another capture still runs
  f.allocator->end_private_pool(elsewhere);
  CHECK(f.device->recorded_events() == 1);  // on the NCCL stream, now that nothing captures
  f.allocator->free(next);
  f.allocator->begin_private_pool(4, captured);  // the graph captured again into its pool
  void* first = f.allocator->allocate(4000, captured);
  void* second = f.allocator->allocate(4000, captured);
  CHECK(first == next);
  CHECK(second != staged);  // waits for its event on the NCCL stream
  f.allocator->end_private_pool(captured);
  f.device->complete_events();
  f.allocator->free(first);
  f.allocator->free(second);
  f.allocator->release_private_pool(4);
  f.allocator->release_private_pool(9);
  f.allocator->empty_cache();
  CHECK(f.device->destroyed_events == 1);
  CHECK(f.allocator->stats().reserved_bytes == 0);
  CHECK(f.device->used() == 0);
}

TEST_CASE("a private pool's live blocks join the general pools when freed after the release") {
  Fixture f;
  const StreamHandle captured = fake_stream(1);
  f.allocator->begin_private_pool(3, captured);
  void* output = f.allocator->allocate(5 * MiB, captured);  // e.g. a graph's loss, kept after the capture
  f.allocator->end_private_pool(captured);
  f.allocator->release_private_pool(3);
  f.allocator->release_private_pool(3);  // twice: nothing more happens
  f.allocator->free(output);
  f.allocator->empty_cache();
  CHECK(f.allocator->stats().reserved_bytes == 0);
}

TEST_CASE("private pools refuse misuse, and a capture neither queries events nor retries out of memory") {
  SUBCASE("misuse") {
    Fixture f;
    const StreamHandle s = fake_stream(1);
    CHECK_THROWS_WITH_AS(f.allocator->begin_private_pool(0, s), doctest::Contains("general pool"), loom::Error);
    CHECK_THROWS_WITH_AS(f.allocator->end_private_pool(s), doctest::Contains("began none"), loom::Error);
    f.allocator->begin_private_pool(1, s);
    CHECK_THROWS_WITH_AS(f.allocator->begin_private_pool(2, s), doctest::Contains("already allocates from private pool 1"),
                         loom::Error);
    CHECK_THROWS_WITH_AS(f.allocator->release_private_pool(1), doctest::Contains("while a capture allocates"),
                         loom::Error);
    f.allocator->end_private_pool(s);
    f.allocator->release_private_pool(1);
    CHECK_THROWS_WITH_AS(f.allocator->begin_private_pool(1, s), doctest::Contains("was released"), loom::Error);
    auto owned = std::make_unique<FakeDevice>(64 * MiB);
    CachingAllocator uncached(0, std::move(owned), CachingAllocator::Caching::off);
    CHECK_THROWS_WITH_AS(uncached.begin_private_pool(1, s), doctest::Contains("LOOM_CUDA_NO_CACHING"), loom::Error);
  }
  SUBCASE("no waiting during a capture") {
    Fixture f(30 * MiB);
    const StreamHandle captured = fake_stream(1), other = fake_stream(2);
    void* shared = f.allocator->allocate(4000, other);
    f.allocator->record_stream(shared, captured);
    f.allocator->free(shared);  // pending on an event of `captured`
    void* cached = f.allocator->allocate(15 * MiB, other);
    f.allocator->free(cached);  // a wholly free 20 MiB segment, cached
    f.allocator->begin_private_pool(5, captured);
    // 2 + 16 MiB of the 30 are reserved; another 20 MiB would need the cache
    // released, which waits for the device: not during a capture.
    CHECK_THROWS_WITH_AS(f.allocator->allocate(3 * MiB, captured), doctest::Contains("out of memory"), loom::Error);
    CHECK(f.allocator->stats().oom_retries == 0);
    void* small = f.allocator->allocate(4000, captured);
    f.allocator->end_private_pool(captured);
    f.allocator->free(small);
    f.allocator->release_private_pool(5);
    f.device->complete_events();
    f.allocator->empty_cache();
    CHECK(f.allocator->stats().reserved_bytes == 0);
  }
}
