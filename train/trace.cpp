#include <loom/train/trace.h>

#include <filesystem>
#include <fstream>

#include <loom/core/error.h>
#include <loom/core/profiler.h>

namespace loom::train {

namespace fs = std::filesystem;

std::string trace_path_for_rank(const std::string& path, int rank, int world) {
  if (path.empty() || world <= 1) return path;
  const fs::path file(path);
  return (file.parent_path() / str(file.stem().string(), ".rank", rank, file.extension().string())).string();
}

TraceRecording::TraceRecording(const std::string& path, int rank, int world)
    : path_(trace_path_for_rank(path, rank, world)) {
  if (path_.empty()) return;
  // Fail now, not after training, when the file cannot be written.
  const bool existed = fs::exists(path_);
  {
    std::ofstream probe(path_, std::ios::app);
    LOOM_CHECK(probe.good(), "--trace ", path_, ": cannot write this file");
  }
  if (!existed) fs::remove(path_);
  profiler::set_process_name(world > 1 ? str("rank ", rank) : std::string("loom"));
  profiler::set_thread_name("main");
  profiler::start_tracing();
}

TraceRecording::~TraceRecording() {
  if (!path_.empty()) profiler::stop_tracing();
}

void TraceRecording::finish(std::FILE* log) {
  if (path_.empty()) return;
  profiler::stop_tracing();
  profiler::write_chrome_trace(path_);
  if (log != nullptr) std::fprintf(log, "Wrote the trace to %s (open it at https://ui.perfetto.dev)\n", path_.c_str());
}

}  // namespace loom::train
