// Small RAII layer over POSIX TCP sockets for the TCPStore: an owning file
// descriptor, listen / connect helpers, and whole-buffer send / receive with
// deadlines. Internal to dist/.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include <loom/core/error.h>

namespace loom::dist {

// listen_on_port's error when another process holds the port, so that callers
// can tell it apart (a second rank 0 is the usual cause within one job).
class AddressInUse : public Error {
 public:
  using Error::Error;
};

using SteadyClock = std::chrono::steady_clock;

// Owns one file descriptor; closes it on destruction. Move-only.
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() { reset(); }
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(other.release()) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1) noexcept;

 private:
  int fd_ = -1;
};

// Listens on every interface (IPv6 dual-stack when available, else IPv4) at
// `port` (0: any free port). `host` only names the address in errors. Throws
// AddressInUse ("TCPStore: address HOST:PORT is already in use") when the
// port is taken.
FileDescriptor listen_on_port(const std::string& host, int port, int backlog = 1024);

// The port a listening socket is bound to.
int bound_port(int fd);

// Connects to host:port, retrying refused / unreachable attempts until
// `timeout` has passed; throws "TCPStore: could not reach master HOST:PORT
// after N s (...)". With `retry_refused` false, an attempt that every address
// of the host refuses throws at once: for a master that accepted this process
// before, a refusal means its server has exited, and waiting out the timeout
// would only delay the error (and whatever waits for it, such as exit).
FileDescriptor connect_with_retry(const std::string& host, int port, std::chrono::milliseconds timeout,
                                  bool retry_refused = true);

void set_nonblocking(int fd);
void set_no_delay(int fd);

// Sends all of `size` bytes (blocking socket); throws on a closed peer. Never
// raises SIGPIPE.
void send_all(int fd, const void* data, size_t size, const std::string& peer);

// Receives exactly `size` bytes before `deadline`; returns false on timeout,
// throws when the peer closed the connection or on a socket error.
bool receive_all(int fd, void* data, size_t size, SteadyClock::time_point deadline, const std::string& peer);

// "host:port", with brackets around IPv6 literals.
std::string host_port(const std::string& host, int port);

}  // namespace loom::dist
