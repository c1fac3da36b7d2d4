#include "benchmarks/gemm_peak.h"

#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include <loom/core/error.h>
#include <loom/core/parallel.h>
#include <loom/ops/cpu/gemm.h>

namespace loom::bench {
namespace {
using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

template <class Fn>
double best_seconds(int repeats, Fn&& fn) {
  fn();  // warm-up: page faults, packing buffers, thread team
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}
}  // namespace

GemmPeak measure_gemm_peak(int threads, int64_t size, int repeats) {
  const int saved = get_num_threads();
  set_num_threads(threads);
  Eigen::setNbThreads(threads);
  const Matrix a = Matrix::Random(size, size), b = Matrix::Random(size, size);
  Matrix c_eigen(size, size), c_loom(size, size);
  const double flops = 2.0 * static_cast<double>(size) * static_cast<double>(size) * static_cast<double>(size);
  GemmPeak peak;
  peak.threads = threads;
  peak.size = size;
  peak.eigen_gflops = flops / best_seconds(repeats, [&] { c_eigen.noalias() = a * b; }) / 1e9;
  peak.loom_gflops = flops / best_seconds(repeats, [&] {
                       ops::cpu::gemm(ops::cpu::Transpose::no, ops::cpu::Transpose::no, size, size, size, 1.0f,
                                      a.data(), size, b.data(), size, 0.0f, c_loom.data(), size);
                     }) / 1e9;
  set_num_threads(saved);
  const double scale = std::max(1e-30f, c_eigen.cwiseAbs().maxCoeff());
  peak.max_relative_difference = (c_loom - c_eigen).cwiseAbs().maxCoeff() / scale;
  LOOM_CHECK(peak.max_relative_difference < 1e-4, "gemm peak: loom's GEMM differs from Eigen's by ",
             peak.max_relative_difference, " (relative) on a ", size, "^3 product");
  return peak;
}

std::string to_json(const GemmPeak& peak) {
  char line[256];
  std::snprintf(line, sizeof(line),
                "{\"bench\": \"f32 gemm peak\", \"threads\": %d, \"n\": %lld, \"eigen_gflops\": %.1f, "
                "\"loom_gflops\": %.1f, \"kernel\": \"%s\"}",
                peak.threads, static_cast<long long>(peak.size), peak.eigen_gflops, peak.loom_gflops,
                ops::cpu::gemm_kernel_name());
  return line;
}

}  // namespace loom::bench
