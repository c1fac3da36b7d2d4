// The local worker-group launcher (dist/launcher.h) with /bin/sh workers: the
// variables each process gets, success, the first failure named by rank with
// its exit code or signal, the others ended (SIGKILL after the grace period
// when they ignore SIGTERM), restarts, SIGTERM forwarding, and a missing program.
#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <future>
#include <tuple>

#include <loom/core/error.h>
#include <loom/dist/elastic_rendezvous.h>
#include <loom/dist/launcher.h>
#include "tests/dist/multiprocess.h"

using namespace loom;
using namespace loom::dist;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

WorkerGroupSpec shell_group(int processes, const std::string& script) {
  WorkerGroupSpec spec;
  spec.command = {"/bin/sh", "-c", script};
  spec.nproc_per_node = processes;
  spec.termination_grace = 2s;
  spec.name = "test_launcher";
  return spec;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct TemporaryDirectory {
  fs::path path;
  TemporaryDirectory() {
    char name[] = "/tmp/loom_launcher_XXXXXX";
    path = ::mkdtemp(name);
  }
  ~TemporaryDirectory() { fs::remove_all(path); }
  std::string read(const std::string& file) const {
    std::ifstream in(path / file);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
};

// Sends this process's stdout and stderr (the launcher's terminal) to files
// while it lives.
class CapturedTerminal {
 public:
  explicit CapturedTerminal(const fs::path& directory) : out_path_(directory / "terminal.out"), err_path_(directory / "terminal.err") {
    std::fflush(stdout);
    std::fflush(stderr);
    saved_out_ = ::dup(STDOUT_FILENO);
    saved_err_ = ::dup(STDERR_FILENO);
    std::FILE* out = std::fopen(out_path_.c_str(), "w");
    std::FILE* err = std::fopen(err_path_.c_str(), "w");
    ::dup2(::fileno(out), STDOUT_FILENO);
    ::dup2(::fileno(err), STDERR_FILENO);
    std::fclose(out);
    std::fclose(err);
  }
  ~CapturedTerminal() { restore(); }
  CapturedTerminal(const CapturedTerminal&) = delete;
  CapturedTerminal& operator=(const CapturedTerminal&) = delete;
  // Ends the capture; returns what went to stdout and to stderr.
  std::pair<std::string, std::string> finish() {
    restore();
    return {read_file(out_path_), read_file(err_path_)};
  }

 private:
  static std::string read_file(const fs::path& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  void restore() {
    if (saved_out_ < 0) return;
    std::fflush(stdout);
    std::fflush(stderr);
    ::dup2(saved_out_, STDOUT_FILENO);
    ::dup2(saved_err_, STDERR_FILENO);
    ::close(saved_out_);
    ::close(saved_err_);
    saved_out_ = saved_err_ = -1;
  }
  fs::path out_path_, err_path_;
  int saved_out_ = -1, saved_err_ = -1;
};

// A worker group's result and what the launcher printed to stdout and stderr.
struct TerminalRun {
  WorkerGroupResult result;
  std::string out, err;
};

// Runs `spec` with its log files under `directory`/logs and the terminal captured.
TerminalRun run_with_logs(WorkerGroupSpec spec, const fs::path& directory) {
  spec.log_dir = (directory / "logs").string();
  CapturedTerminal terminal(directory);
  TerminalRun run{run_worker_group(spec), "", ""};
  std::tie(run.out, run.err) = terminal.finish();
  return run;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_SUITE("launcher") {
  TEST_CASE("--redirects / --tee values: one for all local ranks or LOCAL_RANK:VALUE pairs") {
    StreamsPerRank all = parse_streams("--tee", "3");
    CHECK(all.of(0) == Streams::both);
    CHECK(all.of(7) == Streams::both);
    StreamsPerRank none = parse_streams("--tee", "0");
    CHECK(!none.any());
    StreamsPerRank per_rank = parse_streams("--redirects", "0:1,2:2");
    CHECK(per_rank.of(0) == Streams::out);
    CHECK(per_rank.of(1) == Streams::none);  // not named
    CHECK(per_rank.of(2) == Streams::err);
    CHECK(per_rank.any());
    CHECK_THROWS_WITH_AS(parse_streams("--tee", "4"), doctest::Contains("--tee=4: '4' is not 0 (none), 1 (stdout)"),
                         Error);
    CHECK_THROWS_WITH_AS(parse_streams("--tee", ""), doctest::Contains("--tee="), Error);
    CHECK_THROWS_WITH_AS(parse_streams("--redirects", "0:x"), doctest::Contains("--redirects=0:x: 'x' is not 0"),
                         Error);
    CHECK_THROWS_WITH_AS(parse_streams("--redirects", "0:1,0:2"), doctest::Contains("local rank 0 is given twice"),
                         Error);
    CHECK_THROWS_WITH_AS(parse_streams("--redirects", "a:1"), doctest::Contains("'a' is not a local rank"), Error);
    CHECK_THROWS_WITH_AS(parse_streams("--redirects", "0:1,"), doctest::Contains("'' is not LOCAL_RANK:VALUE"), Error);
  }

  TEST_CASE("tee writes each stream to its file and prefixed lines to the terminal; redirects keep them off it") {
    TemporaryDirectory directory;
    // An unfinished last line, and a burst larger than a pipe's buffer.
    auto spec = shell_group(2, "echo out $RANK; echo err $RANK >&2; head -c 100000 /dev/zero | tr '\\0' x; "
                               "echo; printf 'tail %s' $RANK");
    const std::string burst(100000, 'x');
    spec.tee = parse_streams("--tee", "3");
    const auto [result, out, err] = run_with_logs(spec, directory.path);
    CHECK(result.succeeded);
    for (int rank = 0; rank < 2; ++rank) {
      const std::string attempt = str("logs/attempt_0/", rank, "/");
      CHECK(directory.read(attempt + "stdout.log") == str("out ", rank, "\n", burst, "\ntail ", rank));
      CHECK(directory.read(attempt + "stderr.log") == str("err ", rank, "\n"));
      CHECK(contains(out, str("[rank ", rank, "]:out ", rank, "\n")));
      CHECK(contains(out, str("[rank ", rank, "]:", burst, "\n")));
      CHECK(contains(out, str("[rank ", rank, "]:tail ", rank, "\n")));  // ended by the launcher
      CHECK(contains(err, str("[rank ", rank, "]:err ", rank, "\n")));
      CHECK(!contains(out, str("err ", rank)));
    }

    // Redirected: the files only.
    TemporaryDirectory second;
    spec.tee = {};
    spec.redirects = parse_streams("--redirects", "3");
    const TerminalRun quiet = run_with_logs(spec, second.path);
    CHECK(quiet.result.succeeded);
    CHECK(second.read("logs/attempt_0/1/stdout.log") == str("out 1\n", burst, "\ntail 1"));
    CHECK(second.read("logs/attempt_0/1/stderr.log") == "err 1\n");
    CHECK(!contains(quiet.out, "out 0"));
    CHECK(!contains(quiet.out, "tail 1"));
    CHECK(!contains(quiet.err, "err 1"));
  }

  TEST_CASE("per-rank --redirects / --tee and --local_ranks_filter") {
    TemporaryDirectory directory;
    auto spec = shell_group(3, "echo out $RANK; echo err $RANK >&2");
    spec.redirects = parse_streams("--redirects", "0:3");  // rank 0: files only
    spec.tee = parse_streams("--tee", "1:1,2:3");          // rank 1: stdout teed, stderr its own; rank 2: both teed
    spec.console_local_ranks = {0, 1};                     // rank 2's lines stay off the terminal
    const auto [result, out, err] = run_with_logs(spec, directory.path);
    CHECK(result.succeeded);
    CHECK(directory.read("logs/attempt_0/0/stdout.log") == "out 0\n");
    CHECK(directory.read("logs/attempt_0/0/stderr.log") == "err 0\n");
    CHECK(directory.read("logs/attempt_0/1/stdout.log") == "out 1\n");
    CHECK(!fs::exists(directory.path / "logs/attempt_0/1/stderr.log"));
    CHECK(directory.read("logs/attempt_0/2/stdout.log") == "out 2\n");
    CHECK(directory.read("logs/attempt_0/2/stderr.log") == "err 2\n");
    CHECK(!contains(out, "out 0"));
    CHECK(!contains(err, "err 0"));
    CHECK(contains(out, "[rank 1]:out 1\n"));
    CHECK(contains(err, "err 1\n"));
    CHECK(!contains(err, "[rank 1]:err 1"));  // not teed: written by the process itself
    CHECK(!contains(out, "out 2"));
    CHECK(!contains(err, "err 2"));
  }

  TEST_CASE("each restart writes a new attempt directory") {
    TemporaryDirectory directory;
    auto spec = shell_group(2, "echo attempt $TORCHELASTIC_RESTART_COUNT rank $RANK; "
                               "[ $TORCHELASTIC_RESTART_COUNT -ge 1 ] || [ $RANK = 0 ] || exit 4");
    spec.max_restarts = 2;
    spec.redirects = parse_streams("--redirects", "1");
    const auto [result, out, err] = run_with_logs(spec, directory.path);
    CHECK(result.succeeded);
    CHECK(result.restarts == 1);
    CHECK(contains(err, "rank 1 (local rank 1, pid "));  // the failure is still reported
    CHECK(contains(err, "restarting the 2 local processes (restart 1 of 2)"));
    CHECK(directory.read("logs/attempt_0/1/stdout.log") == "attempt 0 rank 1\n");
    CHECK(directory.read("logs/attempt_1/0/stdout.log") == "attempt 1 rank 0\n");
    CHECK(directory.read("logs/attempt_1/1/stdout.log") == "attempt 1 rank 1\n");
    CHECK(!fs::exists(directory.path / "logs/attempt_2"));
  }

  TEST_CASE("every process gets torchrun's variables") {
    WorkerGroupSpec spec;
    spec.nproc_per_node = 3;
    spec.nnodes = 2;
    spec.node_rank = 1;
    spec.master_addr = "10.1.2.3";
    spec.master_port = 29555;
    spec.max_restarts = 4;
    spec.run_id = "job7";
    spec.environment = {{"OMP_NUM_THREADS", "1"}};
    auto variables = worker_environment(spec, 2, 1);
    const std::pair<const char*, const char*> expected[] = {
        {"RANK", "5"}, {"WORLD_SIZE", "6"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "3"},
        {"GROUP_RANK", "1"}, {"GROUP_WORLD_SIZE", "2"}, {"ROLE_RANK", "5"},
        {"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "29555"},
        {"TORCHELASTIC_RESTART_COUNT", "1"}, {"TORCHELASTIC_MAX_RESTARTS", "4"}, {"TORCHELASTIC_RUN_ID", "job7"},
        {"OMP_NUM_THREADS", "1"}};
    for (const auto& variable : expected) CHECK_MESSAGE(variables[variable.first] == variable.second, variable.first);
  }

  TEST_CASE("a successful group: each process sees its own rank") {
    TemporaryDirectory directory;
    auto spec = shell_group(3, "echo $RANK $WORLD_SIZE $LOCAL_RANK $GROUP_RANK $MASTER_ADDR:$MASTER_PORT > " +
                                   directory.path.string() + "/$RANK");
    spec.nnodes = 2;
    spec.node_rank = 1;
    WorkerGroupResult result = run_worker_group(spec);
    CHECK(result.succeeded);
    CHECK(result.exit_code() == 0);
    CHECK(!result.first_failure);
    for (int local = 0; local < 3; ++local) {
      const int rank = 3 + local;
      CHECK(directory.read(std::to_string(rank)) == str(rank, " 6 ", local, " 1 127.0.0.1:29500\n"));
    }
  }

  TEST_CASE("a failed process is named with its exit code and the others are ended") {
    auto start = std::chrono::steady_clock::now();
    WorkerGroupResult result = run_worker_group(shell_group(3, "if [ $RANK = 1 ]; then exit 7; fi; sleep 30"));
    CHECK(seconds_since(start) < 10);
    CHECK(!result.succeeded);
    CHECK(result.exit_code() == 1);
    REQUIRE(result.first_failure);
    CHECK(result.first_failure->rank == 1);
    CHECK(result.first_failure->exit_code == 7);
    CHECK(result.first_failure->describe().find("rank 1 (local rank 1, pid ") == 0);
    CHECK(result.first_failure->describe().find("exited with code 7") != std::string::npos);
  }

  TEST_CASE("a process killed by a signal is named with the signal") {
    WorkerGroupResult result = run_worker_group(shell_group(2, "if [ $RANK = 0 ]; then kill -9 $$; fi; sleep 30"));
    REQUIRE(result.first_failure);
    CHECK(result.first_failure->rank == 0);
    CHECK(result.first_failure->signal == SIGKILL);
    CHECK(result.first_failure->describe().find("was killed by signal 9 (SIGKILL)") != std::string::npos);
  }

  TEST_CASE("a process that ignores SIGTERM gets SIGKILL after the grace period") {
    TemporaryDirectory directory;
    const std::string marker = directory.path.string() + "/trapped";
    // Rank 1 fails once rank 0 ignores SIGTERM.
    auto spec = shell_group(2, "if [ $RANK = 1 ]; then while [ ! -e " + marker + " ]; do sleep 0.01; done; exit 3; fi; "
                               "trap '' TERM; touch " + marker + "; while true; do sleep 0.05; done");
    spec.termination_grace = 500ms;
    auto start = std::chrono::steady_clock::now();
    WorkerGroupResult result = run_worker_group(spec);
    const double seconds = seconds_since(start);
    CHECK(seconds >= 0.5);
    CHECK(seconds < 5);
    REQUIRE(result.first_failure);
    CHECK(result.first_failure->rank == 1);
  }

  TEST_CASE("max_restarts starts the group again, with TORCHELASTIC_RESTART_COUNT") {
    auto spec = shell_group(2, "[ $TORCHELASTIC_RESTART_COUNT -ge 2 ] || [ $RANK = 1 ] || exit 4; exit 0");
    spec.max_restarts = 3;
    WorkerGroupResult result = run_worker_group(spec);
    CHECK(result.succeeded);
    CHECK(result.restarts == 2);

    spec.max_restarts = 1;
    result = run_worker_group(spec);
    CHECK(!result.succeeded);
    CHECK(result.restarts == 1);
    REQUIRE(result.first_failure);
    CHECK(result.first_failure->exit_code == 4);
  }

  TEST_CASE("SIGTERM to the launcher is forwarded to every process, without restarts") {
    TemporaryDirectory directory;
    const std::string dir = directory.path.string();
    auto spec = shell_group(2, "trap 'echo $RANK > " + dir + "/$RANK; exit 0' TERM; touch " + dir +
                                   "/ready$RANK; while true; do sleep 0.05; done");
    spec.max_restarts = 2;
    std::thread sender([&] {
      // Once both processes handle SIGTERM.
      for (int i = 0; i < 2000 && !(fs::exists(dir + "/ready0") && fs::exists(dir + "/ready1")); ++i)
        std::this_thread::sleep_for(10ms);
      ::kill(::getpid(), SIGTERM);
    });
    WorkerGroupResult result = run_worker_group(spec);
    sender.join();
    CHECK(result.received_signal == SIGTERM);
    CHECK(result.exit_code() == 128 + SIGTERM);
    CHECK(result.restarts == 0);
    CHECK(directory.read("0") == "0\n");
    CHECK(directory.read("1") == "1\n");
  }

  TEST_CASE("elastic: a failure while a node waits starts a new round, not a restart") {
    // Another node's launcher saw the newcomer first and stopped its
    // processes, which stops this node's too (exit 143): with max_restarts 0
    // this launcher must go on to the next round rather than give up.
    TemporaryDirectory directory;
    const std::string stopped = directory.path.string() + "/stopped";
    auto spec = shell_group(2, "if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then touch " + stopped +
                                   "; exit 143; fi; exit 0");
    std::vector<int> rounds;
    spec.rendezvous = [&](WorkerGroupSpec&, int after_round) {
      rounds.push_back(after_round + 1);
      return after_round + 1;
    };
    spec.node_waiting = [&](int round) { return round == 0 && fs::exists(stopped); };
    WorkerGroupResult result = run_worker_group(spec);
    CHECK(result.succeeded);
    CHECK(result.restarts == 0);
    CHECK(rounds == std::vector<int>{0, 1});
    // Without a waiting node the same failure is one, as before.
    fs::remove(stopped);
    spec.node_waiting = [](int) { return false; };
    rounds.clear();
    result = run_worker_group(spec);
    CHECK_FALSE(result.succeeded);
    REQUIRE(result.first_failure);
    CHECK(result.first_failure->exit_code == 143);
    CHECK(rounds == std::vector<int>{0});
  }

  TEST_CASE("a missing program and a bad spec are errors") {
    WorkerGroupSpec spec;
    spec.command = {"loom-no-such-program"};
    CHECK_THROWS_WITH_AS(run_worker_group(spec), doctest::Contains("'loom-no-such-program' was not found in PATH"),
                         Error);
    spec.command = {"/bin/true"};
    spec.nnodes = 2;
    spec.node_rank = 2;
    CHECK_THROWS_WITH_AS(run_worker_group(spec), doctest::Contains("node rank 2"), Error);
    spec.node_rank = 0;
    spec.tee.all = Streams::both;
    CHECK_THROWS_WITH_AS(run_worker_group(spec), doctest::Contains("needs a log directory"), Error);
    spec.log_dir = "/proc/loom-no-such-directory";
    CHECK_THROWS_WITH_AS(run_worker_group(spec), doctest::Contains("cannot create the log directory /proc/"), Error);
  }

  TEST_CASE("elastic rendezvous: rounds close at MAX nodes or after the last call; a later node waits for the next") {
    const int port = testing::free_port();
    auto options = ElasticRendezvousOptions().min_nodes(1).max_nodes(2).last_call(std::chrono::seconds(20));
    ElasticRendezvous host("127.0.0.1", port, options);  // binds the endpoint: hosts the store
    ElasticRendezvous other("127.0.0.1", port, options);  // the endpoint is taken: joins as a client
    // Two nodes: the round closes as soon as MAX joined, long before the last call.
    auto first = std::async(std::launch::async, [&] { return host.join(); });
    const RendezvousRound second = other.join();
    const RendezvousRound round0 = first.get();
    CHECK(round0.round == 0);
    CHECK(second.round == 0);
    CHECK(round0.nodes == 2);
    CHECK(second.nodes == 2);
    CHECK(round0.node_rank + second.node_rank == 1);  // ranks 0 and 1 in join order
    CHECK_FALSE(host.node_waiting(0));
    // A node that comes while round 0 runs with MAX nodes is parked in round
    // 1: nobody is told it waits (round 0 goes on), and round 1 does not
    // close while round 0's launchers are in it, however short its last call.
    ElasticRendezvous late("127.0.0.1", port, ElasticRendezvousOptions().min_nodes(1).max_nodes(2).last_call(
                                                   std::chrono::seconds(1)));
    auto joining = std::async(std::launch::async, [&] { return late.join(); });
    bool seen_waiting = false;
    for (int i = 0; i < 20; ++i) {  // 2 s: past late's last call; the polls are host's and other's heartbeats
      seen_waiting = seen_waiting || host.node_waiting(0) || other.node_waiting(0);
      std::this_thread::sleep_for(100ms);
    }
    CHECK_FALSE(seen_waiting);
    CHECK(joining.wait_for(0ms) == std::future_status::timeout);
    // Round 0's launchers leave it (their processes ended): round 1 closes
    // after the last call, with the parked node only.
    host.leave();
    other.leave();
    const RendezvousRound round1 = joining.get();
    CHECK(round1.round == 1);
    CHECK(round1.nodes == 1);
    CHECK(round1.node_rank == 0);
    // A node that comes while round 1 runs with 1 of 2 nodes is seen waiting;
    // round 2 closes once round 1's launcher joined it (MAX: no last call).
    auto newcomer = std::async(std::launch::async, [&] { return host.join(1); });
    seen_waiting = false;
    for (int i = 0; i < 2000 && !seen_waiting; ++i) {
      seen_waiting = late.node_waiting(1);
      if (!seen_waiting) std::this_thread::sleep_for(1ms);
    }
    CHECK(seen_waiting);
    CHECK(newcomer.wait_for(1500ms) == std::future_status::timeout);  // round 1's launcher is still in it
    const RendezvousRound round2 = late.join(1);
    const RendezvousRound newcomer_round = newcomer.get();
    CHECK(round2.round == 2);
    CHECK(newcomer_round.round == 2);
    CHECK(round2.nodes == 2);
    CHECK(round2.node_rank + newcomer_round.node_rank == 1);
    CHECK_FALSE(late.node_waiting(2));  // round 3: nobody
    // Round 2's launchers fall silent (dead, say): a node parked in round 3
    // stops waiting for them after the heartbeat timeout.
    ElasticRendezvous fourth("127.0.0.1", port, ElasticRendezvousOptions().min_nodes(1).max_nodes(2).last_call(
                                                    100ms).heartbeat_timeout(300ms));
    const RendezvousRound round3 = fourth.join(2);
    CHECK(round3.round == 3);
    CHECK(round3.nodes == 1);
    // MIN above MAX is refused naming --nnodes.
    CHECK_THROWS_WITH_AS(ElasticRendezvous("127.0.0.1", port, ElasticRendezvousOptions().min_nodes(3).max_nodes(2)),
                         doctest::Contains("--nnodes=3:2"), loom::Error);
  }
}
