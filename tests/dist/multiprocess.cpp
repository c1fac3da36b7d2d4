// Multi-process test harness (see multiprocess.h).
#include "tests/dist/multiprocess.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <loom/dist/process_group_gloo.h>
#include <loom/dist/store.h>

extern char** environ;

namespace loom::dist::testing {

namespace {

std::map<std::string, Scenario>& registry() {
  static std::map<std::string, Scenario> scenarios;
  return scenarios;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

ScenarioRegistration::ScenarioRegistration(const std::string& name, Scenario scenario) {
  registry()[name] = std::move(scenario);
}

int run_scenario_if_requested(int argc, char** argv) {
  if (argc < 3 || std::string(argv[1]) != "--loom-dist-scenario") return -1;
  std::string name = argv[2];
  auto it = registry().find(name);
  if (it == registry().end()) {
    std::cerr << "unknown scenario '" << name << "'\n";
    return 2;
  }
  try {
    it->second();
  } catch (const std::exception& error) {
    const char* rank = std::getenv("RANK");
    std::cerr << "scenario '" << name << "' failed on rank " << (rank ? rank : "?") << ": " << error.what() << "\n";
    return 1;
  }
  return 0;
}

std::string RankResult::describe() const {
  std::string state = timed_out ? "timed out (killed by the harness)"
                      : signal  ? str("killed by signal ", signal)
                                : str("exited with ", exit_code);
  return str("rank ", rank, " ", state, " after ", seconds, " s; output:\n", output);
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    ::close(fd);
    throw Error("free_port: bind failed");
  }
  socklen_t length = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

namespace {

// A sanitized build runs several times slower: its tests get
// LOOM_TEST_TIMEOUT_SCALE (tests/CMakeLists.txt), which stretches the
// harness's deadlines as CTest's timeouts are stretched.
std::chrono::milliseconds scaled_deadline(std::chrono::milliseconds deadline) {
  const char* scale = std::getenv("LOOM_TEST_TIMEOUT_SCALE");
  const int factor = scale ? std::atoi(scale) : 1;
  return factor > 1 ? deadline * factor : deadline;
}

}  // namespace

std::vector<RankResult> spawn_ranks(const std::string& scenario, int world, const SpawnOptions& options) {
  const std::chrono::milliseconds deadline = scaled_deadline(options.deadline);
  int port = free_port();
  char exe[4096] = {};
  ssize_t length = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (length <= 0) throw Error("spawn_ranks: cannot read /proc/self/exe");

  struct Child {
    pid_t pid = -1;
    std::string output_path;
  };
  std::vector<Child> children(world);
  std::vector<RankResult> results(world);
  auto start = std::chrono::steady_clock::now();

  for (int rank = 0; rank < world; ++rank) {
    // The parent's environment minus launcher variables, plus this rank's.
    std::map<std::string, std::string> variables;
    for (char** entry = environ; *entry; ++entry) {
      std::string text = *entry;
      size_t equals = text.find('=');
      if (equals == std::string::npos) continue;
      std::string name = text.substr(0, equals);
      if (name.rfind("SLURM_", 0) == 0 || name.rfind("OMPI_", 0) == 0) continue;
      variables[name] = text.substr(equals + 1);
    }
    variables["RANK"] = std::to_string(rank);
    variables["WORLD_SIZE"] = std::to_string(world);
    variables["LOCAL_RANK"] = std::to_string(rank);
    variables["LOCAL_WORLD_SIZE"] = std::to_string(world);
    variables["MASTER_ADDR"] = "127.0.0.1";
    variables["MASTER_PORT"] = std::to_string(port);
    variables["OMP_NUM_THREADS"] = "1";  // many ranks share two cores
    for (const auto& [name, value] : options.environment) variables[name] = value;
    if (options.rank_environment)
      for (const auto& [name, value] : options.rank_environment(rank)) variables[name] = value;
    std::vector<std::string> entries;
    for (const auto& [name, value] : variables) entries.push_back(name + "=" + value);
    std::vector<char*> envp;
    for (auto& entry : entries) envp.push_back(entry.data());
    envp.push_back(nullptr);

    char output_template[] = "/tmp/loom_dist_rank_XXXXXX";
    int output_fd = ::mkstemp(output_template);
    if (output_fd < 0) throw Error("spawn_ranks: mkstemp failed");
    children[rank].output_path = output_template;

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, output_fd, STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, output_fd, STDERR_FILENO);
    std::string flag = "--loom-dist-scenario";
    std::string name = scenario;
    char* argv[] = {exe, flag.data(), name.data(), nullptr};
    int status = ::posix_spawn(&children[rank].pid, exe, &actions, nullptr, argv, envp.data());
    posix_spawn_file_actions_destroy(&actions);
    ::close(output_fd);
    if (status != 0) throw Error(str("spawn_ranks: posix_spawn failed: ", std::strerror(status)));
    results[rank].rank = rank;
  }

  int remaining = world;
  std::vector<bool> done(world, false);
  while (remaining > 0) {
    for (int rank = 0; rank < world; ++rank) {
      if (done[rank]) continue;
      int status = 0;
      pid_t finished = ::waitpid(children[rank].pid, &status, WNOHANG);
      if (finished != children[rank].pid) continue;
      done[rank] = true;
      --remaining;
      results[rank].seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (WIFEXITED(status)) results[rank].exit_code = WEXITSTATUS(status);
      if (WIFSIGNALED(status)) results[rank].signal = WTERMSIG(status);
    }
    if (remaining > 0 && std::chrono::steady_clock::now() - start > deadline) {
      for (int rank = 0; rank < world; ++rank) {
        if (done[rank]) continue;
        ::kill(children[rank].pid, SIGKILL);
        ::waitpid(children[rank].pid, nullptr, 0);
        done[rank] = true;
        results[rank].timed_out = true;
        results[rank].seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
      remaining = 0;
    }
    if (remaining > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int rank = 0; rank < world; ++rank) {
    results[rank].output = read_file(children[rank].output_path);
    ::unlink(children[rank].output_path.c_str());
  }
  return results;
}

std::shared_ptr<TCPStore> local_store() {
  using namespace std::chrono_literals;
  return std::make_shared<TCPStore>("127.0.0.1", 0, TCPStoreOptions().is_server(true).timeout(5s));
}

std::shared_ptr<ProcessGroup> world_of_one() {
  using namespace std::chrono_literals;
  return std::make_shared<ProcessGroupGloo>(local_store(), 0, 1, GlooOptions().timeout(5s));
}

std::shared_ptr<ProcessGroup> group_from_environment(std::chrono::milliseconds timeout) {
  const char* backend = std::getenv("LOOM_TEST_BACKEND");
  return init_process_group(
      InitOptions().backend(parse_backend(backend ? backend : "gloo")).init_method("env://").timeout(timeout));
}

SpawnOptions on_shm(std::chrono::milliseconds deadline, std::map<std::string, std::string> environment) {
  environment["LOOM_TEST_BACKEND"] = "shm";
  return {.deadline = deadline, .environment = std::move(environment)};
}

int env_int(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) throw Error(str("test: ", name, " is not set"));
  return std::atoi(value);
}

std::string env_string(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) throw Error(str("test: ", name, " is not set"));
  return value;
}

}  // namespace loom::dist::testing
