// How the scaling programs (scaling_step, allreduce_timing) end: each rank's
// JSON result written, then every rank waited for and the group destroyed.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <string>

#include <loom/core/error.h>
#include <loom/dist/process_group.h>

namespace loom::benchmarks {

// Writes `result` to `path` with "{rank}" replaced by this rank (a file per
// rank), or, with no path, rank 0's as one line to stdout; then waits for
// every rank and destroys the default process group. `program` names the
// writer in errors.
inline void write_result_and_finish(dist::ProcessGroup& group, const nlohmann::json& result, std::string path,
                                    const char* program) {
  if (path.empty()) {
    if (group.rank() == 0) std::printf("%s\n", result.dump().c_str());
  } else {
    if (auto at = path.find("{rank}"); at != std::string::npos) path.replace(at, 6, std::to_string(group.rank()));
    std::ofstream file(path);
    LOOM_CHECK(file.good(), program, ": cannot write ", path);
    file << result.dump() << "\n";
  }
  group.barrier()->wait();
  dist::destroy_process_group();
}

}  // namespace loom::benchmarks
