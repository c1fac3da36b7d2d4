// Dropout and stochastic depth: the share of dropped elements and rows, the
// inverted scaling, the identity in evaluation, the backward mask, and finite
// differences under a fixed seed.
#include <doctest/doctest.h>

#include <cmath>

#include <loom/core/generator.h>
#include <loom/ops/dropout.h>
#include <loom/ops/elementwise.h>
#include "tests/support/gradcheck.h"

using namespace loom;
using loom::testing::check_gradients;
using loom::testing::random_tensor;

TEST_CASE("dropout drops a share p and scales the rest by 1 / (1 - p)") {
  manual_seed(7);
  const int64_t n = 200000;
  Tensor x = random_tensor({n}, 1, 1.0, 2.0).set_requires_grad(true);
  for (double p : {0.2, 0.5}) {
    x.set_grad(Tensor());
    const Tensor y = dropout(x, p, true);
    const std::vector<double> xs = x.to_vector<double>(), ys = y.to_vector<double>();
    int64_t dropped = 0;
    bool scaled = true;
    for (int64_t i = 0; i < n; ++i) {
      if (ys[i] == 0.0) {
        ++dropped;
      } else {
        scaled = scaled && std::abs(ys[i] - xs[i] / (1.0 - p)) < 1e-12;
      }
    }
    CHECK(scaled);
    // Binomial(n, p): 6 standard deviations, sqrt(n p (1 - p)) <= 224; a fixed seed, so not flaky.
    CHECK(std::abs(static_cast<double>(dropped) - p * n) < 6 * std::sqrt(n * p * (1 - p)));
    // Backward: the gradient is the mask, 0 where dropped and 1 / (1 - p) elsewhere.
    sum(y).backward();
    const std::vector<double> dx = x.grad().to_vector<double>();
    bool mask = true;
    for (int64_t i = 0; i < n; ++i) mask = mask && dx[i] == (ys[i] == 0.0 ? 0.0 : 1.0 / (1.0 - p));
    CHECK(mask);
  }
  // The mask depends on the global generator: the same seed gives the same mask.
  manual_seed(3);
  const std::vector<double> first = dropout(x, 0.5, true).to_vector<double>();
  manual_seed(3);
  CHECK(dropout(x, 0.5, true).to_vector<double>() == first);
  CHECK(dropout(x, 0.5, true).to_vector<double>() != first);
}

TEST_CASE("dropout: identity in evaluation and for p = 0, zeros for p = 1, bad p refused") {
  const Tensor x = random_tensor({3, 4}, 2);
  CHECK(dropout(x, 0.5, false).is_same(x));
  CHECK(dropout(x, 0.0, true).is_same(x));
  CHECK(dropout(x, 1.0, true).to_vector<double>() == std::vector<double>(12, 0.0));
  CHECK_THROWS_WITH_AS(dropout(x, 1.5, true), doctest::Contains("between 0 and 1"), Error);
  CHECK_THROWS_WITH_AS(dropout(x, -0.1, true), doctest::Contains("between 0 and 1"), Error);
  CHECK(dropout(x.to(DType::bf16), 0.5, true).dtype() == DType::bf16);
}

TEST_CASE("dropout and stochastic depth backward match finite differences under a fixed mask") {
  Tensor x = random_tensor({4, 3, 2, 5}, 3).set_requires_grad(true);
  check_gradients(
      [](const TensorList& t) {
        manual_seed(11);  // the same mask for every evaluation
        return dropout(t[0], 0.4, true);
      },
      {x});
  check_gradients(
      [](const TensorList& t) {
        manual_seed(12);
        return stochastic_depth(t[0], 0.4, StochasticDepthMode::row, true);
      },
      {x});
}

TEST_CASE("stochastic depth (row) drops whole samples, scales the survivors by 1 / (1 - p)") {
  manual_seed(5);
  const int64_t n = 4000;
  const double p = 0.25;
  const Tensor x = Tensor::ones({n, 2, 3, 3}, DType::f64);
  const Tensor y = stochastic_depth(x, p, StochasticDepthMode::row, true);
  const std::vector<double> ys = y.to_vector<double>();
  int64_t dropped = 0;
  bool whole_rows = true;
  for (int64_t i = 0; i < n; ++i) {
    const double first = ys[i * 18];
    whole_rows = whole_rows && (first == 0.0 || std::abs(first - 1.0 / (1.0 - p)) < 1e-12);
    for (int64_t j = 1; j < 18; ++j) whole_rows = whole_rows && ys[i * 18 + j] == first;
    dropped += first == 0.0;
  }
  CHECK(whole_rows);
  CHECK(std::abs(static_cast<double>(dropped) - p * n) < 6 * std::sqrt(n * p * (1 - p)));
  // Evaluation and p = 0: the input itself (torchvision returns it unchanged).
  CHECK(stochastic_depth(x, p, StochasticDepthMode::row, false).is_same(x));
  CHECK(stochastic_depth(x, 0.0, StochasticDepthMode::row, true).is_same(x));
  // Batch mode: one draw for all, so the output is all zeros or all 1 / (1 - p).
  const std::vector<double> batch = stochastic_depth(x, 0.5, StochasticDepthMode::batch, true).to_vector<double>();
  CHECK((batch == std::vector<double>(batch.size(), 0.0) || batch == std::vector<double>(batch.size(), 2.0)));
  CHECK(parse_stochastic_depth_mode("row") == StochasticDepthMode::row);
  CHECK_THROWS_WITH_AS(parse_stochastic_depth_mode("rows"), doctest::Contains("\"row\" or \"batch\""), Error);
}
