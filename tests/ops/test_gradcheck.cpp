// loom::gradcheck (core/gradcheck.h), the gradient checker users get: it must
// accept a right backward, and reject a wrong or missing one with a message
// naming the input.
#include <doctest/doctest.h>

#include <loom/core/autograd.h>
#include <loom/core/error.h>
#include <loom/core/gradcheck.h>
#include <loom/ops/elementwise.h>

#include "tests/support/gradcheck.h"

using namespace loom;
using loom::testing::random_tensor;

namespace {

// y = factor * x with a backward that returns `backward_factor` * g
// (right when the two agree), or no gradient at all when `give_gradient` is false.
Tensor scaled(const Tensor& x, double factor, double backward_factor, bool give_gradient = true) {
  Tensor y;
  {
    NoGradGuard no_grad;
    y = scale(x, factor);
  }
  record("scaled", {x}, {&y}, [backward_factor, give_gradient](const TensorList& g, const Node&) {
    return TensorList{give_gradient ? scale(g[0], backward_factor) : Tensor()};
  });
  return y;
}

}  // namespace

TEST_CASE("gradcheck accepts a right backward, for every input that requires grad") {
  Tensor a = random_tensor({3, 4}, 1).set_requires_grad(true);
  Tensor b = random_tensor({3, 4}, 2);  // no grad: not checked
  Tensor c = random_tensor({3, 4}, 3).set_requires_grad(true);
  auto f = [](const TensorList& x) { return mul(scaled(x[0], 2.5, 2.5), x[1]) + x[2]; };
  CHECK(gradcheck(f, {a, b, c}));
  const std::vector<InputGradientCheck> checks = compare_gradients(f, {a, b, c});
  REQUIRE(checks.size() == 2);
  CHECK(checks[0].input == 0);
  CHECK(checks[1].input == 2);
  for (const InputGradientCheck& check : checks) CHECK(check.relative_error < 1e-8);
}

TEST_CASE("gradcheck rejects a wrong backward, naming the input and its error") {
  Tensor x = random_tensor({5}, 4).set_requires_grad(true);
  // Backward returns 1.5 times the true gradient: every element is off by half
  // the true value, so the relative error is 0.5.
  auto f = [](const TensorList& in) { return scaled(in[0], 2, 3); };
  const std::vector<InputGradientCheck> checks = compare_gradients(f, {x});
  REQUIRE(checks.size() == 1);
  CHECK(checks[0].relative_error == doctest::Approx(0.5).epsilon(1e-6));
  CHECK_THROWS_WITH_AS(gradcheck(f, {x}), doctest::Contains("input 0 (f64[5] cpu): relative error 0.5"), Error);
  // A looser tolerance accepts it.
  CHECK(gradcheck(f, {x}, GradcheckOptions().tolerance(0.6)));
}

TEST_CASE("gradcheck rejects a backward that gives an input no gradient") {
  Tensor x = random_tensor({2, 2}, 5).set_requires_grad(true);
  auto f = [](const TensorList& in) { return scaled(in[0], 2, 2, /*give_gradient=*/false); };
  CHECK_THROWS_WITH_AS(gradcheck(f, {x}), doctest::Contains("input 0 (f64[2, 2] cpu) received no gradient"), Error);
}

TEST_CASE("gradcheck needs f64 CPU inputs") {
  Tensor x = random_tensor({3}, 6, -1, 1, DType::f32).set_requires_grad(true);
  CHECK_THROWS_WITH_AS(gradcheck([](const TensorList& in) { return in[0] * 2.0; }, {x}),
                       doctest::Contains("input 0 is f32[3] cpu; finite differences need contiguous f64 CPU tensors"),
                       Error);
}
