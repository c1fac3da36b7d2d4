// Launch environment: who this process is (rank, world size, local rank, node)
// and where rank 0 listens, read from explicit arguments, then the variables
// torchrun / loomrun, srun (SLURM) or mpirun (Open MPI) set.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>

namespace loom::dist {

// Which launcher's variables described this process.
enum class Launcher {
  none,      // no launcher variables: a single process (rank 0 of 1)
  torchrun,  // RANK / WORLD_SIZE / LOCAL_RANK / ... (torchrun, loomrun, hand-set)
  slurm,     // SLURM_PROCID / SLURM_NTASKS / ... (srun)
  open_mpi,  // OMPI_COMM_WORLD_* (mpirun)
};

const char* launcher_name(Launcher launcher);

// Port rank 0 listens on when no variable names one (torchrun's default).
inline constexpr int kDefaultMasterPort = 29500;

// Under mpirun without MASTER_PORT, rank 0 listens on a port derived from
// the job's id (OMPI_MCA_ess_base_jobid, or PMIX_NAMESPACE in Open MPI 5):
// the same in every process of one job, different for concurrent jobs on a
// machine, and below Linux's ephemeral range (32768 up).
inline constexpr int kOpenMpiPortBase = 20000;
inline constexpr int kOpenMpiPortCount = 12768;
int open_mpi_default_port(const std::string& job_id);

struct LaunchEnvironment {
  Launcher launcher = Launcher::none;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = kDefaultMasterPort;
};

// Values given by the caller (command line, init_process_group arguments);
// each one that is set wins over the environment.
struct LaunchOverrides {
  std::optional<int> rank{};
  std::optional<int> world_size{};
  std::optional<int> local_rank{};
  std::optional<int> local_world_size{};
  std::optional<int> node_rank{};
  std::optional<std::string> master_addr{};
  std::optional<int> master_port{};  // 0 is allowed here: "any free port" (rank 0 only)
};

// Looks up one environment variable; empty optional when it is not set.
using EnvironmentLookup = std::function<std::optional<std::string>(const std::string& name)>;

// The process environment (getenv).
EnvironmentLookup process_environment();

// Which launcher started this process, from the variables present, without
// validating them: RANK / WORLD_SIZE (torchrun, loomrun: set for the processes
// they start, so they win under srun or mpirun too), then OMPI_COMM_WORLD_*
// (only mpirun's processes have them; they win over the SLURM variables an
// sbatch script passes on), then SLURM_PROCID in an srun task (SLURM_STEP_ID
// set; a process the batch script starts directly is a single process). Apps
// use it to decide whether to spawn their own ranks (Launcher::none) or not.
Launcher detect_launcher(const EnvironmentLookup& environment = process_environment());

// Resolves every field from the overrides, then the detected launcher's
// variables. Throws loom::Error naming the variable (or argument) for a value
// that is not a number, negative, out of range, inconsistent (RANK >=
// WORLD_SIZE), or missing (MASTER_ADDR when the world has more than one rank).
// Under mpirun with every rank on this machine (OMPI_COMM_WORLD_LOCAL_SIZE ==
// OMPI_COMM_WORLD_SIZE) MASTER_ADDR defaults to 127.0.0.1, and MASTER_PORT
// to open_mpi_default_port() of the job.
LaunchEnvironment resolve_launch_environment(const LaunchOverrides& overrides = {},
                                             const EnvironmentLookup& environment = process_environment());

// The collective timeout the LOOM_COLLECTIVE_TIMEOUT variable asks for (in
// seconds, fractions allowed), else `fallback`. Apps use it for a --timeout
// flag's default; tests set it short. Throws loom::Error naming the variable
// when it is not a positive number.
std::chrono::milliseconds collective_timeout_from_environment(
    std::chrono::milliseconds fallback, const EnvironmentLookup& environment = process_environment());

// "rank N: " when a launcher (or explicit variables) started this process as
// one rank of several, else "". Never throws: unreadable variables give "".
// Apps put it before their error lines so a user sees which rank failed.
std::string rank_prefix(const EnvironmentLookup& environment = process_environment());

// Writes `message` to the file TORCHELASTIC_ERROR_FILE names (torchrun sets
// it per worker) in PyTorch's error-file format, so that torchrun's failure
// summary shows it: {"message": {"message": ..., "extraInfo": {"py_callstack":
// ..., "timestamp": "<unix seconds>"}}}. Does nothing when the variable is not
// set; returns false when the file cannot be written.
bool write_torchelastic_error_file(const std::string& message,
                                   const EnvironmentLookup& environment = process_environment());

}  // namespace loom::dist
