// TCPStore: a key-value server thread on rank 0 (one poll(2) loop serving
// every client, waiting requests parked until their keys arrive or their
// deadline passes) and the blocking client every rank uses.
//
// Wire format: every message is a frame, u32 payload length (little endian)
// then the payload. Requests start with a Command byte, replies with a Status
// byte. Strings and byte values are u32 length + bytes; integers are i64.
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <unordered_map>

#include "core/error.h"
#include "dist/store.h"

namespace loom::dist {

namespace {

enum class Command : uint8_t { set = 1, get = 2, add = 3, wait = 4, check = 5 };
enum class Status : uint8_t { ok = 0, timeout = 1, error = 2 };

constexpr uint32_t kMaxFrameBytes = 1u << 30;

class MessageWriter {
 public:
  MessageWriter() { bytes_.resize(4); }  // room for the frame length
  MessageWriter& u8(uint8_t value) {
    bytes_.push_back(value);
    return *this;
  }
  MessageWriter& u32(uint32_t value) { return raw(&value, 4); }
  MessageWriter& i64(int64_t value) { return raw(&value, 8); }
  MessageWriter& blob(const void* data, size_t size) {
    u32(static_cast<uint32_t>(size));
    return raw(data, size);
  }
  MessageWriter& text(const std::string& value) { return blob(value.data(), value.size()); }
  // The finished frame: length prefix then payload.
  Bytes frame() && {
    uint32_t length = static_cast<uint32_t>(bytes_.size() - 4);
    std::memcpy(bytes_.data(), &length, 4);
    return std::move(bytes_);
  }

 private:
  MessageWriter& raw(const void* data, size_t size) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    bytes_.insert(bytes_.end(), p, p + size);
    return *this;
  }
  Bytes bytes_;
};

class MessageReader {
 public:
  MessageReader(const uint8_t* data, size_t size) : position_(data), end_(data + size) {}
  uint8_t u8() {
    need(1);
    return *position_++;
  }
  uint32_t u32() { return read<uint32_t>(); }
  int64_t i64() { return read<int64_t>(); }
  Bytes blob() {
    uint32_t size = u32();
    need(size);
    Bytes value(position_, position_ + size);
    position_ += size;
    return value;
  }
  std::string text() {
    Bytes value = blob();
    return std::string(value.begin(), value.end());
  }

 private:
  template <class T>
  T read() {
    need(sizeof(T));
    T value;
    std::memcpy(&value, position_, sizeof(T));
    position_ += sizeof(T);
    return value;
  }
  void need(size_t size) const {
    if (static_cast<size_t>(end_ - position_) < size) LOOM_FAIL("TCPStore: malformed message (truncated)");
  }
  const uint8_t* position_;
  const uint8_t* end_;
};

// Parses the decimal integer add() keeps under a key.
int64_t parse_counter(const std::string& key, const Bytes& value) {
  std::string text(value.begin(), value.end());
  char* end = nullptr;
  errno = 0;
  long long number = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE)
    LOOM_FAIL("TCPStore: add('", key, "') on a key whose value is not an integer");
  return number;
}

Bytes counter_bytes(int64_t value) {
  std::string text = std::to_string(value);
  return Bytes(text.begin(), text.end());
}

}  // namespace

// The server side of TCPStore; all state is touched by its thread only.
class TCPStoreServer {
 public:
  TCPStoreServer(const std::string& host, int port)
      : listener_(listen_on_port(host, port)), wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    if (!wake_.valid()) LOOM_FAIL("TCPStore: eventfd failed: ", std::strerror(errno));
    set_nonblocking(listener_.get());
    port_ = bound_port(listener_.get());
    thread_ = std::thread([this] { serve(); });
  }

  ~TCPStoreServer() {
    uint64_t one = 1;
    ssize_t ignored = ::write(wake_.get(), &one, sizeof(one));
    (void)ignored;
    if (thread_.joinable()) thread_.join();
  }

  TCPStoreServer(const TCPStoreServer&) = delete;
  TCPStoreServer& operator=(const TCPStoreServer&) = delete;

  int port() const { return port_; }

 private:
  struct Connection {
    FileDescriptor socket;
    Bytes input;
    Bytes output;
    size_t output_sent = 0;
    bool closed = false;
  };

  // A get or wait whose keys are not all there yet.
  struct Waiter {
    int socket;
    Command command;
    std::vector<std::string> keys;
    SteadyClock::time_point deadline;
  };

  void serve() noexcept {
    std::vector<pollfd> entries;
    while (true) {
      entries.clear();
      entries.push_back({wake_.get(), POLLIN, 0});
      entries.push_back({listener_.get(), POLLIN, 0});
      for (auto& [fd, connection] : connections_) {
        short events = POLLIN;
        if (connection.output_sent < connection.output.size()) events |= POLLOUT;
        entries.push_back({fd, events, 0});
      }
      int timeout_ms = -1;
      if (!waiters_.empty()) {
        auto nearest = std::min_element(waiters_.begin(), waiters_.end(), [](const Waiter& a, const Waiter& b) {
                         return a.deadline < b.deadline;
                       })->deadline;
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(nearest - SteadyClock::now()).count();
        timeout_ms = static_cast<int>(std::clamp<int64_t>(left + 1, 0, 1 << 30));
      }
      int ready = ::poll(entries.data(), entries.size(), timeout_ms);
      if (ready < 0 && errno != EINTR) return;  // nothing sensible left to do; clients see the close
      if (entries[0].revents != 0) return;      // shutdown requested
      if (entries[1].revents & POLLIN) accept_clients();
      for (size_t i = 2; i < entries.size(); ++i) {
        if (entries[i].revents == 0) continue;
        auto it = connections_.find(entries[i].fd);
        if (it == connections_.end()) continue;
        if (entries[i].revents & (POLLIN | POLLHUP | POLLERR)) read_requests(it->first, it->second);
        if (entries[i].revents & POLLOUT) flush(it->second);
      }
      expire_waiters();
      std::erase_if(waiters_, [this](const Waiter& w) { return connections_.at(w.socket).closed; });
      std::erase_if(connections_, [](const auto& entry) { return entry.second.closed; });
    }
  }

  void accept_clients() {
    while (true) {
      int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;  // EAGAIN, or out of descriptors: retried on the next poll
      set_no_delay(fd);
      connections_[fd].socket.reset(fd);
    }
  }

  void read_requests(int fd, Connection& connection) {
    uint8_t buffer[64 * 1024];
    while (true) {
      ssize_t received = ::recv(fd, buffer, sizeof(buffer), 0);
      if (received > 0) {
        connection.input.insert(connection.input.end(), buffer, buffer + received);
        continue;
      }
      if (received == 0) connection.closed = true;
      if (received < 0 && errno == EINTR) continue;
      if (received < 0 && errno != EAGAIN && errno != EWOULDBLOCK) connection.closed = true;
      break;
    }
    size_t consumed = 0;
    while (!connection.closed && connection.input.size() - consumed >= 4) {
      uint32_t length;
      std::memcpy(&length, connection.input.data() + consumed, 4);
      if (length > kMaxFrameBytes) {
        connection.closed = true;  // not a loom client
        break;
      }
      if (connection.input.size() - consumed - 4 < length) break;
      const uint8_t* payload = connection.input.data() + consumed + 4;
      consumed += 4 + length;
      try {
        handle_request(fd, connection, MessageReader(payload, length));
      } catch (const std::exception& error) {
        reply_error(connection, error.what());
      }
    }
    connection.input.erase(connection.input.begin(), connection.input.begin() + static_cast<ptrdiff_t>(consumed));
    flush(connection);
  }

  void handle_request(int fd, Connection& connection, MessageReader request) {
    auto command = static_cast<Command>(request.u8());
    switch (command) {
      case Command::set: {
        std::string key = request.text();
        data_[key] = request.blob();
        reply(connection, std::move(MessageWriter().u8(uint8_t(Status::ok))).frame());
        release_waiters();
        return;
      }
      case Command::add: {
        std::string key = request.text();
        int64_t delta = request.i64();
        auto it = data_.find(key);
        int64_t value = (it == data_.end() ? 0 : parse_counter(key, it->second)) + delta;
        data_[key] = counter_bytes(value);
        reply(connection, std::move(MessageWriter().u8(uint8_t(Status::ok)).i64(value)).frame());
        release_waiters();
        return;
      }
      case Command::check: {
        uint32_t count = request.u32();
        bool all = true;
        for (uint32_t i = 0; i < count; ++i) all = data_.contains(request.text()) && all;
        reply(connection, std::move(MessageWriter().u8(uint8_t(Status::ok)).u8(all ? 1 : 0)).frame());
        return;
      }
      case Command::get:
      case Command::wait: {
        int64_t timeout_ms = request.i64();
        uint32_t count = request.u32();
        Waiter waiter{fd, command, {}, SteadyClock::now() + std::chrono::milliseconds(timeout_ms)};
        for (uint32_t i = 0; i < count; ++i) waiter.keys.push_back(request.text());
        if (!try_answer(connection, waiter)) waiters_.push_back(std::move(waiter));
        return;
      }
    }
    LOOM_FAIL("TCPStore: unknown command ", int(command), " (client and server from different loom versions?)");
  }

  // Answers the waiter when all its keys exist; returns whether it did.
  bool try_answer(Connection& connection, const Waiter& waiter) {
    for (const auto& key : waiter.keys)
      if (!data_.contains(key)) return false;
    MessageWriter writer;
    writer.u8(uint8_t(Status::ok));
    if (waiter.command == Command::get) {
      const Bytes& value = data_.at(waiter.keys.front());
      writer.blob(value.data(), value.size());
    }
    reply(connection, std::move(writer).frame());
    return true;
  }

  void release_waiters() {
    std::erase_if(waiters_, [this](const Waiter& waiter) {
      Connection& connection = connections_.at(waiter.socket);
      return connection.closed || try_answer(connection, waiter);
    });
  }

  void expire_waiters() {
    auto now = SteadyClock::now();
    std::erase_if(waiters_, [&](const Waiter& waiter) {
      if (waiter.deadline > now) return false;
      Connection& connection = connections_.at(waiter.socket);
      reply(connection, std::move(MessageWriter().u8(uint8_t(Status::timeout))).frame());
      return true;
    });
  }

  void reply_error(Connection& connection, const std::string& message) {
    reply(connection, std::move(MessageWriter().u8(uint8_t(Status::error)).text(message)).frame());
  }

  void reply(Connection& connection, Bytes frame) {
    connection.output.insert(connection.output.end(), frame.begin(), frame.end());
    flush(connection);
  }

  void flush(Connection& connection) {
    while (!connection.closed && connection.output_sent < connection.output.size()) {
      ssize_t sent = ::send(connection.socket.get(), connection.output.data() + connection.output_sent,
                            connection.output.size() - connection.output_sent, MSG_NOSIGNAL);
      if (sent > 0) {
        connection.output_sent += static_cast<size_t>(sent);
      } else if (sent < 0 && errno == EINTR) {
        continue;
      } else if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return;  // POLLOUT resumes
      } else {
        connection.closed = true;
      }
    }
    if (connection.output_sent == connection.output.size()) {
      connection.output.clear();
      connection.output_sent = 0;
    }
  }

  FileDescriptor listener_;
  FileDescriptor wake_;
  int port_ = 0;
  std::thread thread_;
  std::unordered_map<int, Connection> connections_;
  std::unordered_map<std::string, Bytes> data_;
  std::vector<Waiter> waiters_;
};

TCPStore::TCPStore(std::string host, int port, TCPStoreOptions options)
    : Store(options.timeout), host_(std::move(host)), port_(port) {
  LOOM_CHECK(port >= 0 && port <= 65535, "TCPStore: port ", port, " is out of range (0 to 65535)");
  if (options.is_server) {
    server_ = std::make_unique<TCPStoreServer>(host_, port_);
    port_ = server_->port();
  } else {
    LOOM_CHECK(port_ != 0, "TCPStore: a client needs the master's port; 0 only works for the server");
  }
  idle_connections_.push_back(connect_with_retry(host_, port_, options.timeout));
}

// Client connections close before the server thread stops.
TCPStore::~TCPStore() {
  idle_connections_.clear();
  server_.reset();
}

Bytes TCPStore::round_trip(const Bytes& request, Milliseconds wait_budget) {
  FileDescriptor connection;
  {
    std::lock_guard lock(idle_mutex_);
    if (!idle_connections_.empty()) {
      connection = std::move(idle_connections_.back());
      idle_connections_.pop_back();
    }
  }
  if (!connection.valid()) connection = connect_with_retry(host_, port_, timeout());
  std::string peer = str("master ", host_port(host_, port_));
  send_all(connection.get(), request.data(), request.size(), peer);
  // The server answers at once except for waiting calls; allow slack for a busy server.
  Milliseconds budget = std::max(wait_budget, timeout()) + std::chrono::seconds(10);
  auto deadline = SteadyClock::now() + budget;
  uint32_t length = 0;
  bool answered = receive_all(connection.get(), &length, 4, deadline, peer);
  Bytes reply(answered ? length : 0);
  if (answered) answered = receive_all(connection.get(), reply.data(), length, deadline, peer);
  if (!answered) {
    // The connection is dropped with its half-read reply; a later call opens a fresh one.
    LOOM_FAIL("TCPStore: ", peer, " did not answer within ",
              std::chrono::duration_cast<std::chrono::seconds>(budget).count(), " s");
  }
  std::lock_guard lock(idle_mutex_);
  idle_connections_.push_back(std::move(connection));
  return reply;
}

namespace {

// Checks the status byte of a reply; throws the server's error message.
// Returns false for a timeout.
bool reply_ok(MessageReader& reply) {
  auto status = static_cast<Status>(reply.u8());
  if (status == Status::error) LOOM_FAIL(reply.text());
  return status == Status::ok;
}

void write_keys(MessageWriter& writer, const std::vector<std::string>& keys) {
  writer.u32(static_cast<uint32_t>(keys.size()));
  for (const auto& key : keys) writer.text(key);
}

}  // namespace

void TCPStore::set(const std::string& key, const Bytes& value) {
  Bytes reply = round_trip(
      std::move(MessageWriter().u8(uint8_t(Command::set)).text(key).blob(value.data(), value.size())).frame(),
      Milliseconds(0));
  MessageReader reader(reply.data(), reply.size());
  reply_ok(reader);
}

Bytes TCPStore::get(const std::string& key, Milliseconds timeout) {
  MessageWriter writer;
  writer.u8(uint8_t(Command::get)).i64(timeout.count());
  write_keys(writer, {key});
  Bytes reply = round_trip(std::move(writer).frame(), timeout);
  MessageReader reader(reply.data(), reply.size());
  if (!reply_ok(reader)) throw_timeout("TCPStore", {key}, timeout);
  return reader.blob();
}

int64_t TCPStore::add(const std::string& key, int64_t delta) {
  Bytes reply =
      round_trip(std::move(MessageWriter().u8(uint8_t(Command::add)).text(key).i64(delta)).frame(), Milliseconds(0));
  MessageReader reader(reply.data(), reply.size());
  reply_ok(reader);
  return reader.i64();
}

void TCPStore::wait(const std::vector<std::string>& keys, Milliseconds timeout) {
  MessageWriter writer;
  writer.u8(uint8_t(Command::wait)).i64(timeout.count());
  write_keys(writer, keys);
  Bytes reply = round_trip(std::move(writer).frame(), timeout);
  MessageReader reader(reply.data(), reply.size());
  if (!reply_ok(reader)) throw_timeout("TCPStore", keys, timeout);
}

bool TCPStore::check(const std::vector<std::string>& keys) {
  MessageWriter writer;
  writer.u8(uint8_t(Command::check));
  write_keys(writer, keys);
  Bytes reply = round_trip(std::move(writer).frame(), Milliseconds(0));
  MessageReader reader(reply.data(), reply.size());
  reply_ok(reader);
  return reader.u8() != 0;
}

}  // namespace loom::dist
