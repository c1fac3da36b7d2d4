// Starting and supervising the local processes of a distributed job, as
// torchrun's agent and mp.spawn do: one process per local rank with the launch
// variables set, SIGINT / SIGTERM forwarded, the group ended when one process
// fails, and optional restarts. apps/loomrun and train_mnist -g share it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <loom/dist/environment.h>

namespace loom::dist {

// Which of a process's output streams an option applies to (torchrun's Std):
// 0 neither, 1 stdout, 2 stderr, 3 both.
enum class Streams : int { none = 0, out = 1, err = 2, both = 3 };

// A Streams value for all local ranks ("3") or per local rank ("0:3,1:1";
// ranks not named get none), as torchrun's --redirects and --tee take it.
struct StreamsPerRank {
  Streams all = Streams::none;
  std::map<int, Streams> per_rank{};  // when not empty, replaces `all`
  Streams of(int local_rank) const;
  bool any() const;  // some rank gets a stream
};

// Parses "N" or "RANK:N,RANK:N" with N in 0..3; throws loom::Error naming
// `flag` (e.g. "--tee") and what is wrong.
StreamsPerRank parse_streams(const std::string& flag, const std::string& text);

struct WorkerGroupSpec {
  // Program and arguments; a program without '/' is searched in PATH.
  std::vector<std::string> command;
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;  // this node; its processes get ranks node_rank * nproc_per_node + local rank
  std::string master_addr = "127.0.0.1";
  int master_port = kDefaultMasterPort;
  // Times the whole local group is started again after a process failed.
  int max_restarts = 0;
  std::string run_id = "none";  // TORCHELASTIC_RUN_ID (torchrun's --rdzv_id)
  // Set in every process after the launch variables (e.g. OMP_NUM_THREADS).
  std::map<std::string, std::string> environment{};
  // How long a process may take to exit after SIGTERM before it gets SIGKILL.
  std::chrono::milliseconds termination_grace = std::chrono::seconds(10);
  // Names the launcher in its messages on stderr: "loomrun: rank 1 ...".
  std::string name = "loomrun";

  // Output files, as torchrun's --log-dir / --redirects / --tee: each attempt
  // (restart) k gets log_dir/attempt_<k>/<local rank>/stdout.log and
  // stderr.log for the streams named by `redirects` or `tee`. A redirected
  // stream goes to its file only; a teed one to its file and to the
  // launcher's stdout / stderr, each line prefixed "[rank N]:" (global rank).
  // Streams named by neither stay the launcher's own (no file, no prefix).
  // log_dir is required when any stream is redirected or teed.
  std::string log_dir{};
  StreamsPerRank redirects{};
  StreamsPerRank tee{};
  // Local ranks whose teed lines reach the terminal (torchrun's
  // --local_ranks_filter); empty: all. Their files are written regardless.
  std::set<int> console_local_ranks{};

  // Elastic mode (loomrun --nnodes MIN:MAX, dist/elastic_rendezvous.h):
  // before each attempt `rendezvous` joins the round after `after_round` (-1
  // at first), sets nnodes and node_rank for it and returns the round, which
  // is the workers' TORCHELASTIC_RESTART_COUNT. While the group runs,
  // `node_waiting(round)` (polled every 200 ms while the processes run or
  // stop, which the rendezvous takes as this node's heartbeat) saying true
  // ends it with SIGTERM (the programs stop with a checkpoint) and starts a
  // new round without counting a restart. So does a failure after which
  // node_waiting(round) says true (another node's launcher stopped the
  // round first, which stops every rank). Null: the static group.
  std::function<int(WorkerGroupSpec& spec, int after_round)> rendezvous{};
  std::function<bool(int round)> node_waiting{};
};

// How one process of the group ended.
struct WorkerExit {
  int rank = 0;        // global
  int local_rank = 0;
  pid_t pid = -1;
  int exit_code = 0;   // when it exited
  int signal = 0;      // when a signal ended it (0 otherwise)
  bool failed() const { return signal != 0 || exit_code != 0; }
  // "rank 1 (local rank 1, pid 4242) was killed by signal 9 (SIGKILL)" or "... exited with code 3".
  std::string describe() const;
};

struct WorkerGroupResult {
  bool succeeded = false;  // every process of the last attempt exited with code 0
  int restarts = 0;        // restarts used
  // The first process seen to fail in the last attempt (the root cause; the
  // others were then ended by the launcher or failed after it).
  std::optional<WorkerExit> first_failure{};
  int received_signal = 0;  // SIGINT or SIGTERM that ended the run (forwarded to the processes)
  // 0 on success, 128 + signal after a forwarded signal, else 1 (torchrun's convention).
  int exit_code() const;
};

// The variables process `local_rank` gets on top of the launcher's own
// environment: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
// GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME, MASTER_ADDR,
// MASTER_PORT, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS,
// TORCHELASTIC_RUN_ID, then spec.environment.
std::map<std::string, std::string> worker_environment(const WorkerGroupSpec& spec, int local_rank, int restart_count);

// Runs the local group until every process exited with code 0, one failed
// (and max_restarts are used up), or the launcher received SIGINT / SIGTERM
// (forwarded to every process, then no restart). When a process fails the
// others get SIGTERM, then SIGKILL after termination_grace. Reports failures
// and restarts on stderr (the failed rank; with max_restarts > 0 the processes
// get LOOM_RESUME_REPORT, a file where a restarted program that resumes writes
// one line saying from where, which is repeated: "restart 1: the processes
// resumed from step 120 ..."). Processes get SIGKILL if the launcher dies. Throws
// loom::Error when the spec is invalid or the program cannot be found.
WorkerGroupResult run_worker_group(const WorkerGroupSpec& spec);

// "SIGKILL", "SIGTERM", ... or "signal 42".
std::string signal_name(int signal);

}  // namespace loom::dist
