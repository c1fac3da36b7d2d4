// Local worker group: fork/exec one process per local rank, poll them, forward
// SIGINT / SIGTERM, end the group on the first failure, restart on request.
#include <loom/dist/launcher.h>

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include <loom/core/error.h>

extern char** environ;

namespace loom::dist {

namespace {

using Clock = std::chrono::steady_clock;

// The signal (SIGINT / SIGTERM) the launcher received, 0 for none.
volatile sig_atomic_t g_received_signal = 0;
// How many SIGINT / SIGTERM arrived: a second Ctrl-C is forwarded too, so the
// programs (which stop gracefully on the first) end at once.
volatile sig_atomic_t g_signal_count = 0;
void record_signal(int signal) {
  g_received_signal = signal;
  g_signal_count = g_signal_count + 1;
}

// Catches SIGINT and SIGTERM while the group runs (so they can be forwarded),
// restoring the previous handlers afterwards.
class SignalCatcher {
 public:
  SignalCatcher() {
    g_received_signal = 0;
    g_signal_count = 0;
    struct sigaction action {};
    action.sa_handler = record_signal;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGINT, &action, &previous_interrupt_);
    ::sigaction(SIGTERM, &action, &previous_terminate_);
  }
  ~SignalCatcher() {
    ::sigaction(SIGINT, &previous_interrupt_, nullptr);
    ::sigaction(SIGTERM, &previous_terminate_, nullptr);
  }
  SignalCatcher(const SignalCatcher&) = delete;
  SignalCatcher& operator=(const SignalCatcher&) = delete;

 private:
  struct sigaction previous_interrupt_ {};
  struct sigaction previous_terminate_ {};
};

// The executable `program` names: itself when it contains '/', else the first
// match in PATH.
std::string find_program(const std::string& program) {
  LOOM_CHECK(!program.empty(), "no program to run was given");
  if (program.find('/') != std::string::npos) {
    LOOM_CHECK(::access(program.c_str(), X_OK) == 0, "cannot run '", program, "': ", std::strerror(errno));
    return program;
  }
  const char* path = std::getenv("PATH");
  std::string directories = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t begin = 0;
  while (begin <= directories.size()) {
    size_t end = directories.find(':', begin);
    if (end == std::string::npos) end = directories.size();
    std::string directory = directories.substr(begin, end - begin);
    std::string candidate = (directory.empty() ? "." : directory) + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    begin = end + 1;
  }
  LOOM_FAIL("program '", program, "' was not found in PATH; give its path (e.g. ./", program, ")");
}

struct Worker {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
};

// fork + execve with the launcher's environment plus `variables`. The child
// leads a process group of its own (signals reach whatever it starts, e.g. a
// shell's children), gets SIGKILL when the launcher dies, and default signal
// handling.
pid_t start_process(const std::string& path, const std::vector<std::string>& command,
                    const std::map<std::string, std::string>& variables) {
  std::map<std::string, std::string> merged;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const char* equals = std::strchr(*entry, '=');
    if (equals != nullptr) merged[std::string(*entry, static_cast<size_t>(equals - *entry))] = equals + 1;
  }
  for (const auto& [name, value] : variables) merged[name] = value;
  std::vector<std::string> entries;
  for (const auto& [name, value] : merged) entries.push_back(name + "=" + value);
  std::vector<char*> envp, argv;
  for (auto& entry : entries) envp.push_back(entry.data());
  envp.push_back(nullptr);
  std::vector<std::string> arguments = command;
  for (auto& argument : arguments) argv.push_back(argument.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();

  const pid_t pid = ::fork();
  if (pid < 0) LOOM_FAIL("fork failed: ", std::strerror(errno));
  if (pid == 0) {
    // Child: async-signal-safe calls only until execve.
    struct sigaction default_action {};
    default_action.sa_handler = SIG_DFL;
    ::sigaction(SIGINT, &default_action, nullptr);
    ::sigaction(SIGTERM, &default_action, nullptr);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the launcher died before prctl
    ::execve(path.c_str(), argv.data(), envp.data());
    const char message[] = "launcher: execve failed\n";
    [[maybe_unused]] ssize_t written = ::write(STDERR_FILENO, message, sizeof(message) - 1);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here, so that no signal can be sent before the child made its group
  return pid;
}

// Signals every running process and its process group.
void signal_running(std::vector<Worker>& workers, int signal) {
  for (auto& worker : workers)
    if (worker.running) ::kill(-worker.pid, signal);
}

WorkerExit exit_of(const Worker& worker, int status) {
  WorkerExit exit;
  exit.rank = worker.rank;
  exit.local_rank = worker.local_rank;
  exit.pid = worker.pid;
  if (WIFEXITED(status)) exit.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) exit.signal = WTERMSIG(status);
  return exit;
}

struct AttemptResult {
  std::optional<WorkerExit> first_failure;
  int received_signal = 0;
};

// One start of the local group, until every process has ended.
AttemptResult run_attempt(const WorkerGroupSpec& spec, const std::string& path, int restart_count,
                          const std::string& resume_report) {
  std::vector<Worker> workers;
  try {
    for (int local = 0; local < spec.nproc_per_node; ++local) {
      Worker worker;
      worker.local_rank = local;
      worker.rank = spec.node_rank * spec.nproc_per_node + local;
      std::map<std::string, std::string> variables = worker_environment(spec, local, restart_count);
      if (!resume_report.empty()) variables["LOOM_RESUME_REPORT"] = resume_report;
      worker.pid = start_process(path, spec.command, variables);
      worker.running = true;
      workers.push_back(worker);
    }
  } catch (...) {
    signal_running(workers, SIGKILL);
    for (auto& worker : workers) ::waitpid(worker.pid, nullptr, 0);
    throw;
  }

  AttemptResult result;
  std::vector<WorkerExit> later_failures;  // seen together with the first, before the launcher ended the rest
  bool ending = false;                     // SIGTERM sent to every process
  bool killed = false;                     // SIGKILL sent after the grace period
  Clock::time_point kill_at{};
  size_t running = workers.size();
  auto end_group = [&](int signal) {
    if (ending) return;
    ending = true;
    signal_running(workers, signal);
    kill_at = Clock::now() + spec.termination_grace;
  };

  bool resume_reported = restart_count == 0 || resume_report.empty();
  int forwarded = 0;  // g_signal_count when a signal was last forwarded
  while (running > 0) {
    // A restarted program that resumes writes where it resumed from (see LOOM_RESUME_REPORT).
    if (!resume_reported) {
      if (std::FILE* report = std::fopen(resume_report.c_str(), "r")) {
        char line[512] = {};
        if (std::fgets(line, sizeof(line), report) != nullptr && std::strchr(line, '\n') != nullptr) {
          std::fprintf(stderr, "%s: restart %d: the processes resumed from %s", spec.name.c_str(), restart_count, line);
          std::fflush(stderr);
          resume_reported = true;
        }
        std::fclose(report);
      }
    }
    if (int signal = g_received_signal; signal != 0 && result.received_signal == 0) {
      result.received_signal = signal;
      std::fprintf(stderr, "%s: received %s; forwarding it to the %zu running process%s\n", spec.name.c_str(),
                   signal_name(signal).c_str(), running, running == 1 ? "" : "es");
      std::fflush(stderr);
      end_group(signal);
      forwarded = g_signal_count;
    } else if (int count = g_signal_count; result.received_signal != 0 && count > forwarded) {
      forwarded = count;
      std::fprintf(stderr, "%s: received %s again; forwarding it\n", spec.name.c_str(),
                   signal_name(g_received_signal).c_str());
      std::fflush(stderr);
      signal_running(workers, g_received_signal);
    }
    // Reap every process that ended since the last sweep; when several
    // failed in one sweep, one killed by a signal is the likelier root cause.
    std::vector<WorkerExit> ended;
    for (auto& worker : workers) {
      if (!worker.running) continue;
      int status = 0;
      if (::waitpid(worker.pid, &status, WNOHANG) != worker.pid) continue;
      worker.running = false;
      --running;
      ended.push_back(exit_of(worker, status));
    }
    std::stable_sort(ended.begin(), ended.end(),
                     [](const WorkerExit& a, const WorkerExit& b) { return (a.signal != 0) > (b.signal != 0); });
    const bool was_ending = ending;  // exits after that are the launcher's doing
    for (const WorkerExit& exit : ended) {
      if (!exit.failed() || was_ending) continue;
      if (!result.first_failure) {
        result.first_failure = exit;
        std::fprintf(stderr, "%s: %s", spec.name.c_str(), exit.describe().c_str());
        if (running > 0)
          std::fprintf(stderr, "; ending the other %zu local process%s", running, running == 1 ? "" : "es");
        std::fprintf(stderr, "\n");
        std::fflush(stderr);
        end_group(SIGTERM);
      } else {
        later_failures.push_back(exit);  // failed in the same sweep as the first
      }
    }
    if (running == 0) break;
    if (ending && !killed && Clock::now() >= kill_at) {
      std::fprintf(stderr, "%s: %zu process%s still running %.1f s after SIGTERM; sending SIGKILL\n",
                   spec.name.c_str(), running, running == 1 ? "" : "es",
                   std::chrono::duration<double>(spec.termination_grace).count());
      std::fflush(stderr);
      signal_running(workers, SIGKILL);
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (const WorkerExit& exit : later_failures)
    std::fprintf(stderr, "%s: also: %s\n", spec.name.c_str(), exit.describe().c_str());
  std::fflush(stderr);
  return result;
}

}  // namespace

std::string signal_name(int signal) {
  switch (signal) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    default: return str("signal ", signal);
  }
}

std::string WorkerExit::describe() const {
  std::string who = str("rank ", rank, " (local rank ", local_rank, ", pid ", pid, ")");
  if (signal != 0) return str(who, " was killed by signal ", signal, " (", signal_name(signal), ")");
  return str(who, " exited with code ", exit_code);
}

int WorkerGroupResult::exit_code() const {
  if (received_signal != 0) return 128 + received_signal;
  return succeeded ? 0 : 1;
}

std::map<std::string, std::string> worker_environment(const WorkerGroupSpec& spec, int local_rank,
                                                      int restart_count) {
  const int world = spec.nnodes * spec.nproc_per_node;
  const int rank = spec.node_rank * spec.nproc_per_node + local_rank;
  std::map<std::string, std::string> variables = {
      {"RANK", std::to_string(rank)},
      {"WORLD_SIZE", std::to_string(world)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(spec.nproc_per_node)},
      {"GROUP_RANK", std::to_string(spec.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(spec.nnodes)},
      {"ROLE_RANK", std::to_string(rank)},
      {"ROLE_WORLD_SIZE", std::to_string(world)},
      {"ROLE_NAME", "default"},
      {"MASTER_ADDR", spec.master_addr},
      {"MASTER_PORT", std::to_string(spec.master_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(spec.max_restarts)},
      {"TORCHELASTIC_RUN_ID", spec.run_id},
  };
  for (const auto& [name, value] : spec.environment) variables[name] = value;
  return variables;
}

WorkerGroupResult run_worker_group(const WorkerGroupSpec& spec) {
  LOOM_CHECK(!spec.command.empty(), spec.name, ": no program to run was given");
  LOOM_CHECK(spec.nproc_per_node >= 1, spec.name, ": the number of processes per node must be at least 1, got ",
             spec.nproc_per_node);
  LOOM_CHECK(spec.nnodes >= 1, spec.name, ": the number of nodes must be at least 1, got ", spec.nnodes);
  LOOM_CHECK(spec.node_rank >= 0 && spec.node_rank < spec.nnodes, spec.name, ": the node rank ", spec.node_rank,
             " must be between 0 and the number of nodes - 1 (", spec.nnodes - 1, ")");
  LOOM_CHECK(spec.master_port >= 1 && spec.master_port <= 65535, spec.name, ": the master port ", spec.master_port,
             " is out of range (1 to 65535)");
  LOOM_CHECK(!spec.master_addr.empty(), spec.name, ": the master address is empty");
  LOOM_CHECK(spec.max_restarts >= 0, spec.name, ": max_restarts must not be negative");
  const std::string path = find_program(spec.command[0]);

  // With restarts, a file where a resumed rank 0 says from which step (LOOM_RESUME_REPORT).
  std::string resume_report;
  if (spec.max_restarts > 0) {
    std::string pattern = (std::filesystem::temp_directory_path() / "loomrun-resume-XXXXXX").string();
    const int fd = ::mkstemp(pattern.data());
    if (fd >= 0) {
      ::close(fd);
      resume_report = pattern;
    }
  }
  struct RemoveReport {
    const std::string& path;
    ~RemoveReport() {
      if (!path.empty()) ::unlink(path.c_str());
    }
  } remove_report{resume_report};
  SignalCatcher signals;
  WorkerGroupResult result;
  while (true) {
    if (!resume_report.empty()) {
      if (std::FILE* report = std::fopen(resume_report.c_str(), "w")) std::fclose(report);  // empty for this attempt
    }
    AttemptResult attempt = run_attempt(spec, path, result.restarts, resume_report);
    result.first_failure = attempt.first_failure;
    result.received_signal = attempt.received_signal;
    result.succeeded = !attempt.first_failure && attempt.received_signal == 0;
    if (result.succeeded || attempt.received_signal != 0 || result.restarts >= spec.max_restarts) return result;
    ++result.restarts;
    std::fprintf(stderr, "%s: restarting the %d local process%s (restart %d of %d) after %s\n", spec.name.c_str(),
                 spec.nproc_per_node, spec.nproc_per_node == 1 ? "" : "es", result.restarts, spec.max_restarts,
                 attempt.first_failure ? attempt.first_failure->describe().c_str() : "a failure");
    std::fflush(stderr);
  }
}

}  // namespace loom::dist
