// ProcessGroupShm: see process_group_shm.h for the protocol. The segment is
// a header, one RankState per rank (its barrier count, pid and the signatures
// of its last two collectives), then two buffers of `size` slots of
// `chunk_bytes` each.
#include <loom/dist/process_group_shm.h>

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <type_traits>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <loom/core/autograd.h>
#include <loom/core/error.h>
#include <loom/core/storage.h>
#include <loom/dist/shm_internal.h>

namespace loom::dist {

namespace {

using detail::summarize;
using namespace shm;

constexpr uint64_t kMagic = 0x316d68736d6f6f6cULL;  // "loomshm1"
constexpr size_t kDefaultChunkBytes = size_t{1} << 20;
constexpr size_t kMaxDefaultSegmentData = size_t{32} << 20;
// A waiting rank spins this many pause instructions (about 0.1 ms), then
// yields its core until kYieldFor has passed, then sleeps on the futex in
// slices of kSleepSlice, checking the deadline and whether the ranks it waits
// for still live.
constexpr int kSpinPauses = 4000;
constexpr auto kYieldFor = std::chrono::milliseconds(2);
constexpr auto kSleepSlice = std::chrono::milliseconds(50);

static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free &&
                  std::atomic<int32_t>::is_always_lock_free,
              "shared-memory barriers need lock-free atomics");

enum class Kind : uint32_t { all_reduce, broadcast, all_gather, reduce_scatter, barrier, new_buffer };
const char* kind_name(uint32_t kind) {
  static const char* names[] = {"all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier", "new_buffer"};
  return kind < 6 ? names[kind] : "?";
}

// What a rank's collective was, compared across ranks at its first barrier.
struct Signature {
  uint64_t sequence = UINT64_MAX;  // UINT64_MAX: none yet
  uint32_t kind = 0;
  int32_t root = -1;  // broadcast root, reduce op for reductions, -1 otherwise
  uint64_t bytes = 0;
  int32_t dtype = -1;
  int64_t buffer = -1;  // all_reduce in place in new_buffer memory: which buffer, at which byte
  uint64_t offset = 0;
  bool operator==(const Signature&) const = default;
};

struct alignas(64) RankState {
  std::atomic<uint64_t> arrived{0};  // barriers this rank has reached
  std::atomic<int32_t> pid{0};
  Signature signature[2];  // of its collectives with an even / odd sequence number
};

struct alignas(64) Header {
  uint64_t magic = 0;
  uint64_t token = 0;  // random; a rank that maps some other segment by the same name notices
  uint32_t world = 0;
  uint64_t chunk_bytes = 0;
  uint64_t data_offset = 0;
  uint64_t total_bytes = 0;
  alignas(64) std::atomic<uint32_t> wake{0};  // bumped at every arrival; sleepers wait on it
  std::atomic<uint32_t> sleepers{0};
  alignas(64) std::atomic<int32_t> failed_rank{-1};  // the first rank whose collective failed
  char failure[512] = {};                            // its message, written before failed_rank
};

size_t round_up(size_t value, size_t multiple) { return (value + multiple - 1) / multiple * multiple; }

void check_cpu_tensor(const char* collective, const Tensor& tensor, const std::string& role) {
  detail::check_cpu_tensor("shm", collective, tensor, role);
}

int32_t dtype_code(const Tensor& tensor) { return static_cast<int32_t>(tensor.dtype()); }

// Where an all_reduce's tensor lies in new_buffer memory: each rank's mapping
// of that buffer, and the byte offset in it.
struct InBuffer {
  int64_t id = -1;
  std::vector<std::byte*> ranks;
  size_t offset = 0;
};

// The buffers new_buffer handed out and are still alive. A buffer's own
// mapping belongs to its tensor's storage; the peers' mappings are unmapped
// when that storage dies, or with the group.
struct BufferRegistry {
  struct Buffer {
    int64_t id;
    size_t bytes;
    std::vector<std::byte*> ranks;  // every rank's buffer as mapped here; [rank] is this rank's own
    size_t mapped;
  };
  std::mutex mutex;
  std::vector<Buffer> buffers;
  int rank = 0;

  void unmap_peers(const Buffer& buffer) const {
    for (size_t r = 0; r < buffer.ranks.size(); ++r)
      if (static_cast<int>(r) != rank && buffer.ranks[r] != nullptr) ::munmap(buffer.ranks[r], buffer.mapped);
  }
  ~BufferRegistry() {
    for (const Buffer& buffer : buffers) unmap_peers(buffer);
  }
};

}  // namespace

struct ProcessGroupShm::Impl {
  int rank;
  int size;
  // Kept for the group's life: when rank 0's is a TCPStore, it is the server
  // the other ranks may still be reading the set-up verdicts from.
  std::shared_ptr<Store> store;
  std::atomic<Milliseconds> timeout;
  std::string name;  // of the segment, for errors
  int segment_fd = -1;  // rank 0, until every rank has mapped the segment
  std::byte* base = nullptr;
  size_t mapped_bytes = 0;
  Header* header = nullptr;
  RankState* states = nullptr;
  std::byte* data = nullptr;
  size_t chunk = 0;
  std::vector<char> watchable;  // whether this rank can see rank r's process
  std::shared_ptr<BufferRegistry> buffers = std::make_shared<BufferRegistry>();
  int64_t next_buffer = 0;  // under `mutex`

  std::mutex mutex;          // one collective at a time; guards everything below
  uint64_t epoch = 0;        // barriers passed
  uint64_t rounds = 0;       // data rounds run (picks the buffer)
  uint64_t sequence = 0;     // collectives called
  bool check_pending = false;  // compare signatures at the next barrier
  Signature current{};
  std::string first_failure;

  Impl(int rank_, int size_, Milliseconds timeout_) : rank(rank_), size(size_), timeout(timeout_) {}
  ~Impl() {
    if (base != nullptr) ::munmap(base, mapped_bytes);
  }

  std::string prefix() const { return str("ProcessGroupShm rank ", rank, " of ", size, ": "); }

  std::byte* slot(uint64_t round, int r) const {
    return data + ((round & 1) * static_cast<size_t>(size) + static_cast<size_t>(r)) * chunk;
  }

  // ---- barriers ----

  // The first rank that has not reached barrier `target`, or -1.
  int missing(uint64_t target, int from = 0) const {
    for (int r = from; r < size; ++r)
      if (states[r].arrived.load(std::memory_order_acquire) < target) return r;
    return -1;
  }

  void check_abort() const {
    int failed = header->failed_rank.load(std::memory_order_acquire);
    if (failed >= 0 && failed != rank) {
      throw Error(str("rank ", failed, " failed first: ", std::string(header->failure, strnlen(header->failure,
                                                                                                 sizeof(header->failure)))));
    }
  }

  std::string describe_rank(int r) const {
    const RankState& state = states[r];
    const Signature* last = nullptr;
    for (const Signature& s : state.signature)
      if (s.sequence != UINT64_MAX && (last == nullptr || s.sequence > last->sequence)) last = &s;
    std::string where = last ? str("its last collective was ", kind_name(last->kind), " #", last->sequence)
                             : std::string("it has called no collective");
    return str("peer rank ", r, " (pid ", state.pid.load(), ")", watchable[r] ? " is alive but" : "",
               " has not reached it; ", where);
  }

  void arrive_and_wait() {
    const uint64_t target = ++epoch;
    states[rank].arrived.store(target, std::memory_order_seq_cst);
    header->wake.fetch_add(1, std::memory_order_seq_cst);
    if (header->sleepers.load(std::memory_order_seq_cst) > 0) futex_wake_all(&header->wake);
    wait_for_all(target);
    if (check_pending) {
      check_pending = false;
      check_signatures();
    }
  }

  void wait_for_all(uint64_t target) {
    int first = missing(target);
    if (first < 0) return;
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    for (int i = 0;; ++i) {
      if ((first = missing(target, first)) < 0) return;
      check_abort();
      if (i < kSpinPauses) {
        cpu_relax();
        continue;
      }
      if (Clock::now() - start >= kYieldFor) break;
      ::sched_yield();
    }
    const auto deadline = start + timeout.load();
    while (true) {
      uint32_t seen = header->wake.load(std::memory_order_seq_cst);
      header->sleepers.fetch_add(1, std::memory_order_seq_cst);
      first = missing(target, first);
      if (first >= 0 && header->failed_rank.load() < 0) {
        auto left = deadline - Clock::now();
        if (left > std::chrono::nanoseconds(0)) {
          futex_wait(&header->wake, seen,
                     std::min<std::chrono::nanoseconds>(left, std::chrono::nanoseconds(kSleepSlice)));
        }
      }
      header->sleepers.fetch_sub(1, std::memory_order_seq_cst);
      if ((first = missing(target, first)) < 0) return;
      check_abort();
      for (int r = first; r < size; ++r) {
        if (states[r].arrived.load(std::memory_order_acquire) >= target || !watchable[r]) continue;
        if (!process_alive(states[r].pid.load())) {
          throw Error(str("peer rank ", r, " (pid ", states[r].pid.load(), ") has exited before reaching it"));
        }
      }
      if (Clock::now() >= deadline) throw Error(describe_rank(first));
    }
  }

  void check_signatures() {
    const size_t parity = current.sequence & 1;
    for (int r = 0; r < size; ++r) {
      const Signature& theirs = states[r].signature[parity];
      if (theirs == current) continue;
      auto describe = [](const Signature& s) {
        std::string text = str(kind_name(s.kind), " #", s.sequence, " of ", s.bytes, " bytes");
        if (s.dtype >= 0) text += str(" of ", dtype_name(static_cast<DType>(s.dtype)));
        if (s.buffer >= 0) text += str(" in shared buffer ", s.buffer, " at byte ", s.offset);
        return text;
      };
      throw Error(str("the ranks called different collectives: this rank called ", describe(current), ", rank ", r,
                      " called ", describe(theirs), " (every rank must issue the same collectives, in the same order, "
                      "with the same sizes)"));
    }
  }

  // ---- running a collective ----

  // `dtype`: the first tensor's, or -1; `root`: broadcast's root, the reduce op, or -1.
  WorkHandle run(Kind kind, const std::string& details, int32_t dtype, uint64_t bytes, int root,
                 const std::function<void()>& body, const InBuffer* in_buffer = nullptr) {
    std::lock_guard lock(mutex);
    const char* name = kind_name(static_cast<uint32_t>(kind));
    auto work = std::make_shared<Work>(str(name, " #", sequence, " (", details, ")"));
    work->mark_started();
    current = Signature{.sequence = sequence,
                        .kind = static_cast<uint32_t>(kind),
                        .root = root,
                        .bytes = bytes,
                        .dtype = dtype,
                        .buffer = in_buffer ? in_buffer->id : -1,
                        .offset = in_buffer ? in_buffer->offset : 0};
    ++sequence;
    if (!first_failure.empty()) {
      work->finish(std::make_exception_ptr(Error(str(prefix(), work->description(),
                                                     " was not run because an earlier collective failed: ",
                                                     first_failure))));
      return work;
    }
    states[rank].signature[current.sequence & 1] = current;
    check_pending = true;
    const auto start = Work::Clock::now();
    try {
      NoGradGuard no_grad;
      body();
      check_pending = false;
      work->finish();
    } catch (const std::exception& error) {
      check_pending = false;
      double seconds = std::chrono::duration<double>(Work::Clock::now() - start).count();
      double timeout_s = static_cast<double>(timeout.load().count()) / 1000.0;
      std::string message = str(prefix(), work->description(), " failed after ", std::round(seconds * 100) / 100,
                                " s (timeout ", timeout_s, " s): ", error.what(),
                                ". This process group is unusable from now on.");
      first_failure = message;
      publish_failure(message);
      work->finish(std::make_exception_ptr(Error(message)));
    }
    return work;
  }

  // Tells the other ranks to stop waiting for this one.
  void publish_failure(const std::string& message) {
    int expected = -1;
    if (header->failed_rank.load() >= 0) return;
    size_t n = std::min(message.size(), sizeof(header->failure) - 1);
    // Racing failures may interleave their text; the rank number stays the first one's.
    std::memcpy(header->failure, message.data(), n);
    header->failure[n] = '\0';
    header->failed_rank.compare_exchange_strong(expected, rank);
    header->wake.fetch_add(1);
    futex_wake_all(&header->wake);
  }

  // ---- collectives (under `mutex`) ----

  // `numel` elements at the same place in every rank's new_buffer memory: rank
  // p reduces the p-th share straight from every rank's buffer and writes the
  // result into all of them, a block at a time while it is in cache.
  void all_reduce_in_buffer(const InBuffer& where, int64_t numel, DType dtype, ReduceOp op) {
    const size_t element = element_size(dtype);
    const size_t count = static_cast<size_t>(numel);
    const size_t block = std::max<size_t>(1, (64 << 10) / element);
    std::vector<const std::byte*> sources(static_cast<size_t>(size));
    arrive_and_wait();  // every rank's data is in place
    const size_t begin = count * rank / size, end = count * (rank + 1) / size;
    for (size_t b = begin; b < end; b += block) {
      const size_t n = std::min(block, end - b);
      const size_t at = where.offset + b * element;
      for (int r = 0; r < size; ++r) sources[r] = where.ranks[r] + at;
      std::byte* mine = where.ranks[rank] + at;
      reduce_bytes(dtype, mine, sources, n, op, size);
      for (int r = 0; r < size; ++r)
        if (r != rank) std::memcpy(where.ranks[r] + at, mine, n * element);
    }
    arrive_and_wait();  // every share is in every buffer
  }

  // Where `tensor` lies in new_buffer memory, if it does.
  std::optional<InBuffer> locate(const Tensor& tensor) const {
    const auto* data = static_cast<const std::byte*>(tensor.raw_data());
    std::lock_guard lock(buffers->mutex);
    for (const auto& buffer : buffers->buffers) {
      const std::byte* mine = buffer.ranks[rank];
      if (data >= mine && data + tensor.nbytes() <= mine + buffer.bytes)
        return InBuffer{buffer.id, buffer.ranks, static_cast<size_t>(data - mine)};
    }
    return std::nullopt;
  }

  // Creates this rank's segment of `bytes`, maps every rank's; returns this
  // rank's buffer as a tensor that unmaps them when it dies.
  Tensor new_buffer(int64_t numel, DType dtype) {
    const size_t bytes = static_cast<size_t>(numel) * element_size(dtype);
    const size_t mapped = round_up(std::max<size_t>(bytes, 1), 4096);
    Tensor result;
    WorkHandle work = run(Kind::new_buffer, str(dtype_name(dtype), "[", numel, "]"), static_cast<int32_t>(dtype), bytes,
                          -1, [&] {
      arrive_and_wait();  // every rank asks for the same buffer (the signatures match)
      const int64_t id = next_buffer++;
      BufferRegistry::Buffer buffer{id, bytes, std::vector<std::byte*>(static_cast<size_t>(size), nullptr), mapped};
      const std::string own = str("/loom-", ::getpid(), "-", random_hex(), "-b", id);
      struct Cleanup {  // what was mapped (on failure), and this rank's descriptor
        BufferRegistry::Buffer* buffer;
        int fd = -1;
        ~Cleanup() {
          if (fd >= 0) ::close(fd);
          if (buffer == nullptr) return;
          for (std::byte* base : buffer->ranks)
            if (base != nullptr) ::munmap(base, buffer->mapped);
        }
      } cleanup{&buffer};
      const std::string key = str("shm/buffer/", id, "/");
      std::string why;
      cleanup.fd = create_unlinked(own, mapped, why);
      if (cleanup.fd >= 0) {
        void* address = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, cleanup.fd, 0);
        if (address == MAP_FAILED) {
          why = str("cannot map /dev/shm", own, ": ", errno_text());
        } else {
          buffer.ranks[rank] = static_cast<std::byte*>(address);
        }
      }
      store->set(key + std::to_string(rank), why.empty() ? published_file(own, cleanup.fd) : "error " + why);
      if (!why.empty()) throw Error(why);
      for (int r = 0; r < size; ++r) {
        if (r == rank) continue;
        std::string published = store->get_string(key + std::to_string(r), timeout.load());
        if (published.rfind("error ", 0) == 0)
          throw Error(str("rank ", r, " could not create its buffer: ", published.substr(6)));
        std::string open_failure;
        int peer = open_published(published, open_failure);
        if (peer < 0) throw Error(str("cannot open rank ", r, "'s buffer: ", open_failure));
        void* address = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, peer, 0);
        ::close(peer);
        if (address == MAP_FAILED) throw Error(str("cannot map rank ", r, "'s buffer: ", errno_text()));
        buffer.ranks[r] = static_cast<std::byte*>(address);
      }
      arrive_and_wait();  // every rank has mapped every buffer: the descriptors can go
      cleanup.buffer = nullptr;

      std::byte* mine = buffer.ranks[rank];
      {
        std::lock_guard lock(buffers->mutex);
        buffers->rank = rank;
        buffers->buffers.push_back(buffer);
      }
      std::weak_ptr<BufferRegistry> registry = buffers;
      auto impl = std::make_shared<TensorImpl>();
      impl->storage = std::make_shared<Storage>(mine, bytes, Device::cpu(), [registry, mine, mapped](void*) {
        if (auto alive = registry.lock()) {
          std::lock_guard lock(alive->mutex);
          auto& all = alive->buffers;
          auto it = std::find_if(all.begin(), all.end(), [&](const auto& b) { return b.ranks[alive->rank] == mine; });
          if (it != all.end()) {
            alive->unmap_peers(*it);
            all.erase(it);
          }
        }
        ::munmap(mine, mapped);
      });
      impl->sizes = {numel};
      impl->strides = contiguous_strides(impl->sizes);
      impl->dtype = dtype;
      result = Tensor(std::move(impl));
    });
    work->wait();
    return result;
  }

  // Reduces `spans` (elements of `dtype`) across ranks in place.
  void all_reduce(const Spans& spans, DType dtype, ReduceOp op) {
    const size_t element = element_size(dtype);
    const size_t count = total_bytes(spans) / element;
    const size_t per_round = chunk / element;
    std::vector<const std::byte*> sources(static_cast<size_t>(size));
    for (size_t offset = 0; offset < count; offset += per_round) {
      const size_t m = std::min(per_round, count - offset);
      const uint64_t round = rounds++;
      copy_from_spans(spans, offset * element, m * element, slot(round, rank));
      arrive_and_wait();
      const size_t begin = m * rank / size, end = m * (rank + 1) / size;
      if (end > begin) {
        for (int r = 0; r < size; ++r) sources[r] = slot(round, r) + begin * element;
        reduce_bytes(dtype, slot(round, rank) + begin * element, sources, end - begin, op, size);
      }
      arrive_and_wait();
      for (int r = 0; r < size; ++r) {
        const size_t b = m * r / size, e = m * (r + 1) / size;
        if (e > b) copy_to_spans(slot(round, r) + b * element, spans, (offset + b) * element, (e - b) * element);
      }
    }
  }

  void broadcast(const Spans& spans, int root) {
    const size_t bytes = total_bytes(spans);
    for (size_t offset = 0; offset < bytes; offset += chunk) {
      const size_t n = std::min(chunk, bytes - offset);
      const uint64_t round = rounds++;
      if (rank == root) copy_from_spans(spans, offset, n, slot(round, root));
      arrive_and_wait();
      if (rank != root) copy_to_spans(slot(round, root), spans, offset, n);
    }
  }

  // outputs[r] receives rank r's input; every stream as long as the input.
  void all_gather(const Spans& input, const std::vector<Spans>& outputs) {
    const size_t bytes = total_bytes(input);
    for (size_t offset = 0; offset < bytes; offset += chunk) {
      const size_t n = std::min(chunk, bytes - offset);
      const uint64_t round = rounds++;
      copy_from_spans(input, offset, n, slot(round, rank));
      arrive_and_wait();
      for (int r = 0; r < size; ++r) copy_to_spans(slot(round, r), outputs[r], offset, n);
    }
  }

  // output = op over ranks of inputs[rank()]; every stream as long as the output.
  void reduce_scatter(const std::vector<Spans>& inputs, const Spans& output, DType dtype, ReduceOp op) {
    const size_t element = element_size(dtype);
    const size_t count = total_bytes(output) / element;
    const size_t per_round = std::max<size_t>(1, chunk / element / static_cast<size_t>(size));
    std::vector<const std::byte*> sources(static_cast<size_t>(size));
    std::vector<std::byte> result(std::min(per_round, count) * element);
    for (size_t offset = 0; offset < count; offset += per_round) {
      const size_t m = std::min(per_round, count - offset);
      const uint64_t round = rounds++;
      for (int r = 0; r < size; ++r)
        copy_from_spans(inputs[r], offset * element, m * element, slot(round, rank) + r * m * element);
      arrive_and_wait();
      for (int r = 0; r < size; ++r) sources[r] = slot(round, r) + rank * m * element;
      reduce_bytes(dtype, result.data(), sources, m, op, size);
      copy_to_spans(result.data(), output, offset * element, m * element);
    }
  }
};

namespace {

// Creates (rank 0) or opens the segment and maps it; returns "" or why not.
std::string map_segment(ProcessGroupShm::Impl& impl, Store& store, int rank, int size, size_t chunk,
                        Milliseconds timeout) {
  const size_t header_bytes = round_up(sizeof(Header) + sizeof(RankState) * static_cast<size_t>(size), 4096);
  const size_t total = header_bytes + 2 * static_cast<size_t>(size) * chunk;
  auto map = [&](int fd) -> std::string {
    void* address = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (address == MAP_FAILED) return str("cannot map ", total, " bytes of /dev/shm", impl.name, ": ", errno_text());
    impl.base = static_cast<std::byte*>(address);
    impl.mapped_bytes = total;
    return "";
  };
  if (rank == 0) {
    impl.name = str("/loom-", ::getpid(), "-", random_hex());
    std::string why;
    impl.segment_fd = create_unlinked(impl.name, total, why);  // closed once every rank has mapped it
    if (impl.segment_fd >= 0) why = map(impl.segment_fd);
    if (!why.empty()) {
      store.set("shm/segment", "error " + why);
      return str("rank 0: ", why);
    }
    auto* header = new (impl.base) Header();
    header->token = std::random_device{}();
    header->world = static_cast<uint32_t>(size);
    header->chunk_bytes = chunk;
    header->data_offset = header_bytes;
    header->total_bytes = total;
    for (int r = 0; r < size; ++r) new (impl.base + sizeof(Header) + sizeof(RankState) * r) RankState();
    std::atomic_thread_fence(std::memory_order_release);
    header->magic = kMagic;
    store.set("shm/segment", str(header->token, " ", published_file(impl.name, impl.segment_fd)));
  } else {
    std::string text = store.get_string("shm/segment", timeout);
    if (text.rfind("error ", 0) == 0) return str("rank 0 could not create the segment: ", text.substr(6));
    std::istringstream fields(text);
    uint64_t token = 0;
    std::string published;
    fields >> token >> impl.name;
    std::getline(fields, published);
    published = impl.name + published;
    std::string why;
    int fd = open_published(published, why);
    if (fd < 0) return str("cannot open rank 0's segment: ", why);
    struct stat info {};
    if (::fstat(fd, &info) != 0 || static_cast<size_t>(info.st_size) != total) {
      why = str("/dev/shm", impl.name, " has ", info.st_size, " bytes, expected ", total);
    } else {
      why = map(fd);
    }
    ::close(fd);
    if (!why.empty()) return why;
    auto* header = reinterpret_cast<Header*>(impl.base);
    if (header->magic != kMagic || header->token != token || header->world != static_cast<uint32_t>(size) ||
        header->chunk_bytes != chunk) {
      return str("/dev/shm", impl.name, " is not rank 0's segment for this group (another host's segment by the same "
                 "name, or ranks with different chunk sizes)");
    }
  }
  impl.header = reinterpret_cast<Header*>(impl.base);
  impl.states = reinterpret_cast<RankState*>(impl.base + sizeof(Header));
  impl.data = impl.base + header_bytes;
  impl.chunk = chunk;
  impl.states[rank].pid.store(static_cast<int32_t>(::getpid()), std::memory_order_release);
  return "";
}

size_t default_chunk_bytes(int size) {
  size_t chunk = kDefaultChunkBytes;
  while (chunk > 65536 && 2 * static_cast<size_t>(size) * chunk > kMaxDefaultSegmentData) chunk /= 2;
  return chunk;
}

}  // namespace

std::shared_ptr<ProcessGroupShm> ProcessGroupShm::try_create(std::shared_ptr<Store> store, int rank, int size,
                                                             ShmOptions options, std::string* why_not) {
  LOOM_CHECK(store != nullptr, "ProcessGroupShm: the rendezvous store is null");
  LOOM_CHECK(size >= 1 && rank >= 0 && rank < size, "ProcessGroupShm: rank ", rank, " of ", size, " is not valid");
  LOOM_CHECK(options.timeout().count() > 0, "ProcessGroupShm: timeout must be positive, got ",
             options.timeout().count(),
             " ms");
  const size_t chunk = options.chunk_bytes() ? options.chunk_bytes() : default_chunk_bytes(size);
  LOOM_CHECK(chunk % 64 == 0 && chunk >= 8 * static_cast<size_t>(size), "ProcessGroupShm: chunk_bytes ", chunk,
             " must be a multiple of 64 and at least 8 x the world size (", 8 * size, ")");

  auto impl = std::make_unique<Impl>(rank, size, options.timeout());
  impl->store = store;
  // Once every rank has mapped the segment or given up (or this rank stops
  // waiting), rank 0 closes its descriptor (the segment's name went when it
  // was created): the memory is freed when the last rank unmaps it, however
  // the ranks end.
  struct CloseSegment {
    ProcessGroupShm::Impl& impl;
    ~CloseSegment() {
      if (impl.segment_fd >= 0) ::close(impl.segment_fd);
      impl.segment_fd = -1;
    }
  };
  std::string first_problem;
  {
    CloseSegment close_segment{*impl};
    std::string why = map_segment(*impl, *store, rank, size, chunk, options.timeout());
    store->set(str("shm/status/", rank), why.empty() ? "ok" : why);
    for (int r = 0; r < size; ++r) {
      std::string status =
          r == rank ? (why.empty() ? "ok" : why) : store->get_string(str("shm/status/", r), options.timeout());
      if (status != "ok" && first_problem.empty()) first_problem = str("rank ", r, ": ", status);
    }
  }
  if (!first_problem.empty()) {
    std::string message = str("ProcessGroupShm: not every rank can map one shared-memory segment; ", first_problem);
    if (why_not == nullptr) throw Error(message + ". Use the gloo backend for ranks on several hosts");
    *why_not = message;
    return nullptr;
  }
  impl->watchable.assign(static_cast<size_t>(size), 0);
  for (int r = 0; r < size; ++r) {
    int pid = impl->states[r].pid.load(std::memory_order_acquire);
    impl->watchable[r] = r != rank && pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM);
  }
  return std::shared_ptr<ProcessGroupShm>(new ProcessGroupShm(std::move(impl), rank, size));
}

ProcessGroupShm::ProcessGroupShm(std::unique_ptr<Impl> impl, int rank, int size)
    : ProcessGroup(rank, size), impl_(std::move(impl)) {}

ProcessGroupShm::ProcessGroupShm(std::shared_ptr<Store> store, int rank, int size, ShmOptions options)
    : ProcessGroup(rank, size) {
  impl_ = std::move(try_create(std::move(store), rank, size, options, nullptr)->impl_);
}

ProcessGroupShm::~ProcessGroupShm() = default;

void ProcessGroupShm::set_timeout(Milliseconds timeout) {
  LOOM_CHECK(timeout.count() > 0, "ProcessGroupShm: timeout must be positive, got ", timeout.count(), " ms");
  impl_->timeout = timeout;
}

Milliseconds ProcessGroupShm::timeout() const { return impl_->timeout.load(); }

size_t ProcessGroupShm::chunk_bytes() const { return impl_->chunk; }

WorkHandle ProcessGroupShm::all_reduce(const std::vector<Tensor>& tensors, ReduceOp op) {
  detail::check_all_reduce(tensors, op, check_cpu_tensor);
  if (tensors.size() == 1 && tensors[0].is_contiguous() && tensors[0].numel() > 0) {
    if (std::optional<InBuffer> where = impl_->locate(tensors[0])) {
      const Tensor& tensor = tensors[0];
      return impl_->run(
          Kind::all_reduce, str(summarize(tensors), ", ", reduce_op_name(op), ", in shared buffer ", where->id),
          dtype_code(tensor), tensor.nbytes(), static_cast<int>(op),
          [&] { impl_->all_reduce_in_buffer(*where, tensor.numel(), tensor.dtype(), op); }, &*where);
    }
  }
  uint64_t bytes = 0;
  for (const auto& t : tensors) bytes += t.nbytes();
  return impl_->run(Kind::all_reduce, str(summarize(tensors), ", ", reduce_op_name(op)), dtype_code(tensors[0]), bytes,
                    static_cast<int>(op), [&] {
                      // Tensors of one dtype are reduced as one stream, in the order given.
                      for (const std::vector<Tensor>& group : detail::by_dtype(tensors)) {
                        std::vector<Staged> staged;
                        Spans spans;
                        for (const auto& t : group) {
                          staged.emplace_back(t, true);
                          spans.push_back({staged.back().data(), staged.back().bytes()});
                        }
                        impl_->all_reduce(spans, group[0].dtype(), op);
                        for (const auto& s : staged) s.finish();
                      }
                    });
}

WorkHandle ProcessGroupShm::broadcast(const Tensor& tensor, int root) {
  detail::check_broadcast(tensor, root, size(), check_cpu_tensor);
  return impl_->run(Kind::broadcast, str(summarize({tensor}), ", root ", root), dtype_code(tensor), tensor.nbytes(), root,
                    [&] {
                      Staged staged(tensor, rank() == root);
                      impl_->broadcast({{staged.data(), staged.bytes()}}, root);
                      if (rank() != root) staged.finish();
                    });
}

WorkHandle ProcessGroupShm::all_gather_into(const Tensor& output, const Tensor& input) {
  detail::check_all_gather_into(output, input, size(), check_cpu_tensor);
  return impl_->run(Kind::all_gather, summarize({input}), dtype_code(input), input.nbytes(), -1, [&] {
    Staged source(input, true), target(output, false);
    std::vector<Spans> outputs;
    for (int r = 0; r < size(); ++r) outputs.push_back({{target.data() + r * source.bytes(), source.bytes()}});
    impl_->all_gather({{source.data(), source.bytes()}}, outputs);
    target.finish();
  });
}

WorkHandle ProcessGroupShm::all_gather(const std::vector<Tensor>& outputs, const Tensor& input) {
  detail::check_all_gather(outputs, input, size(), check_cpu_tensor);
  return impl_->run(Kind::all_gather, summarize({input}), dtype_code(input), input.nbytes(), -1, [&] {
    Staged source(input, true);
    std::vector<Staged> targets;
    std::vector<Spans> spans;
    for (const auto& output : outputs) {
      targets.emplace_back(output, false);
      spans.push_back({{targets.back().data(), targets.back().bytes()}});
    }
    impl_->all_gather({{source.data(), source.bytes()}}, spans);
    for (const auto& t : targets) t.finish();
  });
}

WorkHandle ProcessGroupShm::reduce_scatter_from(const Tensor& output, const Tensor& input, ReduceOp op) {
  detail::check_reduce_scatter_from(output, input, op, size(), check_cpu_tensor);
  return impl_->run(Kind::reduce_scatter, str(summarize({input}), ", ", reduce_op_name(op)), dtype_code(input),
                    input.nbytes(), static_cast<int>(op), [&] {
                      Staged source(input, true), target(output, false);
                      std::vector<Spans> inputs;
                      for (int r = 0; r < size(); ++r)
                        inputs.push_back({{source.data() + r * target.bytes(), target.bytes()}});
                      impl_->reduce_scatter(inputs, {{target.data(), target.bytes()}}, output.dtype(), op);
                      target.finish();
                    });
}

WorkHandle ProcessGroupShm::reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op) {
  detail::check_reduce_scatter(output, inputs, op, size(), check_cpu_tensor);
  return impl_->run(Kind::reduce_scatter, str(summarize(inputs), ", ", reduce_op_name(op)), dtype_code(output),
                    output.nbytes() * static_cast<uint64_t>(size()), static_cast<int>(op), [&] {
                      std::vector<Staged> sources;
                      std::vector<Spans> spans;
                      for (const auto& input : inputs) {
                        sources.emplace_back(input, true);
                        spans.push_back({{sources.back().data(), sources.back().bytes()}});
                      }
                      Staged target(output, false);
                      impl_->reduce_scatter(spans, {{target.data(), target.bytes()}}, output.dtype(), op);
                      target.finish();
                    });
}

Tensor ProcessGroupShm::new_buffer(int64_t numel, DType dtype, Device device) {
  LOOM_CHECK(numel >= 0, "new_buffer: numel must not be negative, got ", numel);
  if (size() == 1 || !device.is_cpu()) return ProcessGroup::new_buffer(numel, dtype, device);
  return impl_->new_buffer(numel, dtype);
}

WorkHandle ProcessGroupShm::barrier() {
  return impl_->run(Kind::barrier, str(size(), " ranks"), -1, 0, -1, [&] { impl_->arrive_and_wait(); });
}

}  // namespace loom::dist
