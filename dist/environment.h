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

// Which launcher's variables are present, without validating them. Apps use it
// to decide whether to spawn their own ranks (Launcher::none) or not.
Launcher detect_launcher(const EnvironmentLookup& environment = process_environment());

// Resolves every field from the overrides, then the detected launcher's
// variables. Throws loom::Error naming the variable (or argument) for a value
// that is not a number, negative, out of range, inconsistent (RANK >=
// WORLD_SIZE), or missing (MASTER_ADDR when the world has more than one rank).
LaunchEnvironment resolve_launch_environment(const LaunchOverrides& overrides = {},
                                             const EnvironmentLookup& environment = process_environment());

// The collective timeout the LOOM_COLLECTIVE_TIMEOUT variable asks for (in
// seconds, fractions allowed), else `fallback`. Apps use it for a --timeout
// flag's default; tests set it short. Throws loom::Error naming the variable
// when it is not a positive number.
std::chrono::milliseconds collective_timeout_from_environment(
    std::chrono::milliseconds fallback, const EnvironmentLookup& environment = process_environment());

}  // namespace loom::dist
