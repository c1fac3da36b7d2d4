// The activations of MobileNet and EfficientNet (silu, sigmoid, hardswish,
// hardsigmoid, relu6): values computed by hand from PyTorch's formulas, and
// backward against finite differences away from the kinks.
#include <doctest/doctest.h>

#include <initializer_list>
#include <utility>

#include <loom/ops/elementwise.h>
#include "tests/support/gradcheck.h"

using namespace loom;
using loom::testing::check_gradients;
using loom::testing::random_tensor;

namespace {

void check_values(Tensor (*op)(const Tensor&), const std::vector<double>& x, const std::vector<double>& expected) {
  const Tensor input = Tensor::from_vector<double>(x, {static_cast<int64_t>(x.size())});
  const std::vector<double> y = op(input).to_vector<double>();
  const std::vector<float> y32 = op(input.to(DType::f32)).to_vector<float>();
  for (size_t i = 0; i < x.size(); ++i) {
    INFO("x = ", x[i]);
    CHECK(y[i] == doctest::Approx(expected[i]).epsilon(1e-14));
    CHECK(y32[i] == doctest::Approx(expected[i]).epsilon(1e-6));
  }
  CHECK(op(input.to(DType::bf16)).dtype() == DType::bf16);
}

// An f64 leaf of 4 x 5 values per interval, drawn inside each (low, high): the
// intervals keep the values off an activation's kinks.
Tensor leaf_in(std::initializer_list<std::pair<double, double>> intervals, uint64_t seed) {
  const int64_t count = static_cast<int64_t>(intervals.size());
  Tensor t = Tensor::empty({count * 4, 5}, DType::f64);
  int64_t row = 0;
  for (const auto& [low, high] : intervals) {
    t.slice(0, row, row + 4).copy_(random_tensor({4, 5}, seed + row, low, high));
    row += 4;
  }
  return t.set_requires_grad(true);
}

}  // namespace

TEST_CASE("silu: x * sigmoid(x), and finite differences") {
  // sigmoid(1) = 1 / (1 + e^-1) = 0.7310585786300049, sigmoid(-2) = 0.11920292202211755,
  // sigmoid(3) = 0.9525741268224334.
  check_values(silu, {1.0, -2.0, 0.0, 3.0}, {0.7310585786300049, -0.2384058440442351, 0.0, 2.8577223804673002});
  Tensor x = random_tensor({4, 9}, 11, -6.0, 6.0).set_requires_grad(true);
  check_gradients([](const TensorList& t) { return silu(t[0]); }, {x});
}

TEST_CASE("sigmoid: 1 / (1 + exp(-x)), and finite differences") {
  check_values(sigmoid, {1.0, -2.0, 0.0, 3.0}, {0.7310585786300049, 0.11920292202211755, 0.5, 0.9525741268224334});
  Tensor x = random_tensor({4, 9}, 15, -6.0, 6.0).set_requires_grad(true);
  check_gradients([](const TensorList& t) { return sigmoid(t[0]); }, {x});
}

TEST_CASE("hardswish: x * relu6(x + 3) / 6, and finite differences") {
  // -1 * 2 / 6 = -1/3; 1.5 * 4.5 / 6 = 1.125.
  check_values(hardswish, {-4.0, -3.0, -1.0, 0.0, 1.5, 3.0, 5.0}, {0.0, 0.0, -1.0 / 3.0, 0.0, 1.125, 3.0, 5.0});
  Tensor x = leaf_in({{-6.0, -3.1}, {-2.9, 2.9}, {3.1, 6.0}}, 12);
  check_gradients([](const TensorList& t) { return hardswish(t[0]); }, {x});
}

TEST_CASE("hardsigmoid: relu6(x + 3) / 6, and finite differences") {
  check_values(hardsigmoid, {-4.0, -1.5, 0.0, 1.5, 3.0, 4.0}, {0.0, 0.25, 0.5, 0.75, 1.0, 1.0});
  Tensor x = leaf_in({{-6.0, -3.1}, {-2.9, 2.9}, {3.1, 6.0}}, 13);
  check_gradients([](const TensorList& t) { return hardsigmoid(t[0]); }, {x});
}

TEST_CASE("relu6: min(max(x, 0), 6), and finite differences") {
  check_values(relu6, {-1.0, 0.0, 2.5, 6.0, 7.0}, {0.0, 0.0, 2.5, 6.0, 6.0});
  Tensor x = leaf_in({{-3.0, -0.1}, {0.1, 5.9}, {6.1, 9.0}}, 14);
  check_gradients([](const TensorList& t) { return relu6(t[0]); }, {x});
}

TEST_CASE("activation gradients at the kinks take PyTorch's one-sided values") {
  // hardswish_backward: 0 below -3, x / 3 + 1/2 on [-3, 3], 1 above;
  // hardsigmoid and relu6 (hardtanh): zero on the boundary.
  const Tensor x = Tensor::from_vector<double>({-3.0, 3.0}, {2});
  using Op = Tensor (*)(const Tensor&);
  for (auto [op, expected] : {std::pair<Op, std::vector<double>>{hardswish, {-0.5, 1.5}},
                              std::pair<Op, std::vector<double>>{hardsigmoid, {0.0, 0.0}}}) {
    Tensor leaf = x.clone().set_requires_grad(true);
    sum(op(leaf)).backward();
    CHECK(leaf.grad().to_vector<double>() == expected);
  }
  Tensor leaf = Tensor::from_vector<double>({0.0, 6.0}, {2}).set_requires_grad(true);
  sum(relu6(leaf)).backward();
  CHECK(leaf.grad().to_vector<double>() == std::vector<double>{0.0, 0.0});
}
