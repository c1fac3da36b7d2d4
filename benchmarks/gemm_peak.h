// This machine's f32 matrix-multiply peak, measured the way the throughput
// benchmarks need it: the best of a few square products with Eigen (the
// reference a user could get without loom) and with loom's own GEMM, at the
// thread count of the run. The per-op GFLOP/s of a --profile run are read
// against these figures.
#pragma once

#include <string>

namespace loom::bench {

struct GemmPeak {
  int threads = 1;
  int64_t size = 0;          // n of the n x n x n products
  double eigen_gflops = 0;   // best of the repeats
  double loom_gflops = 0;
  double max_relative_difference = 0;  // loom against Eigen on the same product
};

// Throws loom::Error when the two results disagree (the figures would be
// meaningless).
GemmPeak measure_gemm_peak(int threads, int64_t size = 1024, int repeats = 5);
std::string to_json(const GemmPeak& peak);

}  // namespace loom::bench
