// Launch-environment parsing: explicit arguments, then torchrun, SLURM or Open
// MPI variables, each value validated with an error naming its variable.
#include <loom/dist/environment.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <climits>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <limits>
#include <vector>

#include <unistd.h>

#include <loom/core/error.h>
#include <loom/core/json_string.h>

namespace loom::dist {

const char* launcher_name(Launcher launcher) {
  switch (launcher) {
    case Launcher::none: return "none (single process)";
    case Launcher::torchrun: return "torchrun-style (RANK / WORLD_SIZE)";
    case Launcher::slurm: return "SLURM (srun)";
    case Launcher::open_mpi: return "Open MPI (mpirun)";
  }
  return "unknown";
}

EnvironmentLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

// The innermost launcher wins: torchrun / loomrun set RANK for the processes
// they start, even under srun or mpirun. Open MPI's OMPI_COMM_WORLD_* exist
// only in processes mpirun started, and they win over SLURM's variables, which
// an sbatch script (SLURM_PROCID=0, SLURM_NTASKS=N for the whole job) and the
// daemons mpirun starts through srun pass on. SLURM's own variables describe
// this process only in an srun task, which alone has SLURM_STEP_ID; a
// process started by the batch script itself is a single process.
Launcher detect_launcher(const EnvironmentLookup& environment) {
  if (environment("RANK") || environment("WORLD_SIZE")) return Launcher::torchrun;
  if (environment("OMPI_COMM_WORLD_RANK") || environment("OMPI_COMM_WORLD_SIZE")) return Launcher::open_mpi;
  if (environment("SLURM_PROCID") && (environment("SLURM_STEP_ID") || environment("SLURM_STEPID")))
    return Launcher::slurm;
  return Launcher::none;
}

namespace {

// One resolved integer and where it came from, so errors can name it.
struct Field {
  int value = 0;
  std::string source;  // "RANK", "rank argument", or "" for a default
  bool given() const { return !source.empty(); }
  // "RANK=3", "rank argument 3", or "3 (default)".
  std::string describe() const {
    if (source.empty()) return str(value, " (default)");
    if (source.find(' ') != std::string::npos) return str(source, " ", value);
    return str(source, "=", value);
  }
};

int parse_int(const std::string& source, const std::string& text) {
  const char* begin = text.c_str();
  char* end = nullptr;
  errno = 0;
  long long value = std::strtoll(begin, &end, 10);
  bool whole = end != begin && *end == '\0';
  if (!whole) LOOM_FAIL(source, "='", text, "' is not a number; expected a non-negative integer");
  if (errno == ERANGE || value > std::numeric_limits<int>::max() || value < std::numeric_limits<int>::min())
    LOOM_FAIL(source, "=", text, " is out of range for a rank, size or port");
  if (value < 0) LOOM_FAIL(source, "=", text, " must not be negative");
  return static_cast<int>(value);
}

// The override when given, else the first set variable of `names`, else unset.
Field read_field(const std::optional<int>& override_value, const char* argument_name,
                 const std::vector<const char*>& names, const EnvironmentLookup& environment) {
  if (override_value) {
    std::string source = str(argument_name, " argument");
    if (*override_value < 0) LOOM_FAIL(source, " ", *override_value, " must not be negative");
    return {*override_value, source};
  }
  for (const char* name : names) {
    if (auto text = environment(name)) return {parse_int(name, *text), name};
  }
  return {};
}

// SLURM_TASKS_PER_NODE looks like "4", "2(x3),1": tasks on each node in order.
std::optional<int> slurm_tasks_on_node(const std::string& text, int node) {
  // 64-bit sums: a value of many repeats cannot overflow them.
  int64_t first_node = 0;
  size_t position = 0;
  while (position < text.size()) {
    size_t comma = text.find(',', position);
    std::string item = text.substr(position, comma == std::string::npos ? std::string::npos : comma - position);
    position = comma == std::string::npos ? text.size() : comma + 1;
    long tasks = 0, repeat = 1;
    char* end = nullptr;
    tasks = std::strtol(item.c_str(), &end, 10);
    if (end == item.c_str() || tasks < 0 || tasks > INT_MAX) return std::nullopt;
    if (*end == '(') {
      if (end[1] != 'x') return std::nullopt;
      repeat = std::strtol(end + 2, &end, 10);
      if (*end != ')' || repeat < 1 || repeat > INT_MAX) return std::nullopt;
    } else if (*end != '\0') {
      return std::nullopt;
    }
    if (node < first_node + repeat) return static_cast<int>(tasks);
    first_node += repeat;
  }
  return std::nullopt;
}

// The id every process of one mpirun job shares: Open MPI 4's job id, or
// Open MPI 5's PMIx namespace.
std::optional<std::string> open_mpi_job_id(const EnvironmentLookup& environment) {
  if (auto job = environment("OMPI_MCA_ess_base_jobid"); job && !job->empty()) return job;
  if (auto job = environment("PMIX_NAMESPACE"); job && !job->empty()) return job;
  return std::nullopt;
}

// The variables a launcher sets for each field, the first one found wins.
struct LauncherVariables {
  std::vector<const char*> rank, world, local_rank, local_world, node;
};

const LauncherVariables& launcher_variables(Launcher launcher) {
  static const LauncherVariables none;
  static const LauncherVariables torchrun{
      {"RANK"}, {"WORLD_SIZE"}, {"LOCAL_RANK"}, {"LOCAL_WORLD_SIZE"}, {"GROUP_RANK", "NODE_RANK"}};
  static const LauncherVariables slurm{{"SLURM_PROCID"}, {"SLURM_NTASKS"}, {"SLURM_LOCALID"}, {}, {"SLURM_NODEID"}};
  static const LauncherVariables open_mpi{{"OMPI_COMM_WORLD_RANK"},
                                          {"OMPI_COMM_WORLD_SIZE"},
                                          {"OMPI_COMM_WORLD_LOCAL_RANK"},
                                          {"OMPI_COMM_WORLD_LOCAL_SIZE"},
                                          {}};
  switch (launcher) {
    case Launcher::torchrun: return torchrun;
    case Launcher::slurm: return slurm;
    case Launcher::open_mpi: return open_mpi;
    case Launcher::none: break;
  }
  return none;
}

}  // namespace

int open_mpi_default_port(const std::string& job_id) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : job_id) hash = (hash ^ c) * 1099511628211ull;
  return kOpenMpiPortBase + static_cast<int>(hash % kOpenMpiPortCount);
}

LaunchEnvironment resolve_launch_environment(const LaunchOverrides& overrides, const EnvironmentLookup& environment) {
  LaunchEnvironment result;
  result.launcher = detect_launcher(environment);

  const LauncherVariables& names = launcher_variables(result.launcher);
  Field rank = read_field(overrides.rank, "rank", names.rank, environment);
  Field world = read_field(overrides.world_size, "world_size", names.world, environment);
  Field local_rank = read_field(overrides.local_rank, "local_rank", names.local_rank, environment);
  Field local_world = read_field(overrides.local_world_size, "local_world_size", names.local_world, environment);
  Field node = read_field(overrides.node_rank, "node_rank", names.node, environment);

  if (!local_world.given() && result.launcher == Launcher::slurm) {
    if (auto text = environment("SLURM_NTASKS_PER_NODE"); text && text->find_first_not_of("0123456789") == std::string::npos) {
      local_world = {parse_int("SLURM_NTASKS_PER_NODE", *text), "SLURM_NTASKS_PER_NODE"};
    } else if (auto tasks = environment("SLURM_TASKS_PER_NODE")) {
      if (auto count = slurm_tasks_on_node(*tasks, node.value)) local_world = {*count, "SLURM_TASKS_PER_NODE"};
    }
  }

  if (rank.given() != world.given()) {
    const Field& present = rank.given() ? rank : world;
    const std::vector<const char*>& missing_names = rank.given() ? names.world : names.rank;
    std::string missing = missing_names.empty() ? (rank.given() ? "world_size" : "rank") : missing_names[0];
    LOOM_FAIL(present.describe(), " is set but ", missing,
              " is not; give both the rank and the world size (or neither for a single process)");
  }
  if (!world.given()) world.value = 1;
  if (world.value < 1) LOOM_FAIL(world.describe(), " must be at least 1");
  if (rank.value >= world.value)
    LOOM_FAIL(rank.describe(), " must be smaller than ", world.describe(), " (ranks are 0 to world size - 1)");

  if (!local_world.given()) local_world.value = world.value;  // one node unless told otherwise
  if (local_world.value < 1) LOOM_FAIL(local_world.describe(), " must be at least 1");
  if (local_world.value > world.value)
    LOOM_FAIL(local_world.describe(), " must not exceed ", world.describe());
  if (!local_rank.given()) local_rank.value = rank.value % local_world.value;
  if (local_rank.value >= local_world.value)
    LOOM_FAIL(local_rank.describe(), " must be smaller than ", local_world.describe());
  if (!node.given()) node.value = rank.value / local_world.value;

  result.rank = rank.value;
  result.world_size = world.value;
  result.local_rank = local_rank.value;
  result.local_world_size = local_world.value;
  result.node_rank = node.value;

  // Where rank 0 listens.
  std::optional<std::string> master_addr;
  std::string master_addr_source;
  if (overrides.master_addr) {
    master_addr = overrides.master_addr;
    master_addr_source = "master_addr argument";
  } else {
    std::vector<const char*> names = {"MASTER_ADDR"};
    if (result.launcher == Launcher::slurm) names = {"MASTER_ADDR", "SLURM_SRUN_COMM_HOST", "SLURM_LAUNCH_NODE_IPADDR"};
    for (const char* name : names) {
      if ((master_addr = environment(name))) {
        master_addr_source = name;
        break;
      }
    }
  }
  // mpirun on one machine: every rank is local, so rank 0 is on this host.
  if (!master_addr && result.launcher == Launcher::open_mpi && local_world.given() &&
      local_world.value == world.value) {
    master_addr = "127.0.0.1";
  }
  if (master_addr && master_addr->empty())
    LOOM_FAIL(master_addr_source, " is set but empty; give the host name or address of the node running rank 0");
  if (master_addr) {
    result.master_addr = *master_addr;
  } else if (result.world_size > 1) {
    if (result.launcher == Launcher::open_mpi)
      LOOM_FAIL(world.describe(), " but MASTER_ADDR is not set",
                local_world.given() ? str(" and the ranks span several machines (", local_world.describe(), ")") : "",
                "; set MASTER_ADDR (and MASTER_PORT, default ", kDefaultMasterPort,
                ") to the host name or address of the machine running rank 0 and pass them to every rank: "
                "mpirun -x MASTER_ADDR=HOST -x MASTER_PORT=PORT ...");
    LOOM_FAIL(world.describe(), " but MASTER_ADDR is not set",
              result.launcher == Launcher::slurm ? " (nor SLURM_SRUN_COMM_HOST)" : "",
              "; set MASTER_ADDR to the host name or address of the node running rank 0");
  }

  if (overrides.master_port) {
    int port = *overrides.master_port;
    if (port < 0 || port > 65535) LOOM_FAIL("master_port argument ", port, " is out of range (0 to 65535)");
    result.master_port = port;
  } else if (auto text = environment("MASTER_PORT")) {
    int port = parse_int("MASTER_PORT", *text);
    if (port < 1 || port > 65535) LOOM_FAIL("MASTER_PORT=", *text, " is out of range (1 to 65535)");
    result.master_port = port;
  } else if (result.launcher == Launcher::open_mpi) {
    if (auto job = open_mpi_job_id(environment)) result.master_port = open_mpi_default_port(*job);
  }
  return result;
}

std::chrono::milliseconds collective_timeout_from_environment(std::chrono::milliseconds fallback,
                                                             const EnvironmentLookup& environment) {
  auto text = environment("LOOM_COLLECTIVE_TIMEOUT");
  if (!text) return fallback;
  char* end = nullptr;
  const double seconds = std::strtod(text->c_str(), &end);
  if (text->empty() || *end != '\0' || !std::isfinite(seconds) || seconds <= 0 || seconds > 1e7)
    LOOM_FAIL("LOOM_COLLECTIVE_TIMEOUT='", *text, "' is not a positive number of seconds");
  return std::chrono::milliseconds(std::max<long long>(1, std::llround(seconds * 1000.0)));
}

std::string rank_prefix(const EnvironmentLookup& environment) {
  try {
    if (detect_launcher(environment) == Launcher::none) return "";
    LaunchEnvironment launch = resolve_launch_environment({}, environment);
    return launch.world_size > 1 ? str("rank ", launch.rank, ": ") : "";
  } catch (const std::exception&) {
    return "";  // the error being reported may be about these very variables
  }
}

namespace {

}  // namespace

bool write_torchelastic_error_file(const std::string& message, const EnvironmentLookup& environment) {
  auto path = environment("TORCHELASTIC_ERROR_FILE");
  if (!path || path->empty()) return true;
  // Written beside it and renamed into place: torchrun reads the file of every
  // failed worker, and a worker killed mid-write (torchrun stops the others
  // when one fails) must leave no empty or partial file, which its JSON
  // parser would fail on.
  const std::string temporary = str(*path, ".tmp.", ::getpid());
  std::ofstream file(temporary, std::ios::trunc);
  // torchrun's summary prints py_callstack when present: the message itself here.
  file << "{\"message\": {\"message\": " << json_string(message) << ", \"extraInfo\": {\"py_callstack\": "
       << json_string(message) << ", \"timestamp\": \""
       << static_cast<long long>(std::time(nullptr)) << "\"}}}\n";
  file.close();
  if (!file || std::rename(temporary.c_str(), path->c_str()) != 0) {
    std::remove(temporary.c_str());
    return false;
  }
  return true;
}

}  // namespace loom::dist
