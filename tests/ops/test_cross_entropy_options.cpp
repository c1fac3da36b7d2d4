// cross_entropy's label_smoothing and ignore_index (PyTorch's
// nn.CrossEntropyLoss semantics): the value against the definition
// -Σ_c q[c] log softmax(x)[c], q = (1 - ε) onehot + ε / C, averaged over the
// rows not ignored (and a number computed apart with Python's math module),
// and the gradient against f64 finite differences.
#include <doctest/doctest.h>

#include <cmath>

#include <loom/core/error.h>
#include <loom/ops/loss.h>
#include "tests/support/gradcheck.h"

using namespace loom;
using loom::testing::check_gradients;
using loom::testing::random_tensor;

namespace {
// The definition, row by row, for targets of which `ignore` marks the skipped.
double reference_loss(const std::vector<std::vector<double>>& x, const std::vector<int64_t>& targets,
                      double smoothing, int64_t ignore) {
  double total = 0;
  int rows = 0;
  for (size_t n = 0; n < x.size(); ++n) {
    if (targets[n] == ignore) continue;
    ++rows;
    double sum_exp = 0;
    for (double v : x[n]) sum_exp += std::exp(v);
    const double classes = static_cast<double>(x[n].size());
    for (size_t c = 0; c < x[n].size(); ++c) {
      const double q = (static_cast<int64_t>(c) == targets[n] ? 1 - smoothing : 0) + smoothing / classes;
      total -= q * (x[n][c] - std::log(sum_exp));
    }
  }
  return total / rows;
}
}  // namespace

TEST_CASE("cross_entropy with label smoothing and ignored rows matches the definition") {
  const std::vector<std::vector<double>> rows = {{1, 2, 3}, {0, 0, 0}, {2, -1, 0.5}};
  Tensor logits = Tensor::from_vector<double>({1, 2, 3, 0, 0, 0, 2, -1, 0.5}, {3, 3});
  Tensor targets = Tensor::from_vector<int64_t>({2, -100, 0}, {3});
  const auto options = CrossEntropyOptions().label_smoothing(0.1);
  const double loss = cross_entropy(logits, targets, options).item();
  CHECK(loss == doctest::Approx(reference_loss(rows, {2, -100, 0}, 0.1, -100)).epsilon(1e-12));
  // Python: (lse(x0) - 0.9 * 3 - 0.1 / 3 * 6 + lse(x2) - 0.9 * 2 - 0.1 / 3 * 1.5) / 2
  CHECK(loss == doctest::Approx(0.4494586305507685).epsilon(1e-12));
  // Without smoothing: the mean of -log p[target] over the two rows kept.
  const double plain = cross_entropy(logits, targets).item();
  CHECK(plain == doctest::Approx(reference_loss(rows, {2, -100, 0}, 0.0, -100)).epsilon(1e-12));
  // Any ignore_index, also a real class: rows with target 1 are skipped, the others smoothed.
  Tensor with_ones = Tensor::from_vector<int64_t>({1, 2, 1}, {3});
  CHECK(cross_entropy(logits, with_ones, CrossEntropyOptions().ignore_index(1).label_smoothing(0.3)).item() ==
        doctest::Approx(reference_loss(rows, {1, 2, 1}, 0.3, 1)).epsilon(1e-12));
  // ε = 1: the uniform target, whatever the labels.
  CHECK(cross_entropy(logits, Tensor::from_vector<int64_t>({0, 1, 2}, {3}), CrossEntropyOptions().label_smoothing(1))
            .item() == doctest::Approx(reference_loss(rows, {1, 1, 1}, 1.0, -100)).epsilon(1e-12));
}

TEST_CASE("cross_entropy options: every row ignored is NaN, as PyTorch; bad values are refused") {
  Tensor logits = Tensor::from_vector<double>({1, 2, 3, 0, 0, 0}, {2, 3});
  CHECK(std::isnan(cross_entropy(logits, Tensor::from_vector<int64_t>({-100, -100}, {2})).item()));
  CHECK_THROWS_WITH_AS(cross_entropy(logits, Tensor::from_vector<int64_t>({0, 1}, {2}),
                                     CrossEntropyOptions().label_smoothing(1.5)),
                       doctest::Contains("label_smoothing must be in [0, 1], got 1.5"), Error);
  // A target that is neither a class nor ignore_index is still an error.
  CHECK_THROWS_WITH_AS(cross_entropy(logits, Tensor::from_vector<int64_t>({-1, 1}, {2})),
                       doctest::Contains("target -1 at position 0 is out of range for 3 classes"), Error);
}

TEST_CASE("cross_entropy with label smoothing and ignore_index: gradient against finite differences") {
  Tensor x = random_tensor({6, 5}, 14, -3, 3).set_requires_grad(true);
  Tensor targets = Tensor::from_vector<int64_t>({0, 4, -100, 3, -100, 1}, {6});
  for (double smoothing : {0.0, 0.1, 0.5}) {
    INFO("label_smoothing ", smoothing);
    const auto options = CrossEntropyOptions().label_smoothing(smoothing);
    check_gradients([&](const TensorList& t) { return cross_entropy(t[0], targets, options); }, {x});
  }
  // Ignored rows get exactly zero gradient.
  Tensor y = random_tensor({6, 5}, 15, -3, 3).set_requires_grad(true);
  cross_entropy(y, targets, CrossEntropyOptions().label_smoothing(0.2)).backward();
  const std::vector<double> g = y.grad().to_vector<double>();
  for (int64_t row : {2, 4}) {
    for (int64_t c = 0; c < 5; ++c) CHECK(g[static_cast<size_t>(row * 5 + c)] == 0.0);
  }
}

TEST_CASE("f16 scores with label smoothing compute through f32") {
  Tensor logits = random_tensor({4, 6}, 16, -2, 2, DType::f32);
  Tensor targets = Tensor::from_vector<int64_t>({1, -100, 5, 0}, {4});
  const auto options = CrossEntropyOptions().label_smoothing(0.1);
  const double reference = cross_entropy(logits, targets, options).item();
  Tensor low = logits.to(DType::f16).set_requires_grad(true);
  Tensor loss = cross_entropy(low, targets, options);
  CHECK(loss.item() == doctest::Approx(reference).epsilon(2e-2));
  loss.backward();
  CHECK(low.grad().dtype() == DType::f16);
}
