// Multi-process test harness: the test binary re-executes itself as N ranks
// (posix_spawn of /proc/self/exe with RANK / WORLD_SIZE / MASTER_ADDR /
// MASTER_PORT set), each running a named scenario; the parent collects exit
// codes and output, and kills every rank that outlives the deadline.
#pragma once

#include <doctest/doctest.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <loom/core/error.h>
#include <loom/dist/environment.h>
#include <loom/dist/process_group.h>
#include <loom/dist/store.h>

namespace loom::dist::testing {

// A scenario runs inside one rank. It reads RANK / WORLD_SIZE (and whatever
// else the test put in the environment) and throws to fail.
using Scenario = std::function<void()>;

// Registers a scenario at static-initialisation time.
struct ScenarioRegistration {
  ScenarioRegistration(const std::string& name, Scenario scenario);
};

#define LOOM_DIST_CONCAT_INNER(a, b) a##b
#define LOOM_DIST_CONCAT(a, b) LOOM_DIST_CONCAT_INNER(a, b)
// LOOM_DIST_SCENARIO("name") { ...body... }
#define LOOM_DIST_SCENARIO(name)                                                                    \
  static void LOOM_DIST_CONCAT(scenario_body_, __LINE__)();                                         \
  static ::loom::dist::testing::ScenarioRegistration LOOM_DIST_CONCAT(scenario_registration_, __LINE__)( \
      name, &LOOM_DIST_CONCAT(scenario_body_, __LINE__));                                           \
  static void LOOM_DIST_CONCAT(scenario_body_, __LINE__)()

// When argv asks for a scenario ("--loom-dist-scenario NAME"), runs it and
// returns the process exit code; otherwise returns -1.
int run_scenario_if_requested(int argc, char** argv);

struct RankResult {
  int rank = 0;
  int exit_code = -1;     // when the process exited
  int signal = 0;         // when a signal ended it
  bool timed_out = false;  // killed by the harness at the deadline
  double seconds = 0;      // wall time until it ended
  std::string output;      // stdout and stderr
  bool ok() const { return exit_code == 0 && signal == 0 && !timed_out; }
  std::string describe() const;
};

struct SpawnOptions {
  std::chrono::milliseconds deadline = std::chrono::seconds(30);
  // Extra variables for every rank, and per rank.
  std::map<std::string, std::string> environment{};
  std::function<std::map<std::string, std::string>(int rank)> rank_environment{};
};

// Runs `scenario` as `world` processes with RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT.
std::vector<RankResult> spawn_ranks(const std::string& scenario, int world, const SpawnOptions& options = {});

// A TCP port that was free a moment ago (bound to port 0, then closed).
int free_port();

// Throws loom::Error with the message unless `condition` holds.
template <class... Parts>
void expect(bool condition, const Parts&... parts) {
  if (!condition) throw ::loom::Error(::loom::str(parts...));
}

// Whether `part` occurs in `text`.
inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The message of the loom::Error that `fn` throws, or "(no error)".
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const ::loom::Error& error) {
    return error.what();
  }
  return "(no error)";
}

// The message of the loom::Error that `fn` throws, and the seconds until it
// threw (or returned).
struct TimedError {
  std::string message;
  double seconds = 0;
};
template <class Fn>
TimedError timed_error_of(Fn&& fn) {
  const auto start = std::chrono::steady_clock::now();
  std::string message = error_of(std::forward<Fn>(fn));
  return {std::move(message), std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
}

// A doctest check per rank that it exited 0, with the rank's description.
inline void expect_all_ok(const std::vector<RankResult>& results) {
  for (const auto& result : results) CHECK_MESSAGE(result.ok(), result.describe());
}

// An environment that holds exactly `values`, for the parsers that take an
// EnvironmentLookup instead of reading the process's own variables.
inline EnvironmentLookup environment_from(std::map<std::string, std::string> values) {
  return [values = std::move(values)](const std::string& name) -> std::optional<std::string> {
    auto it = values.find(name);
    if (it == values.end()) return std::nullopt;
    return it->second;
  };
}

int env_int(const char* name);
std::string env_string(const char* name);

// A TCPStore server on a free port of 127.0.0.1 (5 s timeout), for in-process tests.
std::shared_ptr<TCPStore> local_store();

// A gloo group of one rank (on a local_store()), for in-process tests.
std::shared_ptr<ProcessGroup> world_of_one();

// init_process_group over env:// on LOOM_TEST_BACKEND's backend (gloo when
// unset); spawning with LOOM_TEST_BACKEND=shm runs a scenario over shm.
std::shared_ptr<ProcessGroup> group_from_environment(std::chrono::milliseconds timeout);
// SpawnOptions that run the scenario's group_from_environment on shm.
SpawnOptions on_shm(std::chrono::milliseconds deadline = std::chrono::seconds(30),
                    std::map<std::string, std::string> environment = {});

}  // namespace loom::dist::testing
