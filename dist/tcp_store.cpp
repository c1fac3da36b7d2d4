// TCPStore speaking PyTorch's c10d TCPStore protocol: a key-value server
// thread (one poll(2) loop serving every client, waiting requests parked until
// their keys arrive) and the blocking client every rank uses. A loom process
// and a PyTorch process (torchrun's agent store, torch.distributed.TCPStore)
// can share one store either way round.
//
// The protocol, as PyTorch 2.x's TCPStore.cpp / TCPStoreBackend.cpp /
// TCPStoreLibUvBackend.cpp define it (native byte order; strings and byte
// values are a u64 length then the bytes):
//   connect:      VALIDATE u32 0x3C85F7CE                       (no answer)
//   SET k v       -> (no answer)
//   GET k         -> value (empty when the key is missing: clients WAIT first)
//   ADD k i64     -> i64 new value (the key holds it in decimal)
//   CHECK n k...  -> u8 READY (0) / NOT_READY (1)
//   WAIT n k...   -> u8 STOP_WAITING (0) once every key exists
//   CANCEL_WAIT   -> u8 WAIT_CANCELED (1) (a pending STOP_WAITING may come first)
//   GETNUMKEYS    -> i64;  DELETE_KEY k -> i64 removed;  COMPARE_SET k old new -> value
//   APPEND k v    -> (no answer);  MULTI_GET n k... -> n values;  MULTI_SET n (k v)... -> (no answer)
//   PING u32      -> the same u32
// The server has no deadlines: a client that gives up on a WAIT sends
// CANCEL_WAIT. PyTorch's TCPStore client puts "/" before every key it sends;
// loom's does too, so that both see the same keys.
#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include <loom/core/error.h>
#include <loom/core/log.h>
#include <loom/dist/store.h>

namespace loom::dist {

namespace {

enum class Query : uint8_t {
  validate = 0,
  set = 1,
  compare_set = 2,
  get = 3,
  add = 4,
  check = 5,
  wait = 6,
  get_num_keys = 7,
  delete_key = 8,
  append = 9,
  multi_get = 10,
  multi_set = 11,
  cancel_wait = 12,
  ping = 13,
};
constexpr uint32_t kValidationMagic = 0x3C85F7CE;
constexpr uint8_t kReady = 0, kNotReady = 1;
constexpr uint8_t kStopWaiting = 0, kWaitCanceled = 1;
// Larger lengths are not a store client (PyTorch's own limits are similar).
constexpr uint64_t kMaxValueBytes = 1ull << 31;
constexpr uint64_t kMaxKeys = 1ull << 20;

// A request being built, sent as one write.
class Request {
 public:
  explicit Request(Query query) : bytes_(1, static_cast<uint8_t>(query)) {}
  Request& u32(uint32_t value) { return raw(&value, 4); }
  Request& u64(uint64_t value) { return raw(&value, 8); }
  Request& i64(int64_t value) { return raw(&value, 8); }
  Request& bytes(const void* data, size_t size) {
    u64(size);
    return raw(data, size);
  }
  Request& text(const std::string& value) { return bytes(value.data(), value.size()); }
  Request& keys(const std::vector<std::string>& keys) {
    u64(keys.size());
    for (const auto& key : keys) text(key);
    return *this;
  }
  const Bytes& data() const { return bytes_; }

 private:
  Request& raw(const void* data, size_t size) {
    const size_t used = bytes_.size();
    bytes_.resize(used + size);
    if (size > 0) std::memcpy(bytes_.data() + used, data, size);
    return *this;
  }
  Bytes bytes_;
};

// Reads one request from what a connection has received so far; throws
// Incomplete when more bytes are needed.
struct Incomplete {};

class Parser {
 public:
  Parser(const uint8_t* data, size_t size) : position_(data), begin_(data), end_(data + size) {}
  uint8_t u8() {
    need(1);
    return *position_++;
  }
  uint32_t u32() { return read<uint32_t>(); }
  uint64_t u64() { return read<uint64_t>(); }
  int64_t i64() { return read<int64_t>(); }
  Bytes bytes() {
    uint64_t size = u64();
    if (size > kMaxValueBytes) LOOM_FAIL("TCPStore: a client sent a ", size, "-byte value");
    need(size);
    Bytes value(position_, position_ + size);
    position_ += size;
    return value;
  }
  std::string text() {
    Bytes value = bytes();
    return std::string(value.begin(), value.end());
  }
  std::vector<std::string> keys() {
    uint64_t count = u64();
    if (count > kMaxKeys) LOOM_FAIL("TCPStore: a client sent ", count, " keys");
    std::vector<std::string> result;
    for (uint64_t i = 0; i < count; ++i) result.push_back(text());
    return result;
  }
  size_t consumed() const { return static_cast<size_t>(position_ - begin_); }

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
    if (static_cast<size_t>(end_ - position_) < size) throw Incomplete{};
  }
  const uint8_t* position_;
  const uint8_t* begin_;
  const uint8_t* end_;
};

template <class T>
void append_value(Bytes& out, T value) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(&value);
  out.insert(out.end(), p, p + sizeof(T));
}

void append_bytes(Bytes& out, const Bytes& value) {
  append_value<uint64_t>(out, value.size());
  out.insert(out.end(), value.begin(), value.end());
}

// "127.0.0.1:41234" for an accepted client's address.
std::string describe_address(const sockaddr_storage& address, socklen_t length) {
  char host[NI_MAXHOST] = {}, port[NI_MAXSERV] = {};
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&address), length, host, sizeof(host), port, sizeof(port),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "an unknown address";
  std::string text = host;
  if (text.rfind("::ffff:", 0) == 0 && text.find('.') != std::string::npos) text = text.substr(7);  // IPv4-mapped
  return host_port(text, std::atoi(port));
}

// The key as PyTorch's TCPStore client sends it.
std::string wire_key(const std::string& key) { return "/" + key; }

std::vector<std::string> wire_keys(const std::vector<std::string>& keys) {
  std::vector<std::string> result;
  result.reserve(keys.size());
  for (const auto& key : keys) result.push_back(wire_key(key));
  return result;
}

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
    bool validated = false;  // sent VALIDATE with the magic number
    Bytes input;
    Bytes output;
    size_t output_sent = 0;
    bool closed = false;
  };

  // A WAIT whose keys are not all there yet (at most one per connection).
  struct Waiter {
    int socket;
    std::vector<std::string> keys;
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
      int ready = ::poll(entries.data(), entries.size(), -1);
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
      std::erase_if(waiters_, [this](const Waiter& w) { return connections_.at(w.socket).closed; });
      std::erase_if(connections_, [](const auto& entry) { return entry.second.closed; });
    }
  }

  void accept_clients() {
    while (true) {
      sockaddr_storage address{};
      socklen_t length = sizeof(address);
      int fd = ::accept4(listener_.get(), reinterpret_cast<sockaddr*>(&address), &length,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;  // EAGAIN, or out of descriptors: retried on the next poll
      set_no_delay(fd);
      connections_[fd].socket.reset(fd);
      if (log_enabled(LogLevel::debug)) {
        log_debug("TCPStore server on port ", port_, ": a client connected from ", describe_address(address, length),
                  " (", connections_.size(), " connection", connections_.size() == 1 ? "" : "s", " open)");
      }
    }
  }

  void read_requests(int fd, Connection& connection) {
    uint8_t buffer[64 * 1024];
    // A client that sends its last requests and closes (a set() just before
    // exiting) has them handled: the end of its data is acted on after them.
    bool ended = false;
    while (true) {
      ssize_t received = ::recv(fd, buffer, sizeof(buffer), 0);
      if (received > 0) {
        connection.input.insert(connection.input.end(), buffer, buffer + received);
        continue;
      }
      if (received == 0) ended = true;
      if (received < 0 && errno == EINTR) continue;
      if (received < 0 && errno != EAGAIN && errno != EWOULDBLOCK) connection.closed = true;
      break;
    }
    size_t consumed = 0;
    while (!connection.closed && consumed < connection.input.size()) {
      Parser request(connection.input.data() + consumed, connection.input.size() - consumed);
      try {
        handle_request(fd, connection, request);
      } catch (const Incomplete&) {
        break;  // the rest of the request comes with a later recv
      } catch (const std::exception&) {
        connection.closed = true;  // not a store client, or a malformed request: drop it, as PyTorch does
        break;
      }
      consumed += request.consumed();
    }
    connection.input.erase(connection.input.begin(), connection.input.begin() + static_cast<ptrdiff_t>(consumed));
    flush(connection);
    if (ended) connection.closed = true;
  }

  // Handles one whole request; throws Incomplete, before changing anything,
  // when it has not fully arrived.
  void handle_request(int fd, Connection& connection, Parser& request) {
    const auto query = static_cast<Query>(request.u8());
    if (!connection.validated) {
      if (query != Query::validate || request.u32() != kValidationMagic)
        LOOM_FAIL("TCPStore: a client did not start with the validation handshake");
      connection.validated = true;
      return;
    }
    Bytes reply;
    switch (query) {
      case Query::validate:
        if (request.u32() != kValidationMagic) LOOM_FAIL("TCPStore: bad validation number");
        return;
      case Query::set: {
        std::string key = request.text();
        Bytes value = request.bytes();
        if (log_enabled(LogLevel::debug)) log_rank_claim(key, value);
        data_[key] = std::move(value);
        release_waiters();
        return;
      }
      case Query::compare_set: {
        std::string key = request.text();
        Bytes expected = request.bytes();
        Bytes desired = request.bytes();
        auto it = data_.find(key);
        if (it == data_.end()) {
          if (expected.empty()) data_[key] = desired;
          append_bytes(reply, expected.empty() ? desired : expected);
        } else {
          if (it->second == expected) it->second = std::move(desired);
          append_bytes(reply, it->second);
        }
        release_waiters();
        break;
      }
      case Query::get: {
        std::string key = request.text();
        auto it = data_.find(key);
        append_bytes(reply, it == data_.end() ? Bytes{} : it->second);
        break;
      }
      case Query::add: {
        std::string key = request.text();
        int64_t value = request.i64();
        auto it = data_.find(key);
        if (it != data_.end() && __builtin_add_overflow(value, parse_counter(key, it->second), &value))
          LOOM_FAIL("TCPStore: add('", key, "') overflows 64 bits");
        std::string text = std::to_string(value);
        data_[key] = Bytes(text.begin(), text.end());
        append_value<int64_t>(reply, value);
        release_waiters();
        break;
      }
      case Query::check: {
        std::vector<std::string> keys = request.keys();
        bool all = std::all_of(keys.begin(), keys.end(), [&](const std::string& key) { return data_.contains(key); });
        reply.push_back(all ? kReady : kNotReady);
        break;
      }
      case Query::wait: {
        Waiter waiter{fd, request.keys()};
        std::erase_if(waiters_, [fd](const Waiter& w) { return w.socket == fd; });
        if (!all_present(waiter.keys)) {
          waiters_.push_back(std::move(waiter));
          return;
        }
        reply.push_back(kStopWaiting);
        break;
      }
      case Query::cancel_wait:
        std::erase_if(waiters_, [fd](const Waiter& w) { return w.socket == fd; });
        reply.push_back(kWaitCanceled);
        break;
      case Query::get_num_keys: append_value<int64_t>(reply, static_cast<int64_t>(data_.size())); break;
      case Query::delete_key: append_value<int64_t>(reply, static_cast<int64_t>(data_.erase(request.text()))); break;
      case Query::append: {
        std::string key = request.text();
        Bytes value = request.bytes();
        Bytes& stored = data_[key];
        stored.insert(stored.end(), value.begin(), value.end());
        release_waiters();
        return;
      }
      case Query::multi_get: {
        for (const std::string& key : request.keys()) {
          auto it = data_.find(key);
          append_bytes(reply, it == data_.end() ? Bytes{} : it->second);
        }
        break;
      }
      case Query::multi_set: {
        uint64_t count = request.u64();
        if (count > kMaxKeys) LOOM_FAIL("TCPStore: a client sent ", count, " keys");
        std::vector<std::pair<std::string, Bytes>> entries;
        for (uint64_t i = 0; i < count; ++i) {
          std::string key = request.text();
          entries.emplace_back(std::move(key), request.bytes());
        }
        for (auto& [key, value] : entries) data_[key] = std::move(value);
        release_waiters();
        return;
      }
      case Query::ping: append_value<uint32_t>(reply, request.u32()); break;
      default: LOOM_FAIL("TCPStore: unknown query type ", int(query));
    }
    send(connection, reply);
  }

  // claim_rank() stores "<prefix>/loom/rank/<r>/owner" = who: the line
  // that says which process joined as which rank.
  void log_rank_claim(const std::string& key, const Bytes& value) const {
    static const std::string kOwner = "/owner";
    const size_t rank_at = key.rfind("loom/rank/");
    if (rank_at == std::string::npos || key.size() < kOwner.size() ||
        key.compare(key.size() - kOwner.size(), kOwner.size(), kOwner) != 0)
      return;
    const size_t begin = rank_at + 10;
    std::string rank = key.substr(begin, key.size() - kOwner.size() - begin);
    log_debug("TCPStore server on port ", port_, ": rank ", rank, " joined (", std::string(value.begin(), value.end()),
              ")");
  }

  bool all_present(const std::vector<std::string>& keys) const {
    return std::all_of(keys.begin(), keys.end(), [&](const std::string& key) { return data_.contains(key); });
  }

  void release_waiters() {
    std::erase_if(waiters_, [this](const Waiter& waiter) {
      Connection& connection = connections_.at(waiter.socket);
      if (connection.closed) return true;
      if (!all_present(waiter.keys)) return false;
      send(connection, Bytes{kStopWaiting});
      return true;
    });
  }

  void send(Connection& connection, const Bytes& bytes) {
    connection.output.insert(connection.output.end(), bytes.begin(), bytes.end());
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
    : Store(options.timeout()), host_(std::move(host)), port_(port) {
  LOOM_CHECK(port >= 0 && port <= 65535, "TCPStore: port ", port, " is out of range (0 to 65535)");
  if (options.is_server()) {
    server_ = std::make_unique<TCPStoreServer>(host_, port_);
    port_ = server_->port();
  } else {
    LOOM_CHECK(port_ != 0, "TCPStore: a client needs the master's port; 0 only works for the server");
  }
  idle_connections_.push_back(open_connection(true));
}

// Client connections close before the server thread stops.
TCPStore::~TCPStore() {
  idle_connections_.clear();
  server_.reset();
}

std::string TCPStore::peer() const { return str("master ", host_port(host_, port_)); }

FileDescriptor TCPStore::open_connection(bool first) {
  FileDescriptor connection = connect_with_retry(host_, port_, timeout(), /*retry_refused=*/first);
  Bytes hello = Request(Query::validate).u32(kValidationMagic).data();
  send_all(connection.get(), hello.data(), hello.size(), peer());
  return connection;
}

TCPStore::Lease::Lease(TCPStore& store) : store_(store) {
  {
    std::lock_guard lock(store_.idle_mutex_);
    if (!store_.idle_connections_.empty()) {
      connection_ = std::move(store_.idle_connections_.back());
      store_.idle_connections_.pop_back();
    }
  }
  if (!connection_.valid()) connection_ = store_.open_connection(false);
}

TCPStore::Lease::~Lease() {
  if (!healthy_ || !connection_.valid()) return;  // a half-read answer: the connection is dropped
  std::lock_guard lock(store_.idle_mutex_);
  store_.idle_connections_.push_back(std::move(connection_));
}

void TCPStore::Lease::send(const Bytes& request) {
  healthy_ = false;
  send_all(connection_.get(), request.data(), request.size(), store_.peer());
}

// The server answers at once except for WAIT; allow slack for a busy server.
void TCPStore::Lease::receive(void* data, size_t size) {
  Milliseconds budget = store_.timeout() + std::chrono::seconds(10);
  if (!receive_all(connection_.get(), data, size, SteadyClock::now() + budget, store_.peer()))
    LOOM_FAIL("TCPStore: ", store_.peer(), " did not answer within ",
              std::chrono::duration_cast<std::chrono::seconds>(budget).count(), " s");
}

Bytes TCPStore::Lease::receive_bytes() {
  uint64_t size = 0;
  receive(&size, sizeof(size));
  if (size > kMaxValueBytes) LOOM_FAIL("TCPStore: ", store_.peer(), " sent a ", size, "-byte value; not a store?");
  Bytes value(size);
  if (size > 0) receive(value.data(), size);
  return value;
}

// WAIT for `keys`; false when `timeout` passed first (the wait is cancelled).
bool TCPStore::Lease::wait(const std::vector<std::string>& keys, Milliseconds timeout) {
  send(Request(Query::wait).keys(keys).data());
  uint8_t response = 0;
  if (receive_all(connection_.get(), &response, 1, SteadyClock::now() + timeout, store_.peer())) {
    if (response != kStopWaiting) LOOM_FAIL("TCPStore: ", store_.peer(), " answered a wait with ", int(response));
    return true;
  }
  send(Request(Query::cancel_wait).data());
  receive(&response, 1);
  if (response == kStopWaiting) receive(&response, 1);  // the keys arrived just before the cancel
  if (response != kWaitCanceled) LOOM_FAIL("TCPStore: ", store_.peer(), " answered a cancelled wait with ", int(response));
  done();
  return false;
}

void TCPStore::do_set(const std::string& key, const Bytes& value) {
  Lease lease(*this);
  // SET has no answer; GETNUMKEYS after it returns once the server has
  // stored the value, so that every rank sees it when set() returns.
  Request request(Query::set);
  request.text(wire_key(key)).bytes(value.data(), value.size());
  Bytes both = request.data();
  Bytes count = Request(Query::get_num_keys).data();
  both.insert(both.end(), count.begin(), count.end());
  lease.send(both);
  int64_t keys = 0;
  lease.receive(&keys, sizeof(keys));
  lease.done();
}

Bytes TCPStore::do_get(const std::string& key, Milliseconds timeout) {
  Lease lease(*this);
  if (!lease.wait({wire_key(key)}, timeout)) throw_timeout("TCPStore", {key}, timeout);
  lease.send(Request(Query::get).text(wire_key(key)).data());
  Bytes value = lease.receive_bytes();
  lease.done();
  return value;
}

int64_t TCPStore::add(const std::string& key, int64_t delta) {
  Lease lease(*this);
  lease.send(Request(Query::add).text(wire_key(key)).i64(delta).data());
  int64_t value = 0;
  lease.receive(&value, sizeof(value));
  lease.done();
  return value;
}

void TCPStore::do_wait(const std::vector<std::string>& keys, Milliseconds timeout) {
  Lease lease(*this);
  if (!lease.wait(wire_keys(keys), timeout)) throw_timeout("TCPStore", keys, timeout);
  lease.done();
}

bool TCPStore::check(const std::vector<std::string>& keys) {
  Lease lease(*this);
  lease.send(Request(Query::check).keys(wire_keys(keys)).data());
  uint8_t response = 0;
  lease.receive(&response, 1);
  if (response != kReady && response != kNotReady)
    LOOM_FAIL("TCPStore: ", peer(), " answered a check with ", int(response));
  lease.done();
  return response == kReady;
}

}  // namespace loom::dist
