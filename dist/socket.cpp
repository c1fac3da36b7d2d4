// POSIX TCP helpers for the TCPStore (see socket.h).
#include <loom/dist/socket.h>

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include <loom/core/error.h>

namespace loom::dist {

void FileDescriptor::reset(int fd) noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string host_port(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return str("[", host, "]:", port);
  return str(host, ":", port);
}

namespace {

std::string errno_text(int error) { return std::strerror(error); }

// Binds a socket of `family` to the wildcard address; returns errno on failure.
int try_listen(int family, int port, int backlog, FileDescriptor& out) {
  FileDescriptor fd(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errno;
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  int result;
  if (family == AF_INET6) {
    int zero = 0;  // accept IPv4 clients too
    ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    sockaddr_in6 address{};
    address.sin6_family = AF_INET6;
    address.sin6_addr = in6addr_any;
    address.sin6_port = htons(static_cast<uint16_t>(port));
    result = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address));
  } else {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_ANY);
    address.sin_port = htons(static_cast<uint16_t>(port));
    result = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address));
  }
  if (result != 0) return errno;
  if (::listen(fd.get(), backlog) != 0) return errno;
  out = std::move(fd);
  return 0;
}

}  // namespace

FileDescriptor listen_on_port(const std::string& host, int port, int backlog) {
  FileDescriptor fd;
  int error = try_listen(AF_INET6, port, backlog, fd);
  if (error == EAFNOSUPPORT || error == EADDRNOTAVAIL) error = try_listen(AF_INET, port, backlog, fd);
  if (error == EADDRINUSE) {
    throw AddressInUse(str("TCPStore: address ", host_port(host, port),
                           " is already in use; another job or a leftover process holds port ", port,
                           ". Choose another MASTER_PORT or stop that process"));
  }
  if (error != 0) LOOM_FAIL("TCPStore: cannot listen on ", host_port(host, port), ": ", errno_text(error));
  return fd;
}

int bound_port(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0)
    LOOM_FAIL("TCPStore: getsockname failed: ", errno_text(errno));
  if (address.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&address)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&address)->sin_port);
}

void set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
    LOOM_FAIL("TCPStore: cannot make socket non-blocking: ", errno_text(errno));
}

void set_no_delay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

namespace {

// One connection attempt to `address` that gives up at `deadline`; returns 0
// or the errno that made it fail.
int try_connect(const addrinfo& address, SteadyClock::time_point deadline, FileDescriptor& out) {
  FileDescriptor fd(::socket(address.ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, address.ai_protocol));
  if (!fd.valid()) return errno;
  if (::connect(fd.get(), address.ai_addr, address.ai_addrlen) != 0) {
    if (errno != EINPROGRESS) return errno;
    pollfd entry{fd.get(), POLLOUT, 0};
    int ready = 0;
    do {  // a signal handler (a profiler's, a launcher's) interrupts the wait, not the attempt
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
      ready = ::poll(&entry, 1, static_cast<int>(std::max<int64_t>(left.count(), 1)));
    } while (ready < 0 && errno == EINTR);
    if (ready == 0) return ETIMEDOUT;
    if (ready < 0) return errno;
    int error = 0;
    socklen_t length = sizeof(error);
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &length);
    if (error != 0) return error;
  }
  int flags = ::fcntl(fd.get(), F_GETFL, 0);
  ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  out = std::move(fd);
  return 0;
}

}  // namespace

FileDescriptor connect_with_retry(const std::string& host, int port, std::chrono::milliseconds timeout,
                                  bool retry_refused) {
  auto start = SteadyClock::now();
  auto deadline = start + timeout;
  auto backoff = std::chrono::milliseconds(10);
  std::string last_error = "no attempt made";
  while (true) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* addresses = nullptr;
    std::string port_text = std::to_string(port);
    int status = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &addresses);
    if (status != 0) {
      last_error = str("cannot resolve host '", host, "': ", ::gai_strerror(status));
    } else {
      bool every_address_refused = true;
      for (addrinfo* address = addresses; address != nullptr; address = address->ai_next) {
        FileDescriptor fd;
        auto attempt_deadline = std::min(deadline, SteadyClock::now() + std::chrono::seconds(5));
        int error = try_connect(*address, attempt_deadline, fd);
        if (error == 0) {
          ::freeaddrinfo(addresses);
          set_no_delay(fd.get());
          return fd;
        }
        last_error = errno_text(error);
        every_address_refused = every_address_refused && error == ECONNREFUSED;
      }
      ::freeaddrinfo(addresses);
      if (every_address_refused && !retry_refused) {
        LOOM_FAIL("TCPStore: master ", host_port(host, port), " refused a new connection (", last_error,
                  ") after accepting this process's earlier ones: the process that ran the store (rank 0, or the "
                  "launcher's agent) has probably exited");
      }
    }
    auto now = SteadyClock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min(backoff, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now)));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
  double waited = std::chrono::duration<double>(SteadyClock::now() - start).count();
  LOOM_FAIL("TCPStore: could not reach master ", host_port(host, port), " after ", static_cast<int64_t>(waited + 0.5),
            " s (last error: ", last_error, "); check MASTER_ADDR / MASTER_PORT and that rank 0 is running");
}

void send_all(int fd, const void* data, size_t size, const std::string& peer) {
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t sent = ::send(fd, bytes, size, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      LOOM_FAIL("TCPStore: sending to ", peer, " failed: ", errno_text(errno));
    }
    bytes += sent;
    size -= static_cast<size_t>(sent);
  }
}

bool receive_all(int fd, void* data, size_t size, SteadyClock::time_point deadline, const std::string& peer) {
  char* bytes = static_cast<char*>(data);
  while (size > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now()).count();
    if (left <= 0) return false;
    pollfd entry{fd, POLLIN, 0};
    int ready = ::poll(&entry, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
    if (ready < 0) {
      if (errno == EINTR) continue;
      LOOM_FAIL("TCPStore: waiting for ", peer, " failed: ", errno_text(errno));
    }
    if (ready == 0) continue;  // the loop re-checks the deadline
    ssize_t received = ::recv(fd, bytes, size, 0);
    if (received == 0) LOOM_FAIL("TCPStore: connection to ", peer, " was closed (did rank 0 exit or crash?)");
    if (received < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      LOOM_FAIL("TCPStore: receiving from ", peer, " failed: ", errno_text(errno));
    }
    bytes += received;
    size -= static_cast<size_t>(received);
  }
  return true;
}

}  // namespace loom::dist
