// A Chrome trace of a training run (ops, DDP buckets, data waits) for
// Perfetto (ui.perfetto.dev) or chrome://tracing: one file per rank.
#pragma once

#include <cstdio>
#include <string>

namespace loom::train {

// The file rank `rank` of `world` writes for --trace PATH: PATH itself in a
// world of one, else PATH with ".rank<k>" before its extension.
std::string trace_path_for_rank(const std::string& path, int rank, int world);

// Keeps a trace while it lives (when `path` is not empty); finish() writes it.
class TraceRecording {
 public:
  TraceRecording(const std::string& path, int rank, int world);
  ~TraceRecording();
  TraceRecording(const TraceRecording&) = delete;
  TraceRecording& operator=(const TraceRecording&) = delete;
  // Writes the file and names it on `log` (may be null); throws loom::Error
  // naming the file when it cannot be written.
  void finish(std::FILE* log);

 private:
  std::string path_;  // this rank's file; empty: no trace
};

}  // namespace loom::train
