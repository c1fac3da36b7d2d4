// A gloo peer that fails must be named by rank in the survivor's error, on
// every path gloo's TCP transport can take: the peer's process killed while
// the survivor waits (gloo sees the connection closed, or reset), its sockets
// closed abortively (reset), killed before the next collective starts, or
// alive but never entering the collective (a timeout, with no address in
// gloo's message). Two real processes on loopback; rank 1 is the one that
// fails, rank 0 (which hosts the store) checks its error. Deadlines are
// generous so that a busy machine changes nothing but the time taken.
#include <doctest/doctest.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <loom/dist/process_group_gloo.h>
#include <loom/dist/store.h>
#include "tests/dist/multiprocess.h"

using namespace loom;
using namespace loom::dist;
using namespace loom::dist::testing;
using namespace std::chrono_literals;

namespace {

// Rank 0's collectives give up after this; far longer than any of these tests
// needs on a busy machine, except the timeout test, which sets its own.
constexpr Milliseconds kGenerousTimeout = 30s;

// The store (rank 0 hosts it) and a gloo group over every rank.
struct Ranks {
  int rank = env_int("RANK");
  std::shared_ptr<TCPStore> store = std::make_shared<TCPStore>(
      "127.0.0.1", env_int("MASTER_PORT"), TCPStoreOptions().is_server(rank == 0).timeout(60s));
  ProcessGroupGloo group{store, rank, env_int("WORLD_SIZE"), GlooOptions().timeout(kGenerousTimeout)};
};

// Whether process `pid` has ended (gone, or a zombie not yet reaped by the harness).
bool ended(int pid) {
  if (::kill(pid, 0) != 0) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  const size_t close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() || line[close + 2] == 'Z' || line[close + 2] == 'X';
}

std::string hostname() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

void wait_until_ended(int pid) {
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!ended(pid)) {
    expect(std::chrono::steady_clock::now() < deadline, "process ", pid, " did not end within 60 s");
    std::this_thread::sleep_for(10ms);
  }
}

// This process's TCP connections other than those to the store (port
// MASTER_PORT): gloo's. Each with this process's end as "127.0.0.1:41000".
struct Connection {
  int fd;
  std::string local;
};

int port_of(const sockaddr_storage& address) {
  return address.ss_family == AF_INET ? ntohs(reinterpret_cast<const sockaddr_in*>(&address)->sin_port)
                                      : ntohs(reinterpret_cast<const sockaddr_in6*>(&address)->sin6_port);
}

std::vector<Connection> gloo_connections() {
  std::vector<Connection> found;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::stoi(entry.path().filename().string());
    int type = 0;
    socklen_t length = sizeof(type);
    if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &length) != 0 || type != SOCK_STREAM) continue;
    sockaddr_storage peer{}, local{};
    socklen_t peer_length = sizeof(peer), local_length = sizeof(local);
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_length) != 0) continue;  // a listener
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_length) != 0) continue;
    if (port_of(peer) == env_int("MASTER_PORT") || port_of(local) == env_int("MASTER_PORT")) continue;
    char host[NI_MAXHOST];
    if (::getnameinfo(reinterpret_cast<sockaddr*>(&local), local_length, host, sizeof(host), nullptr, 0,
                      NI_NUMERICHOST) != 0)
      continue;
    found.push_back({fd, str(host, ":", port_of(local))});
  }
  return found;
}

// What rank 0 must find in its error about the failing rank: its pid, and its
// ends of its gloo connections as the kernel reports them (not as loom or
// gloo print them), published by the failing rank itself.
struct FailingRank {
  int rank = 1;
  int pid = 0;
  std::vector<std::string> addresses;
};

FailingRank failing_rank(const std::shared_ptr<TCPStore>& store, int rank, int failing = 1) {
  if (rank == failing) {
    std::string addresses;
    for (const Connection& connection : gloo_connections()) addresses += connection.local + " ";
    store->set("test/failing", str(::getpid(), " ", addresses));
  }
  std::istringstream fields(store->get_string("test/failing", 60s));
  FailingRank result;
  result.rank = failing;
  fields >> result.pid;
  for (std::string address; fields >> address;) result.addresses.push_back(address);
  return result;
}

// This rank's error must name the failing rank by rank, pid and (once
// connected) its end of the connection, say what happened (one of
// `events`) during `collective`, and end with gloo's own message.
void expect_names_peer(const std::string& message, const FailingRank& failed, const std::vector<std::string>& events,
                       const std::string& collective = "all_reduce #") {
  const std::string self = str("rank ", env_int("RANK"), " of ", env_int("WORLD_SIZE"));
  std::cout << self << "'s error: " << message << "\n";
  const std::string named = str("ProcessGroupGloo ", self, ": peer rank ", failed.rank, " (pid ", failed.pid, " on ");
  expect(contains(message, named), "the error does not name rank ", failed.rank, " and its pid first: ", message);
  expect(contains(message, collective), "the error does not name ", collective, ": ", message);
  expect(contains(message, "(Gloo: "), "the error does not quote gloo: ", message);
  bool said = false;
  for (const auto& event : events) said = said || contains(message, ") " + event + " during " + collective);
  std::string expected;
  for (const auto& event : events) expected += (expected.empty() ? "" : "' or '") + event;
  expect(said, "the error does not say rank ", failed.rank, " '", expected, "' during ", collective, ": ", message);
  if (failed.addresses.empty()) return;  // not connected yet
  bool addressed = false;
  for (const auto& address : failed.addresses)
    addressed = addressed || contains(message, named + hostname() + ", " + address + ") ");
  expect(addressed, "the error does not give rank ", failed.rank, "'s end of a connection (",
         failed.addresses.size(), " of them, e.g. ", failed.addresses[0], "): ", message);
}

// Rank 0 waits in an all_reduce when rank 1 is killed: gloo sees the
// connection closed (or reset, when rank 1 had not read all rank 0 sent).
LOOM_DIST_SCENARIO("gloo_killed_mid_collective") {
  Ranks ranks;
  const FailingRank failing = failing_rank(ranks.store, ranks.rank);
  ranks.group.barrier()->wait();
  if (ranks.rank == 1) {
    ranks.store->wait({"test/waiting"}, 60s);
    std::this_thread::sleep_for(200ms);  // rank 0 is inside its all_reduce by now (if not, it finds the pair closed)
    ::raise(SIGKILL);
  }
  Tensor tensor = Tensor::ones({1000}, DType::f32);
  WorkHandle work = ranks.group.all_reduce(tensor);
  ranks.store->set("test/waiting", "1");
  expect_names_peer(error_of([&] { work->wait(); }), failing, {"closed the connection", "reset the connection"});
}

// Rank 1 makes every gloo socket close abortively (SO_LINGER 0) and is
// killed: its kernel sends a reset, never a FIN, so rank 0 reads ECONNRESET.
LOOM_DIST_SCENARIO("gloo_reset_mid_collective") {
  Ranks ranks;
  const FailingRank failing = failing_rank(ranks.store, ranks.rank);
  ranks.group.barrier()->wait();
  if (ranks.rank == 1) {
    const std::vector<Connection> connections = gloo_connections();
    expect(connections.size() == 1, "rank 1 has ", connections.size(), " gloo connections; expected 1");
    const linger abortive{.l_onoff = 1, .l_linger = 0};
    expect(::setsockopt(connections[0].fd, SOL_SOCKET, SO_LINGER, &abortive, sizeof(abortive)) == 0,
           "SO_LINGER failed");
    ranks.store->wait({"test/waiting"}, 60s);
    std::this_thread::sleep_for(200ms);
    ::raise(SIGKILL);
  }
  Tensor tensor = Tensor::ones({1000}, DType::f32);
  WorkHandle work = ranks.group.all_reduce(tensor);
  ranks.store->set("test/waiting", "1");
  expect_names_peer(error_of([&] { work->wait(); }), failing, {"reset the connection"});
}

// Rank 1 is killed between two collectives; rank 0 starts the next one only
// after the process is gone, and that collective's error names rank 1.
LOOM_DIST_SCENARIO("gloo_killed_before_next_collective") {
  Ranks ranks;
  const FailingRank failing = failing_rank(ranks.store, ranks.rank);
  ranks.group.barrier()->wait();
  if (ranks.rank == 1) ::raise(SIGKILL);
  wait_until_ended(failing.pid);
  std::this_thread::sleep_for(100ms);  // gloo's event loop has seen the closed connection, usually; either way is fine
  Tensor tensor = Tensor::ones({10}, DType::f32);
  const std::string message = error_of([&] { ranks.group.all_reduce(tensor)->wait(); });
  expect_names_peer(message, failing, {"closed the connection", "reset the connection"});
  expect(contains(message, "that process has ended"), "the error does not say rank 1's process ended: ", message);
}

// Rank 1 is alive and connected but never enters the collective: rank 0's
// gloo times out with no address in its message; the error still names rank 1.
LOOM_DIST_SCENARIO("gloo_peer_never_enters") {
  Ranks ranks;
  const FailingRank failing = failing_rank(ranks.store, ranks.rank);
  ranks.group.barrier()->wait();
  if (ranks.rank == 1) {
    ranks.store->wait({"test/done"}, 120s);  // alive until rank 0 has its error
    return;
  }
  ranks.group.set_timeout(2s);
  Tensor tensor = Tensor::ones({10}, DType::f32);
  const std::string message = error_of([&] { ranks.group.all_reduce(tensor)->wait(); });
  ranks.store->set("test/done", "1");
  expect_names_peer(message, failing, {"did not answer within the timeout"});
  expect(contains(message, "timeout 2 s"), "the error does not give the timeout: ", message);
  expect(!contains(message, "has ended"), "rank 1 is alive, yet the error says it ended: ", message);
}

// Three ranks; rank 2 is killed while ranks 0 and 1 wait in an all_reduce.
// Each survivor's error names rank 2: by the address gloo shows when its own
// connection to rank 2 fails, or, when it was waiting on the other survivor
// and timed out (gloo's message then has no address and there are two
// peers), as the rank whose process ended.
LOOM_DIST_SCENARIO("gloo_killed_in_world_of_three") {
  Ranks ranks;
  const FailingRank failing = failing_rank(ranks.store, ranks.rank, 2);
  ranks.group.set_timeout(5s);
  ranks.group.barrier()->wait();
  if (ranks.rank == 2) {
    ranks.store->wait({"test/waiting/0", "test/waiting/1"}, 60s);
    std::this_thread::sleep_for(200ms);
    ::raise(SIGKILL);
  }
  Tensor tensor = Tensor::ones({1000}, DType::f32);
  WorkHandle work = ranks.group.all_reduce(tensor);
  ranks.store->set(str("test/waiting/", ranks.rank), "1");
  expect_names_peer(error_of([&] { work->wait(); }), failing,
                    {"closed the connection", "reset the connection", "did not answer within the timeout"});
}

// A store that kills this process right after `key` is set through it.
class KilledAfterSet final : public Store {
 public:
  KilledAfterSet(std::shared_ptr<Store> inner, std::string key) : inner_(std::move(inner)), key_(std::move(key)) {}
  int64_t add(const std::string& key, int64_t delta) override { return inner_->add(key, delta); }
  bool check(const std::vector<std::string>& keys) override { return inner_->check(keys); }

 private:
  void do_set(const std::string& key, const Bytes& value) override {
    inner_->set(key, value);
    if (key == key_) ::raise(SIGKILL);
  }
  Bytes do_get(const std::string& key, Milliseconds timeout) override { return inner_->get(key, timeout); }
  void do_wait(const std::vector<std::string>& keys, Milliseconds timeout) override { inner_->wait(keys, timeout); }

  std::shared_ptr<Store> inner_;
  std::string key_;
};

// Rank 1 is killed after it published where it listens for rank 0 and
// before it connects. Rank 0, connecting, finds nothing listening there
// (refused), or had connected into rank 1's listen backlog just before it died
// (reset); on the side that listens, it never sees rank 1 connect (a
// timeout). Which side rank 0 takes depends on the ports; all must name rank 1.
LOOM_DIST_SCENARIO("gloo_killed_while_connecting") {
  const int rank = env_int("RANK");
  auto store = std::make_shared<TCPStore>("127.0.0.1", env_int("MASTER_PORT"),
                                          TCPStoreOptions().is_server(rank == 0).timeout(60s));
  const FailingRank failing = failing_rank(store, rank);  // rank 1 is up: rank 0's 3 s are for connecting only
  if (rank == 1) {
    ProcessGroupGloo group(std::make_shared<KilledAfterSet>(store, "gloo/listening/1/0"), 1, 2,
                           GlooOptions().timeout(kGenerousTimeout));
    throw Error("rank 1 was not killed while it connected");
  }
  const std::string message = error_of([&] { ProcessGroupGloo group(store, 0, 2, GlooOptions().timeout(3s)); });
  expect_names_peer(message, failing,
                    {"refused the connection (nothing listens at its address)", "reset the connection",
                     "did not answer within the timeout"},
                    "connect #0");
}

// Three ranks from init_process_group; rank 2 is alive but never enters the
// all_reduce. Gloo's timeout names no address and there are two peers, so the
// gloo layer cannot tell which one; the desync report every group from
// init_process_group appends names rank 2 on both survivors.
LOOM_DIST_SCENARIO("gloo_never_enters_in_world_of_three") {
  auto group = group_from_environment(60s);
  // The group's store, rank 0 serves it.
  TCPStore side_channel("127.0.0.1", env_int("MASTER_PORT"), TCPStoreOptions().timeout(60s));
  group->barrier()->wait();
  if (group->rank() == 2) {
    side_channel.wait({"test/done/0", "test/done/1"}, 120s);  // alive until both have their error
    return;
  }
  group->set_timeout(3s);
  Tensor tensor = Tensor::ones({10}, DType::f32);
  const std::string message = error_of([&] { group->all_reduce(tensor)->wait(); });
  side_channel.set(str("test/done/", group->rank()), "1");
  // Rank 0 serves the store, which rank 1's desync report reads: it leaves last.
  if (group->rank() == 0) side_channel.wait({"test/done/1"}, 120s);
  std::cout << "rank " << group->rank() << "'s error: " << message << "\n";
  expect(contains(message, "Behind: rank 2 has not reached #"), "the error does not name rank 2 as behind: ", message);
}

// Three ranks; rank 2 shuts its gloo connections down (as a dying process's
// kernel would) but stays alive. No process has ended and there are two
// peers, so only the address gloo shows can name rank 2: whichever side of
// each connection the survivor is (gloo shows the address rank 2 listened on
// when the survivor accepted, its end of the connection when the survivor
// connected), the error must name rank 2.
LOOM_DIST_SCENARIO("gloo_closed_by_live_peer_in_world_of_three") {
  Ranks ranks;
  const FailingRank failing = failing_rank(ranks.store, ranks.rank, 2);
  ranks.group.barrier()->wait();
  if (ranks.rank == 2) {
    ranks.store->wait({"test/waiting/0", "test/waiting/1"}, 60s);
    std::this_thread::sleep_for(200ms);
    for (const Connection& connection : gloo_connections()) ::shutdown(connection.fd, SHUT_RDWR);
    ranks.store->wait({"test/done/0", "test/done/1"}, 120s);
    return;
  }
  Tensor tensor = Tensor::ones({1000}, DType::f32);
  WorkHandle work = ranks.group.all_reduce(tensor);
  ranks.store->set(str("test/waiting/", ranks.rank), "1");
  const std::string message = error_of([&] { work->wait(); });
  ranks.store->set(str("test/done/", ranks.rank), "1");
  if (ranks.rank == 0) ranks.store->wait({"test/done/1"}, 120s);  // rank 0 serves the store: it leaves last
  expect_names_peer(message, failing, {"closed the connection", "reset the connection"});
  expect(!contains(message, "has ended"), "rank 2 is alive, yet the error says it ended: ", message);
}

void expect_rank_0_ok_rank_1_killed(const std::vector<RankResult>& results) {
  CHECK_MESSAGE(results[0].ok(), results[0].describe());
  CHECK_MESSAGE(results[1].signal == SIGKILL, results[1].describe());
  MESSAGE(results[0].output);
}

}  // namespace

TEST_SUITE("gloo_failures") {
  TEST_CASE("in a world of three, a killed peer is named by both survivors") {
    auto results = spawn_ranks("gloo_killed_in_world_of_three", 3, {.deadline = 90s});
    CHECK_MESSAGE(results[0].ok(), results[0].describe());
    CHECK_MESSAGE(results[1].ok(), results[1].describe());
    CHECK_MESSAGE(results[2].signal == SIGKILL, results[2].describe());
    MESSAGE(results[0].output);
    MESSAGE(results[1].output);
  }

  TEST_CASE("a peer killed while the collective waits is named (connection closed or reset)") {
    expect_rank_0_ok_rank_1_killed(spawn_ranks("gloo_killed_mid_collective", 2, {.deadline = 90s}));
  }

  TEST_CASE("a peer whose connection is reset is named") {
    expect_rank_0_ok_rank_1_killed(spawn_ranks("gloo_reset_mid_collective", 2, {.deadline = 90s}));
  }

  TEST_CASE("a peer killed before the next collective is named by that collective's error") {
    expect_rank_0_ok_rank_1_killed(spawn_ranks("gloo_killed_before_next_collective", 2, {.deadline = 90s}));
  }

  TEST_CASE("a peer killed while the mesh connects is named (connection refused or reset, or a timeout)") {
    expect_rank_0_ok_rank_1_killed(spawn_ranks("gloo_killed_while_connecting", 2, {.deadline = 90s}));
  }

  TEST_CASE("in a world of three, a live peer that closes its connections is named by its address") {
    auto results = spawn_ranks("gloo_closed_by_live_peer_in_world_of_three", 3, {.deadline = 90s});
    expect_all_ok(results);
    MESSAGE(results[0].output);
    MESSAGE(results[1].output);
  }

  TEST_CASE("in a world of three, a live peer that never enters is named by the desync report") {
    auto results = spawn_ranks("gloo_never_enters_in_world_of_three", 3, {.deadline = 90s});
    expect_all_ok(results);
    MESSAGE(results[0].output);
    MESSAGE(results[1].output);
  }

  TEST_CASE("a live peer that never enters the collective is named at the timeout") {
    auto results = spawn_ranks("gloo_peer_never_enters", 2, {.deadline = 90s});
    expect_all_ok(results);
    MESSAGE(results[0].output);
  }
}
