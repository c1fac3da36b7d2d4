// The local worker-group launcher (dist/launcher.h) with /bin/sh workers: the
// variables each process gets, success, the first failure named by rank with
// its exit code or signal, the others ended (SIGKILL after the grace period
// when they ignore SIGTERM), restarts, SIGTERM forwarding, and a missing program.
#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <loom/core/error.h>
#include <loom/dist/launcher.h>

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

}  // namespace

TEST_SUITE("launcher") {
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
    CHECK(variables["RANK"] == "5");
    CHECK(variables["WORLD_SIZE"] == "6");
    CHECK(variables["LOCAL_RANK"] == "2");
    CHECK(variables["LOCAL_WORLD_SIZE"] == "3");
    CHECK(variables["GROUP_RANK"] == "1");
    CHECK(variables["GROUP_WORLD_SIZE"] == "2");
    CHECK(variables["ROLE_RANK"] == "5");
    CHECK(variables["MASTER_ADDR"] == "10.1.2.3");
    CHECK(variables["MASTER_PORT"] == "29555");
    CHECK(variables["TORCHELASTIC_RESTART_COUNT"] == "1");
    CHECK(variables["TORCHELASTIC_MAX_RESTARTS"] == "4");
    CHECK(variables["TORCHELASTIC_RUN_ID"] == "job7");
    CHECK(variables["OMP_NUM_THREADS"] == "1");
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

  TEST_CASE("a missing program and a bad spec are errors") {
    WorkerGroupSpec spec;
    spec.command = {"loom-no-such-program"};
    CHECK_THROWS_WITH_AS(run_worker_group(spec), doctest::Contains("'loom-no-such-program' was not found in PATH"),
                         Error);
    spec.command = {"/bin/true"};
    spec.nnodes = 2;
    spec.node_rank = 2;
    CHECK_THROWS_WITH_AS(run_worker_group(spec), doctest::Contains("node rank 2"), Error);
  }
}
