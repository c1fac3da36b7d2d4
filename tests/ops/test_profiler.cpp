// The per-op profiler: time per (op, input shape), and the operations counted
// by conv2d and linear, so --profile can print GFLOP/s per layer.
#include <doctest/doctest.h>

#include <string>

#include "core/profiler.h"
#include "ops/conv2d.h"
#include "ops/elementwise.h"
#include "ops/linear.h"

using namespace loom;

TEST_CASE("profiler counts conv2d and linear operations per layer, forward and backward") {
  profiler::reset();
  profiler::set_enabled(true);
  {
    profiler::Scope step("step (all)");
    // 64 images, 64 -> 64 channels, 3x3, 16x16 output: 2 * 64*64*576*256 = 1.208 GFLOP per GEMM;
    // the input needs no gradient, so backward runs only the weight's GEMM.
    Tensor w = Tensor::zeros({64, 64, 3, 3}).set_requires_grad(true);
    Tensor y = conv2d(Tensor::zeros({64, 64, 16, 16}), w, Tensor(), {.padding = {1, 1}});
    // 64 x 16384 -> 128: 2 * 64*16384*128 = 0.268 GFLOP per GEMM; backward: input and weight.
    Tensor fc = Tensor::zeros({128, 16384}).set_requires_grad(true);
    sum(linear(y.reshape({64, 16384}), fc, Tensor())).backward();
  }
  profiler::set_enabled(false);
  const std::string report = profiler::report();
  INFO(report);
  CHECK(report.find("GFLOP/s  op [input shape]") != std::string::npos);
  CHECK(report.find("all layers: conv2d                 ") != std::string::npos);
  CHECK(report.find("    1.208 GFLOP") != std::string::npos);  // conv2d forward, and its backward
  CHECK(report.find("    0.268 GFLOP") != std::string::npos);  // linear forward
  CHECK(report.find("    0.537 GFLOP") != std::string::npos);  // linear backward
  profiler::reset();
}
