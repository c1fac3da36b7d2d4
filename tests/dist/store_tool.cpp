// loom's TCPStore as a separate program, for the protocol test that pairs it
// with an independently written c10d peer (c10d_store_peer.py) or PyTorch.
//   loom_store_tool serve          hosts a store on a free port, prints the port,
//                                  serves until stdin closes
//   loom_store_tool client PORT    every call against 127.0.0.1:PORT, each answer
//                                  checked; exit 0 when all are right
//   loom_store_tool exchange PORT  waits for "from_python", sets "from_loom" to it reversed
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <iostream>
#include <string>
#include <thread>

#include <loom/core/error.h>
#include <loom/dist/store.h>

using namespace loom::dist;
using namespace std::chrono_literals;

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const std::exception& error) {
    return error.what();
  }
  return "";
}

int client(int port) {
  TCPStore store("127.0.0.1", port, TCPStoreOptions().is_server(false).timeout(10s));
  store.set("alpha", std::string_view("one"));
  expect(store.get_string("alpha") == "one", "set then get");
  loom::dist::Bytes binary = {0, 1, 255, 0, 7};
  store.set("binary", binary);
  expect(store.get("binary") == binary, "binary value round trip");
  store.set("empty", loom::dist::Bytes{});
  expect(store.get("empty").empty(), "empty value");
  expect(store.add("counter", 5) == 5, "add to a new key");
  expect(store.add("counter", -2) == 3, "add a negative delta");
  expect(store.get_string("counter") == "3", "a counter reads as decimal text");
  expect(store.check({"alpha", "counter"}), "check of present keys");
  expect(!store.check({"alpha", "missing"}), "check with a missing key");
  store.wait({"alpha", "counter"}, 1s);
  std::string message = error_of([&] { store.get("missing", 300ms); });
  expect(message.find("timed out after 0.3 s waiting for key 'missing'") != std::string::npos,
         "get of a missing key times out: " + message);
  expect(store.add("counter", 1) == 4, "the connection still works after a cancelled wait");
  std::thread setter([&] {
    std::this_thread::sleep_for(100ms);
    TCPStore other("127.0.0.1", port, TCPStoreOptions().is_server(false).timeout(10s));
    other.set("late", std::string_view("arrived"));
  });
  expect(store.get_string("late", 5s) == "arrived", "get waits for a key another client sets");
  setter.join();
  return failures == 0 ? 0 : 1;
}

int exchange(int port) {
  TCPStore store("127.0.0.1", port, TCPStoreOptions().is_server(false).timeout(30s));
  std::string value = store.get_string("from_python");
  std::reverse(value.begin(), value.end());
  store.set("from_loom", value);
  expect(store.add("shared_counter", 10) >= 10, "add on a shared counter");
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "serve") {
      TCPStore store("127.0.0.1", 0, TCPStoreOptions().is_server(true).timeout(60s));
      std::printf("%d\n", store.port());
      std::fflush(stdout);
      std::string line;
      while (std::getline(std::cin, line)) {
      }
      return 0;
    }
    if ((mode == "client" || mode == "exchange") && argc == 3) {
      int port = std::stoi(argv[2]);
      return mode == "client" ? client(port) : exchange(port);
    }
    std::fprintf(stderr, "usage: loom_store_tool serve | client PORT | exchange PORT\n");
    return 2;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "loom_store_tool: %s\n", error.what());
    return 1;
  }
}
