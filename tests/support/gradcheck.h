// Finite-difference gradient checks in f64: the independent reference every
// op's backward is tested against.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <vector>

#include <loom/core/autograd.h>
#include <loom/core/generator.h>
#include <loom/core/gradcheck.h>
#include <loom/core/tensor.h>

namespace loom::testing {

// A random f64 tensor with values in [low, high).
inline Tensor random_tensor(const Shape& sizes, uint64_t seed, double low = -1.0, double high = 1.0,
                            DType dtype = DType::f64) {
  Generator gen(seed);
  Tensor t = Tensor::empty(sizes, dtype);
  gen.uniform_(t, low, high);
  return t;
}

inline double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.to_vector<double>()) m = std::max(m, std::abs(v));
  return m;
}

inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  auto x = a.to_vector<double>();
  auto y = b.to_vector<double>();
  REQUIRE(x.size() == y.size());
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

// Checks every element of `actual` against `expected` (values computed by
// hand), each within a relative `epsilon`.
inline void check_values_near(const Tensor& actual, const std::vector<double>& expected, double epsilon) {
  const std::vector<double> values = actual.to_vector<double>();
  REQUIRE(values.size() == expected.size());
  for (size_t i = 0; i < values.size(); ++i) CHECK(values[i] == doctest::Approx(expected[i]).epsilon(epsilon));
}

// Relative error ||a - b||_inf / max(||b||_inf, floor).
inline double relative_error(const Tensor& actual, const Tensor& expected, double floor = 1e-3) {
  return max_abs_diff(actual, expected) / std::max(max_abs(expected), floor);
}

// Checks d(sum(f(inputs) * w))/d(input) from backward against central
// differences (loom::compare_gradients, the library's gradient checker), for
// every input whose requires_grad is set. `f` must be deterministic. Inputs
// must be f64.
inline void check_gradients(const std::function<Tensor(const TensorList&)>& f, TensorList inputs,
                            double tolerance = 1e-6, double eps = 1e-6, uint64_t seed = 99) {
  for (Tensor& t : inputs) REQUIRE(t.dtype() == DType::f64);
  const std::vector<InputGradientCheck> checks =
      compare_gradients(f, inputs, GradcheckOptions().tolerance(tolerance).eps(eps).seed(seed));
  for (const InputGradientCheck& check : checks) {
    REQUIRE_MESSAGE(check.analytic.defined(), "input ", check.input, " received no gradient");
    INFO("input ", check.input, " ", inputs[check.input].str(), ": relative error ", check.relative_error);
    CHECK(check.relative_error < tolerance);
  }
}

}  // namespace loom::testing
