// linear, log_softmax, nll_loss, cross_entropy, argmax: hand-computed values
// and finite-difference gradients.
#include <doctest/doctest.h>

#include <cmath>

#include <loom/ops/elementwise.h>
#include <loom/ops/linear.h>
#include <loom/ops/loss.h>
#include "tests/support/gradcheck.h"

using namespace loom;
using loom::testing::check_gradients;
using loom::testing::random_tensor;

TEST_CASE("linear forward matches hand computation") {
  Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor w = Tensor::from_vector<float>({1, 0, -1, 0.5f, 0.5f, 0.5f}, {2, 3});
  Tensor b = Tensor::from_vector<float>({10, -10}, {2});
  CHECK(linear(x, w, b).to_vector<float>() == std::vector<float>{8, -7, 8, -2.5f});
  CHECK(linear(x, w).to_vector<float>() == std::vector<float>{-2, 3, -2, 7.5f});
  CHECK_THROWS_WITH_AS(linear(x, Tensor::zeros({2, 4})), doctest::Contains("does not match input"), Error);
}

TEST_CASE("linear backward matches finite differences") {
  Tensor x = random_tensor({4, 5}, 1).set_requires_grad(true);
  Tensor w = random_tensor({3, 5}, 2).set_requires_grad(true);
  Tensor b = random_tensor({3}, 3).set_requires_grad(true);
  check_gradients([](const TensorList& t) { return linear(t[0], t[1], t[2]); }, {x, w, b});
  check_gradients([](const TensorList& t) { return linear(t[0], t[1]); }, {x, w});
}

TEST_CASE("log_softmax, nll_loss and cross_entropy match hand computation") {
  Tensor logits = Tensor::from_vector<double>({1, 2, 3, 0, 0, 0}, {2, 3});
  Tensor targets = Tensor::from_vector<int64_t>({2, 0}, {2});
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  auto lp = log_softmax(logits).to_vector<double>();
  CHECK(lp[0] == doctest::Approx(1 - lse));
  CHECK(lp[4] == doctest::Approx(-std::log(3.0)));
  const double expected = ((lse - 3) + std::log(3.0)) / 2;
  CHECK(nll_loss(log_softmax(logits), targets).item() == doctest::Approx(expected));
  CHECK(cross_entropy(logits, targets).item() == doctest::Approx(expected));
  CHECK(argmax(logits).to_vector<int64_t>() == std::vector<int64_t>{2, 0});
  CHECK(count_correct(logits, targets) == 2);
  Tensor bad = Tensor::from_vector<int64_t>({3, 0}, {2});
  CHECK_THROWS_WITH_AS(cross_entropy(logits, bad), doctest::Contains("out of range for 3 classes"), Error);
}

TEST_CASE("loss backward matches finite differences") {
  Tensor x = random_tensor({5, 7}, 4, -3, 3).set_requires_grad(true);
  Tensor targets = Tensor::from_vector<int64_t>({0, 6, 3, 3, 1}, {5});
  check_gradients([](const TensorList& t) { return log_softmax(t[0]); }, {x});
  check_gradients([&](const TensorList& t) { return nll_loss(log_softmax(t[0]), targets); }, {x});
  check_gradients([&](const TensorList& t) { return cross_entropy(t[0], targets); }, {x});
  // The fused cross_entropy equals the composed one, value and gradient.
  Tensor a = x.detach().clone().set_requires_grad(true);
  Tensor b = x.detach().clone().set_requires_grad(true);
  Tensor la = cross_entropy(a, targets), lb = nll_loss(log_softmax(b), targets);
  CHECK(la.item() == doctest::Approx(lb.item()).epsilon(1e-12));
  la.backward();
  lb.backward();
  CHECK(loom::testing::max_abs_diff(a.grad(), b.grad()) < 1e-12);
}

TEST_CASE("f16 and bf16 losses compute through f32") {
  Tensor logits = random_tensor({3, 4}, 5, -2, 2, DType::f32);
  Tensor targets = Tensor::from_vector<int64_t>({1, 2, 3}, {3});
  const double reference = cross_entropy(logits, targets).item();
  for (DType dtype : {DType::f16, DType::bf16}) {
    Tensor low = logits.to(dtype).set_requires_grad(true);
    Tensor loss = cross_entropy(low, targets);
    CHECK(loss.dtype() == dtype);
    CHECK(loss.item() == doctest::Approx(reference).epsilon(2e-2));
    loss.backward();
    CHECK(low.grad().dtype() == dtype);
  }
}
