// Fuzzes the launch-environment parser (dist/environment: torchrun, SLURM and
// Open MPI variables). The input is the environment, one NAME=VALUE per line;
// the first line's bytes, if it starts with '#', choose overrides (rank,
// world size, port) as a caller's arguments would. Only loom::Error may come
// out, and a resolved environment must be consistent.
#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include <loom/core/error.h>
#include <loom/dist/environment.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::map<std::string, std::string> variables;
  loom::dist::LaunchOverrides overrides;
  size_t start = 0;
  bool first = true;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    if (first && !line.empty() && line[0] == '#') {
      // "#" then up to three signed bytes: rank, world size, master port.
      if (line.size() > 1) overrides.rank = static_cast<signed char>(line[1]);
      if (line.size() > 2) overrides.world_size = static_cast<signed char>(line[2]);
      if (line.size() > 3) overrides.master_port = static_cast<signed char>(line[3]) * 600;
    } else if (const size_t equals = line.find('='); equals != std::string::npos) {
      variables[line.substr(0, equals)] = line.substr(equals + 1);
    }
    first = false;
    start = end + 1;
  }
  const loom::dist::EnvironmentLookup lookup = [&](const std::string& name) -> std::optional<std::string> {
    auto it = variables.find(name);
    if (it == variables.end()) return std::nullopt;
    return it->second;
  };
  (void)loom::dist::detect_launcher(lookup);
  (void)loom::dist::rank_prefix(lookup);  // never throws
  try {
    const loom::dist::LaunchEnvironment env = loom::dist::resolve_launch_environment(overrides, lookup);
    if (env.world_size < 1 || env.rank < 0 || env.rank >= env.world_size || env.local_rank < 0 ||
        env.local_world_size < 1 || env.node_rank < 0 || env.master_port < 0 || env.master_port > 65535 ||
        env.master_addr.empty())
      std::abort();
  } catch (const loom::Error&) {
  }
  try {
    (void)loom::dist::collective_timeout_from_environment(std::chrono::seconds(1), lookup);
  } catch (const loom::Error&) {
  }
  if (auto job = variables.find("OMPI_MCA_ess_base_jobid"); job != variables.end()) {
    const int port = loom::dist::open_mpi_default_port(job->second);
    if (port < loom::dist::kOpenMpiPortBase || port >= loom::dist::kOpenMpiPortBase + loom::dist::kOpenMpiPortCount)
      std::abort();
  }
  return 0;
}
