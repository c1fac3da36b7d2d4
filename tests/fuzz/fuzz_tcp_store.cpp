// Fuzzes the TCPStore server (dist/tcp_store.cpp, PyTorch's c10d protocol)
// with arbitrary client bytes: each input is what one client sends on a fresh
// server (so no state carries between inputs), then the client half-closes
// and reads until the server closes. The server must survive anything: drop
// the connection within the timeout, and still serve a well-behaved client
// afterwards. A hang shows as libFuzzer's -timeout, a dead server as abort().
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <string>

#include <loom/core/error.h>
#include <loom/dist/socket.h>
#include <loom/dist/store.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace std::chrono_literals;
  loom::dist::TCPStore store("127.0.0.1", 0, loom::dist::TCPStoreOptions().is_server(true).timeout(10s));
  // libFuzzer's SIGALRM (its -timeout check, once a second) interrupts
  // blocking calls: loom's connect waits through it, and send/recv retry.
  loom::dist::FileDescriptor connection = loom::dist::connect_with_retry("127.0.0.1", store.port(), 5s);
  const int fd = connection.get();
  for (size_t sent = 0; sent < size;) {
    const ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the server dropped the connection (a malformed request): allowed
    sent += static_cast<size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  // The server answers what it understood, then closes: read until it does.
  // A server that keeps a client which has left hangs here, which libFuzzer's
  // -timeout reports (a poll timeout here would also fire on a loaded machine).
  char buffer[4096];
  while (true) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n == 0 || (n < 0 && errno != EINTR)) break;
  }
  connection.reset();
  // Still serving.
  store.set("fuzz/check", std::string_view("ok"));
  if (store.get("fuzz/check", 5s) != loom::dist::Bytes{'o', 'k'}) std::abort();
  return 0;
}
