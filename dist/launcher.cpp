// Local worker group: fork/exec one process per local rank, poll them, forward
// SIGINT / SIGTERM, end the group on the first failure, restart on request.
#include <loom/dist/launcher.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <thread>
#include <utility>

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

// Owns one file descriptor.
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() { reset(); }
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

void write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t written = ::write(fd, data, size);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return;  // a full disk or a closed terminal: the output is lost, the run goes on
    data += written;
    size -= static_cast<size_t>(written);
  }
}

// One teed stream of one process: what it writes into `pipe` goes unchanged
// into `file` and, line by line behind `prefix`, to `console`.
struct TeedStream {
  FileDescriptor pipe;  // read end, non-blocking; closed at end of file
  FileDescriptor file;
  int console = -1;     // STDOUT_FILENO / STDERR_FILENO, -1 when filtered out
  std::string prefix;
  std::string partial;  // the console's unfinished line

  // Moves what the pipe holds now; with `final`, also ends the unfinished
  // line and closes the pipe (the process has exited).
  void pump(bool final) {
    char buffer[65536];
    while (pipe.get() >= 0) {
      const ssize_t got = ::read(pipe.get(), buffer, sizeof(buffer));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) break;  // EAGAIN: nothing more for now
      if (got == 0) {
        pipe.reset();
        break;
      }
      write_all(file.get(), buffer, static_cast<size_t>(got));
      if (console < 0) continue;
      partial.append(buffer, static_cast<size_t>(got));
      std::string lines;
      size_t begin = 0;
      for (size_t end; (end = partial.find('\n', begin)) != std::string::npos; begin = end + 1) {
        lines += prefix;
        lines.append(partial, begin, end + 1 - begin);
      }
      partial.erase(0, begin);
      write_all(console, lines.data(), lines.size());
    }
    if (!final) return;
    pipe.reset();  // what a child of the process writes later is not read
    if (console >= 0 && !partial.empty()) {
      std::string line = prefix + partial + "\n";
      write_all(console, line.data(), line.size());
    }
    partial.clear();
  }
};

struct Worker {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  std::vector<TeedStream> teed{};
};

bool has_stream(Streams set, Streams stream) {
  return (static_cast<int>(set) & static_cast<int>(stream)) != 0;
}

// The descriptors process `worker` gets as stdout and stderr (-1: the
// launcher's own) under the spec's redirects and tee; fills worker.teed.
// Files go to `directory` (made here).
std::pair<FileDescriptor, FileDescriptor> open_outputs(const WorkerGroupSpec& spec, Worker& worker,
                                                       const std::filesystem::path& directory) {
  std::pair<FileDescriptor, FileDescriptor> child;
  const Streams redirected = spec.redirects.of(worker.local_rank), teed = spec.tee.of(worker.local_rank);
  for (Streams stream : {Streams::out, Streams::err}) {
    const bool tee = has_stream(teed, stream);
    if (!tee && !has_stream(redirected, stream)) continue;
    std::error_code error;
    std::filesystem::create_directories(directory, error);
    LOOM_CHECK(!error, spec.name, ": cannot create the log directory ", directory.string(), ": ", error.message());
    const std::string path = (directory / (stream == Streams::out ? "stdout.log" : "stderr.log")).string();
    FileDescriptor file(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    LOOM_CHECK(file.get() >= 0, spec.name, ": cannot write the log file ", path, ": ", std::strerror(errno));
    FileDescriptor& child_end = stream == Streams::out ? child.first : child.second;
    if (!tee) {
      child_end = std::move(file);
      continue;
    }
    int ends[2];
    LOOM_CHECK(::pipe2(ends, O_CLOEXEC) == 0, spec.name, ": pipe failed: ", std::strerror(errno));
    TeedStream teed_stream;
    teed_stream.pipe = FileDescriptor(ends[0]);
    child_end = FileDescriptor(ends[1]);
    ::fcntl(ends[0], F_SETFL, ::fcntl(ends[0], F_GETFL) | O_NONBLOCK);
    teed_stream.file = std::move(file);
    const bool shown = spec.console_local_ranks.empty() || spec.console_local_ranks.count(worker.local_rank) > 0;
    teed_stream.console = !shown ? -1 : stream == Streams::out ? STDOUT_FILENO : STDERR_FILENO;
    teed_stream.prefix = str("[rank ", worker.rank, "]:");
    worker.teed.push_back(std::move(teed_stream));
  }
  return child;
}

// fork + execve with the launcher's environment plus `variables`. The child
// leads a process group of its own (signals reach whatever it starts, e.g. a
// shell's children), gets SIGKILL when the launcher dies, and default signal
// handling.
// `stdout_fd` / `stderr_fd` become the child's stdout / stderr (-1: the
// launcher's own).
pid_t start_process(const std::string& path, const std::vector<std::string>& command,
                    const std::map<std::string, std::string>& variables, int stdout_fd, int stderr_fd) {
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
    if (stdout_fd >= 0 && ::dup2(stdout_fd, STDOUT_FILENO) < 0) ::_exit(127);
    if (stderr_fd >= 0 && ::dup2(stderr_fd, STDERR_FILENO) < 0) ::_exit(127);
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
  bool node_waiting = false;  // elastic: ended for a new rendezvous round
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
      const std::filesystem::path directory =
          std::filesystem::path(spec.log_dir) / str("attempt_", restart_count) / std::to_string(local);
      auto [child_stdout, child_stderr] = open_outputs(spec, worker, directory);
      worker.pid = start_process(path, spec.command, variables, child_stdout.get(), child_stderr.get());
      worker.running = true;
      workers.push_back(std::move(worker));
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
  Clock::time_point next_membership_check = Clock::now();
  // Elastic: whether a node waits to join is asked of the rendezvous store,
  // also while the processes stop (the rendezvous takes each poll as this
  // node's heartbeat). A store that went away (its host's job finished
  // first, or the host died) ends the checks for this attempt: the processes
  // finish, or fail on their own collectives, as without membership checks.
  bool check_membership = static_cast<bool>(spec.node_waiting);
  while (running > 0) {
    if (check_membership && Clock::now() >= next_membership_check) {
      next_membership_check = Clock::now() + std::chrono::milliseconds(200);
      bool waiting = false;
      try {
        waiting = spec.node_waiting(restart_count);
      } catch (const std::exception&) {
        check_membership = false;
      }
      if (waiting && !ending) {
        result.node_waiting = true;
        std::fprintf(stderr, "%s: a node waits to join; ending the local processes (SIGTERM) for rendezvous round %d\n",
                     spec.name.c_str(), restart_count + 1);
        std::fflush(stderr);
        end_group(SIGTERM);
      }
    }
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
      if (::waitpid(worker.pid, &status, WNOHANG) != worker.pid) {
        for (TeedStream& stream : worker.teed) stream.pump(false);
        continue;
      }
      for (TeedStream& stream : worker.teed) stream.pump(true);  // what it wrote before it exited
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
    // Wait 10 ms, or less when a teed stream has output.
    std::vector<pollfd> pipes;
    for (const auto& worker : workers)
      for (const TeedStream& stream : worker.teed)
        if (stream.pipe.get() >= 0) pipes.push_back({stream.pipe.get(), POLLIN, 0});
    if (pipes.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    } else {
      ::poll(pipes.data(), pipes.size(), 10);
    }
  }
  for (const WorkerExit& exit : later_failures)
    std::fprintf(stderr, "%s: also: %s\n", spec.name.c_str(), exit.describe().c_str());
  std::fflush(stderr);
  return result;
}

}  // namespace

Streams StreamsPerRank::of(int local_rank) const {
  if (per_rank.empty()) return all;
  auto found = per_rank.find(local_rank);
  return found == per_rank.end() ? Streams::none : found->second;
}

bool StreamsPerRank::any() const {
  if (per_rank.empty()) return all != Streams::none;
  for (const auto& [rank, streams] : per_rank)
    if (streams != Streams::none) return true;
  return false;
}

StreamsPerRank parse_streams(const std::string& flag, const std::string& text) {
  auto value_of = [&](const std::string& item) {
    LOOM_CHECK(item.size() == 1 && item[0] >= '0' && item[0] <= '3', flag, "=", text, ": '", item,
               "' is not 0 (none), 1 (stdout), 2 (stderr) or 3 (both); give one value or LOCAL_RANK:VALUE,... "
               "(e.g. 0:3,1:2)");
    return static_cast<Streams>(item[0] - '0');
  };
  StreamsPerRank result;
  if (text.find(':') == std::string::npos) {
    result.all = value_of(text);
    return result;
  }
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find(',', begin);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(begin, end - begin);
    const size_t colon = item.find(':');
    LOOM_CHECK(colon != std::string::npos && colon > 0, flag, "=", text, ": '", item,
               "' is not LOCAL_RANK:VALUE (e.g. 0:3,1:2)");
    const std::string rank_text = item.substr(0, colon);
    LOOM_CHECK(rank_text.size() <= 6 && rank_text.find_first_not_of("0123456789") == std::string::npos, flag, "=",
               text, ": '", rank_text, "' is not a local rank");
    const int rank = std::stoi(rank_text);
    LOOM_CHECK(result.per_rank.count(rank) == 0, flag, "=", text, ": local rank ", rank, " is given twice");
    result.per_rank[rank] = value_of(item.substr(colon + 1));
    begin = end + 1;
  }
  return result;
}

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
  LOOM_CHECK(!spec.log_dir.empty() || (!spec.redirects.any() && !spec.tee.any()), spec.name,
             ": redirected or teed output needs a log directory");
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
  WorkerGroupSpec current = spec;  // elastic: this round's nodes
  int round = -1;
  while (true) {
    if (!resume_report.empty()) {
      if (std::FILE* report = std::fopen(resume_report.c_str(), "w")) std::fclose(report);  // empty for this attempt
    }
    round = spec.rendezvous ? spec.rendezvous(current, round) : result.restarts;
    AttemptResult attempt = run_attempt(current, path, round, resume_report);
    result.first_failure = attempt.first_failure;
    result.received_signal = attempt.received_signal;
    if (attempt.node_waiting && !attempt.first_failure && attempt.received_signal == 0) continue;  // not a restart
    // A failure while a node waits is the membership change too: another
    // node's launcher saw it first and stopped its processes, which stops
    // every rank (here: exit 143, or a collective error). Not a restart.
    if (attempt.first_failure && attempt.received_signal == 0 && spec.node_waiting) {
      bool waiting = false;
      try {
        waiting = spec.node_waiting(round);
      } catch (const std::exception&) {
        // The store went away: a plain failure.
      }
      if (waiting) {
        std::fprintf(stderr, "%s: %s while a node waits to join; starting rendezvous round %d (not a restart)\n",
                     spec.name.c_str(), attempt.first_failure->describe().c_str(), round + 1);
        std::fflush(stderr);
        continue;
      }
    }
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
