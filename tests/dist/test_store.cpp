// Store semantics (set / get / add / wait / check, timeouts, errors) for
// TCPStore, FileStore and PrefixStore, within one process and across processes.
#include <doctest/doctest.h>

#include <limits>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include <loom/core/error.h>
#include <loom/dist/store.h>
#include "tests/dist/multiprocess.h"

using namespace loom::dist;
using namespace loom::dist::testing;
using namespace std::chrono_literals;

namespace {

std::string temp_path(const char* stem) {
  return (std::filesystem::temp_directory_path() / (std::string(stem) + std::to_string(::getpid()) + "_" +
                                                     std::to_string(free_port())))
      .string();
}

// set / get / add / check / wait and the timeout message, for any store.
void check_store_semantics(Store& store, const char* store_name) {
  store.set("alpha", std::string_view("one"));
  CHECK(store.get_string("alpha") == "one");
  store.set("alpha", std::string_view("two"));  // a later set replaces the value
  CHECK(store.get_string("alpha") == "two");
  Bytes binary = {0, 1, 255, 0, 7};
  store.set("binary", binary);
  CHECK(store.get("binary") == binary);
  store.set("empty", Bytes{});
  CHECK(store.get("empty").empty());

  CHECK(store.add("counter", 5) == 5);
  CHECK(store.add("counter", -2) == 3);
  CHECK(store.get_string("counter") == "3");
  // An add past 2^63 - 1 is an error (it was a signed overflow, found by
  // fuzz_tcp_store), and the counter keeps its value.
  CHECK(error_of([&] { store.add("counter", std::numeric_limits<int64_t>::max()); }) != "(no error)");
  CHECK(store.get_string("counter") == "3");

  CHECK(store.check({"alpha", "counter"}));
  CHECK_FALSE(store.check({"alpha", "missing"}));
  store.wait({"alpha", "counter"}, 100ms);

  auto [message, waited] = timed_error_of([&] { store.get("missing", 200ms); });
  CHECK(contains(message, std::string(store_name) + ": timed out after 0.2 s waiting for key 'missing'"));
  CHECK(waited >= 0.19);
  CHECK(waited < 2.0);
  message = error_of([&] { store.wait({"alpha", "nope1", "nope2"}, 100ms); });
  CHECK(contains(message, "waiting for keys 'alpha', 'nope1', 'nope2'"));

  // A get blocks until another thread sets the key.
  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    store.set("late", std::string_view("arrived"));
  });
  CHECK(store.get_string("late", 5000ms) == "arrived");
  setter.join();
}

}  // namespace

TEST_SUITE("store") {
  TEST_CASE("TCPStore semantics (server and client in one process)") {
    TCPStore server("127.0.0.1", 0, TCPStoreOptions().is_server(true).timeout(5s));
    CHECK(server.port() > 0);
    check_store_semantics(server, "TCPStore");
    TCPStore client("127.0.0.1", server.port(), TCPStoreOptions().timeout(5s));
    CHECK(client.get_string("alpha") == "two");
    CHECK(client.add("counter", 10) == 13);
  }

  TEST_CASE("TCPStore serves many concurrent clients") {
    TCPStore server("127.0.0.1", 0, TCPStoreOptions().is_server(true).timeout(10s));
    constexpr int kClients = 16;
    constexpr int kAdds = 50;
    std::vector<std::thread> threads;
    std::atomic<int> failures{0};
    for (int c = 0; c < kClients; ++c) {
      threads.emplace_back([&, c] {
        try {
          TCPStore client("127.0.0.1", server.port(), TCPStoreOptions().timeout(10s));
          for (int i = 0; i < kAdds; ++i) client.add("total", 1);
          client.set("done/" + std::to_string(c), std::string_view("1"));
          std::vector<std::string> everyone;
          for (int other = 0; other < kClients; ++other) everyone.push_back("done/" + std::to_string(other));
          client.wait(everyone, 10s);
        } catch (const std::exception&) {
          ++failures;
        }
      });
    }
    for (auto& thread : threads) thread.join();
    CHECK(failures == 0);
    CHECK(server.get_string("total") == std::to_string(kClients * kAdds));
  }

  TEST_CASE("TCPStore: address already in use") {
    TCPStore first("127.0.0.1", 0, TCPStoreOptions().is_server(true).timeout(2s));
    int port = first.port();
    std::string message =
        error_of([&] { TCPStore second("127.0.0.1", port, TCPStoreOptions().is_server(true).timeout(2s)); });
    CHECK(contains(message, "TCPStore: address 127.0.0.1:" + std::to_string(port) + " is already in use"));
  }

  TEST_CASE("TCPStore: could not reach master") {
    int port = free_port();
    const auto [message, waited] =
        timed_error_of([&] { TCPStore client("127.0.0.1", port, TCPStoreOptions().timeout(1s)); });
    CHECK(contains(message, "TCPStore: could not reach master 127.0.0.1:" + std::to_string(port) + " after 1 s"));
    CHECK(waited >= 0.9);
    CHECK(waited < 3.0);
  }

  TEST_CASE("TCPStore: a client waiting when the server goes away gets an error, and so does its next call at once") {
    auto server = std::make_unique<TCPStore>("127.0.0.1", 0, TCPStoreOptions().is_server(true).timeout(5s));
    const std::string master = "127.0.0.1:" + std::to_string(server->port());
    TCPStore client("127.0.0.1", server->port(), TCPStoreOptions().timeout(60s));
    std::thread stopper([&] {
      std::this_thread::sleep_for(100ms);
      server.reset();
    });
    std::string message = error_of([&] { client.get("never", 5s); });
    stopper.join();
    CHECK(contains(message, "TCPStore: connection to master " + master));
    CHECK(contains(message, "was closed"));
    // The next call needs a new connection, which the gone master refuses: an
    // error at once, not after the client's 60 s of retrying (a rank whose
    // progress publisher did that outlived rank 0 by its whole timeout).
    const auto [refused, waited] = timed_error_of([&] { client.check({"x"}); });
    CHECK(contains(refused, "TCPStore: master " + master + " refused a new connection"));
    CHECK(contains(refused, "has probably exited"));
    CHECK(waited < 10.0);
  }

  TEST_CASE("claim_rank: a rank given to two processes fails naming both") {
    TCPStore server("127.0.0.1", 0, TCPStoreOptions().is_server(true).timeout(5s));
    TCPStore client("127.0.0.1", server.port(), TCPStoreOptions().timeout(5s));
    claim_rank(server, 0, "host a, pid 10", 1s);
    claim_rank(client, 1, "host b, pid 11", 1s);
    std::string message = error_of([&] { claim_rank(client, 1, "host c, pid 12", 1s); });
    CHECK(contains(message, "duplicate rank 1: this process (host c, pid 12) and another (host b, pid 11)"));
    CHECK(contains(describe_this_process(), "pid " + std::to_string(::getpid())));
  }

  TEST_CASE("two rank 0s of one job: the second's error names the first, not only the busy port") {
    // What a launcher that made both processes rank 0 leads to: both try to host the store.
    LaunchEnvironment launch;
    launch.launcher = Launcher::open_mpi;
    launch.world_size = 2;
    launch.master_addr = "127.0.0.1";
    TCPStore first("127.0.0.1", 0, TCPStoreOptions().is_server(true).timeout(5s));
    launch.master_port = first.port();
    claim_rank(first, 0, "host a, pid 10", 1s);
    std::string message = error_of([&] { connect_rendezvous_store(launch, 5s, [](const std::string&) -> std::optional<std::string> { return std::nullopt; }); });
    CHECK(contains(message, "duplicate rank 0: this process (" + describe_this_process() +
                                ") and another (host a, pid 10) were both given rank 0 (Open MPI (mpirun), world size 2)"));
  }

  TEST_CASE("TCPStore across processes") {
    auto results = spawn_ranks("tcp_store_ranks", 4, {.deadline = 20s});
    expect_all_ok(results);
  }

  TEST_CASE("FileStore semantics") {
    std::string path = temp_path("loom_file_store_");
    {
      FileStore store(path, 5s);
      check_store_semantics(store, "FileStore");
      FileStore second(path, 5s);  // another user of the same file sees the records
      CHECK(second.get_string("alpha") == "two");
      CHECK(second.add("counter", 1) == 4);
      CHECK(store.get_string("counter") == "4");
    }
    CHECK_FALSE(std::filesystem::exists(path));  // the last user removes the file
  }

  TEST_CASE("FileStore across processes") {
    std::string path = temp_path("loom_file_store_mp_");
    auto results = spawn_ranks("file_store_ranks", 3, {.deadline = 20s, .environment = {{"LOOM_TEST_PATH", path}}});
    expect_all_ok(results);
    std::filesystem::remove(path);
  }

  TEST_CASE("PrefixStore keeps namespaces apart") {
    auto base = std::make_shared<TCPStore>("127.0.0.1", 0, TCPStoreOptions().is_server(true).timeout(5s));
    PrefixStore a("a", base), b("b", base);
    a.set("key", std::string_view("from a"));
    b.set("key", std::string_view("from b"));
    CHECK(a.get_string("key") == "from a");
    CHECK(b.get_string("key") == "from b");
    CHECK(base->get_string("a/key") == "from a");
    CHECK(a.add("n", 2) == 2);
    CHECK_FALSE(b.check({"n"}));
    CHECK(contains(error_of([&] { b.get("n", 50ms); }), "waiting for key 'b/n'"));
  }
}

// Each rank writes its key, bumps a shared counter, then reads every other rank's key.
static void exchange_through(Store& store, int rank, int world) {
  store.add("arrived", 1);  // before the key, so seeing every key means every add happened
  store.set("rank/" + std::to_string(rank), "hello from " + std::to_string(rank));
  for (int other = 0; other < world; ++other) {
    std::string value = store.get_string("rank/" + std::to_string(other), 10s);
    expect(value == "hello from " + std::to_string(other), "rank ", rank, " read '", value, "' for rank ", other);
  }
  std::vector<std::string> keys;
  for (int other = 0; other < world; ++other) keys.push_back("rank/" + std::to_string(other));
  store.wait(keys, 10s);
  expect(store.check(keys), "check() after wait() is false");
  int64_t total = store.add("arrived", 0);
  expect(total == world, "counter is ", total, ", expected ", world);
  // Everyone reports done before rank 0 (the server) may exit.
  store.add("finished", 1);
  if (rank == 0) {
    while (store.add("finished", 0) < world) std::this_thread::sleep_for(5ms);
  }
}

LOOM_DIST_SCENARIO("tcp_store_ranks") {
  int rank = env_int("RANK"), world = env_int("WORLD_SIZE");
  TCPStore store(env_string("MASTER_ADDR"), env_int("MASTER_PORT"),
                 TCPStoreOptions().is_server(rank == 0).timeout(10s));
  exchange_through(store, rank, world);
}

LOOM_DIST_SCENARIO("file_store_ranks") {
  int rank = env_int("RANK"), world = env_int("WORLD_SIZE");
  FileStore store(env_string("LOOM_TEST_PATH"), 10s);
  exchange_through(store, rank, world);
}
