// gemm_peak: this machine's f32 matrix-multiply peak (Eigen and loom's GEMM)
// at 1 thread and at --threads, as JSON lines.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "benchmarks/gemm_peak.h"
#include <loom/core/error.h>

int main(int argc, char** argv) {
  CLI::App app{"f32 GEMM peak of this machine (Eigen and loom)"};
  int threads = 2;
  int64_t size = 1024;
  app.add_option("--threads", threads, "threads for the second measurement")->check(CLI::PositiveNumber);
  app.add_option("--size", size, "n of the n x n x n products")->check(CLI::Range(64, 8192));
  CLI11_PARSE(app, argc, argv);
  try {
    std::printf("%s\n", loom::bench::to_json(loom::bench::measure_gemm_peak(1, size)).c_str());
    if (threads > 1) std::printf("%s\n", loom::bench::to_json(loom::bench::measure_gemm_peak(threads, size)).c_str());
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "gemm_peak: %s\n", e.what());
    return 1;
  }
  return 0;
}
