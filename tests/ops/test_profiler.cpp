// The per-op profiler: time per (op, input shape), and the operations counted
// by conv2d and linear, so --profile can print GFLOP/s per layer.
#include <doctest/doctest.h>

#include <cctype>
#include <string>

#include <loom/core/profiler.h>
#include <loom/ops/conv2d.h>
#include <loom/ops/elementwise.h>
#include <loom/ops/linear.h>

using namespace loom;

namespace {
// The report's per-op line for `op` ("all layers: conv2d   113.12 ms ..."):
// the name, padding, then the time, whatever its width.
bool has_all_layers_row(const std::string& report, const std::string& op) {
  const std::string prefix = "all layers: " + op + " ";
  for (size_t at = report.find(prefix); at != std::string::npos; at = report.find(prefix, at + 1)) {
    size_t first = report.find_first_not_of(' ', at + prefix.size());
    if (first != std::string::npos && std::isdigit(static_cast<unsigned char>(report[first]))) return true;
  }
  return false;
}
}  // namespace

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
  CHECK(has_all_layers_row(report, "conv2d"));
  CHECK(has_all_layers_row(report, "conv2d backward"));
  CHECK(report.find("    1.208 GFLOP") != std::string::npos);  // conv2d forward, and its backward
  CHECK(report.find("    0.268 GFLOP") != std::string::npos);  // linear forward
  CHECK(report.find("    0.537 GFLOP") != std::string::npos);  // linear backward
  profiler::reset();
}
