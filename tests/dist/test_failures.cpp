// A gloo peer that fails must be named by rank in the survivor's error, on
// every path gloo's TCP transport can take: the peer's process killed while
// the survivor waits (gloo sees the connection closed, or reset), its sockets
// closed abortively (reset), killed before the next collective starts, or
// alive but never entering the collective (a timeout, with no address in
// gloo's message). Two real processes on loopback; rank 1 is the one that
// fails, rank 0 (which hosts the store) checks its error. Deadlines are
// generous so that a busy machine changes nothing but the time taken.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
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
      "127.0.0.1", env_int("MASTER_PORT"), TCPStoreOptions{.is_server = rank == 0, .timeout = 60s});
  ProcessGroupGloo group{store, rank, env_int("WORLD_SIZE"), {.timeout = kGenerousTimeout}};
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

// The far end of each of this process's TCP connections, except the one to the store.
std::vector<int> gloo_sockets() {
  const int store_port = env_int("MASTER_PORT");
  std::vector<int> found;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::stoi(entry.path().filename().string());
    int type = 0;
    socklen_t length = sizeof(type);
    if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &length) != 0 || type != SOCK_STREAM) continue;
    sockaddr_storage peer{};
    socklen_t peer_length = sizeof(peer);
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_length) != 0) continue;  // a listener
    const int port = peer.ss_family == AF_INET ? ntohs(reinterpret_cast<sockaddr_in*>(&peer)->sin_port)
                                               : ntohs(reinterpret_cast<sockaddr_in6*>(&peer)->sin6_port);
    if (port != store_port) found.push_back(fd);
  }
  return found;
}

// This rank's error must name rank `failed` by rank, pid and the address of
// its end of the connection, say what happened (one of `events`), and end
// with gloo's own message.
void expect_names_peer(const std::string& message, int failed, int pid, const std::vector<std::string>& events) {
  const std::string self = str("rank ", env_int("RANK"), " of ", env_int("WORLD_SIZE"));
  std::cout << self << "'s error: " << message << "\n";
  expect(contains(message, str("ProcessGroupGloo ", self, ": peer rank ", failed, " (pid ", pid, " on ")),
         "the error does not name rank ", failed, " and its pid first: ", message);
  expect(contains(message, "all_reduce #"), "the error does not name the collective: ", message);
  expect(contains(message, "(Gloo: "), "the error does not quote gloo: ", message);
  bool said = false;
  for (const auto& event : events) said = said || contains(message, ") " + event + " during all_reduce #");
  expect(said, "the error does not say rank ", failed, " ", events[0], events.size() > 1 ? " (or " + events[1] + ")" : "",
         " during the all_reduce: ", message);
  // When gloo names the far end of the connection ("[127.0.0.1]:36743"), loom
  // names the same address, read from its own table of every connection's far end.
  static const std::regex gloo_address(R"(\[([0-9a-f:.]+)\]:([0-9]+))");
  std::smatch shown;
  const std::string gloo_part = message.substr(message.find("(Gloo: "));
  if (std::regex_search(gloo_part, shown, gloo_address)) {
    const std::string address = shown[1].str() + ":" + shown[2].str();
    expect(contains(message, "on " + hostname() + ", " + address + ") "),
           "gloo names rank ", failed, "'s end of the connection as ", address, " but loom's error does not: ", message);
  }
}

// The pid of rank `failing`, which it publishes.
int pid_of(Ranks& ranks, int failing = 1) {
  if (ranks.rank == failing) ranks.store->set("test/pid", std::to_string(::getpid()));
  return std::stoi(ranks.store->get_string("test/pid", 60s));
}

// Rank 0 waits in an all_reduce when rank 1 is killed: gloo sees the
// connection closed (or reset, when rank 1 had not read all rank 0 sent).
LOOM_DIST_SCENARIO("gloo_killed_mid_collective") {
  Ranks ranks;
  const int pid = pid_of(ranks);
  ranks.group.barrier()->wait();
  if (ranks.rank == 1) {
    ranks.store->wait({"test/waiting"}, 60s);
    std::this_thread::sleep_for(200ms);  // rank 0 is inside its all_reduce by now (if not, it finds the pair closed)
    ::raise(SIGKILL);
  }
  Tensor tensor = Tensor::ones({1000}, DType::f32);
  WorkHandle work = ranks.group.all_reduce(tensor);
  ranks.store->set("test/waiting", "1");
  expect_names_peer(error_of([&] { work->wait(); }), 1, pid, {"closed the connection", "reset the connection"});
}

// Rank 1 makes every gloo socket close abortively (SO_LINGER 0) and is
// killed: its kernel sends a reset, never a FIN, so rank 0 reads ECONNRESET.
LOOM_DIST_SCENARIO("gloo_reset_mid_collective") {
  Ranks ranks;
  const int pid = pid_of(ranks);
  ranks.group.barrier()->wait();
  if (ranks.rank == 1) {
    const std::vector<int> sockets = gloo_sockets();
    expect(sockets.size() == 1, "rank 1 has ", sockets.size(), " gloo connections; expected 1");
    const linger abortive{.l_onoff = 1, .l_linger = 0};
    expect(::setsockopt(sockets[0], SOL_SOCKET, SO_LINGER, &abortive, sizeof(abortive)) == 0, "SO_LINGER failed");
    ranks.store->wait({"test/waiting"}, 60s);
    std::this_thread::sleep_for(200ms);
    ::raise(SIGKILL);
  }
  Tensor tensor = Tensor::ones({1000}, DType::f32);
  WorkHandle work = ranks.group.all_reduce(tensor);
  ranks.store->set("test/waiting", "1");
  expect_names_peer(error_of([&] { work->wait(); }), 1, pid, {"reset the connection"});
}

// Rank 1 is killed between two collectives; rank 0 starts the next one only
// after the process is gone, and that collective's error names rank 1.
LOOM_DIST_SCENARIO("gloo_killed_before_next_collective") {
  Ranks ranks;
  const int pid = pid_of(ranks);
  ranks.group.barrier()->wait();
  if (ranks.rank == 1) ::raise(SIGKILL);
  wait_until_ended(pid);
  std::this_thread::sleep_for(100ms);  // gloo's event loop has seen the closed connection, usually; either way is fine
  Tensor tensor = Tensor::ones({10}, DType::f32);
  const std::string message = error_of([&] { ranks.group.all_reduce(tensor)->wait(); });
  expect_names_peer(message, 1, pid, {"closed the connection", "reset the connection"});
  expect(contains(message, "that process has ended"), "the error does not say rank 1's process ended: ", message);
}

// Rank 1 is alive and connected but never enters the collective: rank 0's
// gloo times out with no address in its message; the error still names rank 1.
LOOM_DIST_SCENARIO("gloo_peer_never_enters") {
  Ranks ranks;
  const int pid = pid_of(ranks);
  ranks.group.barrier()->wait();
  if (ranks.rank == 1) {
    ranks.store->wait({"test/done"}, 120s);  // alive until rank 0 has its error
    return;
  }
  ranks.group.set_timeout(2s);
  Tensor tensor = Tensor::ones({10}, DType::f32);
  const std::string message = error_of([&] { ranks.group.all_reduce(tensor)->wait(); });
  ranks.store->set("test/done", "1");
  expect_names_peer(message, 1, pid, {"did not answer within the timeout"});
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
  const int pid = pid_of(ranks, 2);
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
  expect_names_peer(error_of([&] { work->wait(); }), 2, pid,
                    {"closed the connection", "reset the connection", "did not answer within the timeout"});
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
    MESSAGE(results[0].output, results[1].output);
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

  TEST_CASE("a live peer that never enters the collective is named at the timeout") {
    auto results = spawn_ranks("gloo_peer_never_enters", 2, {.deadline = 90s});
    expect_all_ok(results);
    MESSAGE(results[0].output);
  }
}
