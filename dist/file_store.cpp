// FileStore: key-value records appended to one file under flock(2), so that
// processes sharing a filesystem can rendezvous without a network server.
//
// Record layout: u32 key length, key bytes, u32 value length, value bytes.
// A later record for a key replaces an earlier one. Writers append whole
// records under an exclusive lock; readers parse under a shared lock, so a
// reader never sees half a record.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <loom/core/error.h>
#include <loom/dist/store.h>

namespace loom::dist {

namespace {

// Counts the FileStore objects using the file; the last one to leave deletes it.
constexpr const char* kUsersKey = "__loom_file_store_users";

// Holds flock(2) on a descriptor for its lifetime.
class FileLock {
 public:
  FileLock(int fd, int operation, const std::string& path) : fd_(fd) {
    while (::flock(fd_, operation) != 0) {
      if (errno != EINTR) LOOM_FAIL("FileStore ", path, ": flock failed: ", std::strerror(errno));
    }
  }
  ~FileLock() { ::flock(fd_, LOCK_UN); }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_;
};

}  // namespace

struct FileStore::State {
  FileDescriptor file;
  std::mutex mutex;  // guards the cache and the read position
  std::unordered_map<std::string, Bytes> cache;
  off_t parsed_until = 0;
  std::string path;

  // Reads the records appended since the last call. Caller holds a file lock.
  void refresh() {
    struct stat info {};
    if (::fstat(file.get(), &info) != 0) LOOM_FAIL("FileStore ", path, ": fstat failed: ", std::strerror(errno));
    if (info.st_size <= parsed_until) return;
    Bytes buffer(static_cast<size_t>(info.st_size - parsed_until));
    size_t done = 0;
    while (done < buffer.size()) {
      ssize_t n = ::pread(file.get(), buffer.data() + done, buffer.size() - done, parsed_until + static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) LOOM_FAIL("FileStore ", path, ": read failed: ", n == 0 ? "file shrank" : std::strerror(errno));
      done += static_cast<size_t>(n);
    }
    size_t position = 0;
    auto read_field = [&](Bytes& out) {
      uint32_t length;
      if (buffer.size() - position < 4) return false;
      std::memcpy(&length, buffer.data() + position, 4);
      if (buffer.size() - position - 4 < length) return false;
      out.assign(buffer.begin() + static_cast<ptrdiff_t>(position + 4),
                 buffer.begin() + static_cast<ptrdiff_t>(position + 4 + length));
      position += 4 + length;
      return true;
    };
    while (position < buffer.size()) {
      size_t record_start = position;
      Bytes key, value;
      if (!read_field(key) || !read_field(value)) {
        LOOM_FAIL("FileStore ", path, ": truncated record at byte ", parsed_until + static_cast<off_t>(record_start),
                  "; the file is corrupt or not a loom FileStore");
      }
      cache[std::string(key.begin(), key.end())] = std::move(value);
    }
    parsed_until += static_cast<off_t>(buffer.size());
  }

  // Appends one record. Caller holds the exclusive file lock.
  void append(const std::string& key, const Bytes& value) {
    Bytes record;
    auto put = [&](const void* data, uint32_t length) {
      const uint8_t* bytes = static_cast<const uint8_t*>(data);
      record.insert(record.end(), reinterpret_cast<uint8_t*>(&length), reinterpret_cast<uint8_t*>(&length) + 4);
      record.insert(record.end(), bytes, bytes + length);
    };
    put(key.data(), static_cast<uint32_t>(key.size()));
    put(value.data(), static_cast<uint32_t>(value.size()));
    size_t done = 0;
    while (done < record.size()) {
      ssize_t n = ::write(file.get(), record.data() + done, record.size() - done);  // O_APPEND
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) LOOM_FAIL("FileStore ", path, ": write failed: ", std::strerror(errno));
      done += static_cast<size_t>(n);
    }
  }

  int64_t add_locked(const std::string& key, int64_t delta) {
    FileLock lock(file.get(), LOCK_EX, path);
    refresh();
    int64_t value = delta;
    if (auto it = cache.find(key); it != cache.end()) {
      std::string text(it->second.begin(), it->second.end());
      char* end = nullptr;
      long long current = std::strtoll(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0') LOOM_FAIL("FileStore: add('", key, "') on a key whose value is not an integer");
      if (__builtin_add_overflow(value, current, &value))
        LOOM_FAIL("FileStore: add('", key, "', ", delta, ") overflows 64 bits (the value is ", current, ")");
    }
    std::string text = std::to_string(value);
    append(key, Bytes(text.begin(), text.end()));
    refresh();
    return value;
  }
};

FileStore::FileStore(std::string path, Milliseconds timeout)
    : Store(timeout), path_(std::move(path)), state_(std::make_unique<State>()) {
  state_->path = path_;
  state_->file.reset(::open(path_.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (!state_->file.valid())
    LOOM_FAIL("FileStore: cannot open ", path_, ": ", std::strerror(errno),
              "; the path must be on a filesystem every rank can write");
  std::lock_guard guard(state_->mutex);
  state_->add_locked(kUsersKey, 1);
}

FileStore::~FileStore() {
  try {
    std::lock_guard guard(state_->mutex);
    if (state_->add_locked(kUsersKey, -1) == 0) ::unlink(path_.c_str());
  } catch (...) {
    // A destructor must not throw; the file stays behind.
  }
}

void FileStore::do_set(const std::string& key, const Bytes& value) {
  std::lock_guard guard(state_->mutex);
  FileLock lock(state_->file.get(), LOCK_EX, path_);
  state_->append(key, value);
}

Bytes FileStore::do_get(const std::string& key, Milliseconds timeout) {
  wait({key}, timeout);
  std::lock_guard guard(state_->mutex);
  return state_->cache.at(key);
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  std::lock_guard guard(state_->mutex);
  return state_->add_locked(key, delta);
}

void FileStore::do_wait(const std::vector<std::string>& keys, Milliseconds timeout) {
  auto deadline = SteadyClock::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  while (true) {
    if (check(keys)) return;
    auto now = SteadyClock::now();
    if (now >= deadline) throw_timeout("FileStore", keys, timeout);
    std::this_thread::sleep_for(std::min<SteadyClock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

bool FileStore::check(const std::vector<std::string>& keys) {
  std::lock_guard guard(state_->mutex);
  FileLock lock(state_->file.get(), LOCK_SH, path_);
  state_->refresh();
  for (const auto& key : keys)
    if (!state_->cache.contains(key)) return false;
  return true;
}

}  // namespace loom::dist
