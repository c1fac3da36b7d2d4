// cat: values by hand along each dim, backward against finite differences,
// and the errors for shapes that cannot be joined.
#include <doctest/doctest.h>

#include <loom/ops/cat.h>
#include <loom/ops/elementwise.h>
#include "tests/support/gradcheck.h"

using namespace loom;
using loom::testing::check_gradients;
using loom::testing::random_tensor;

TEST_CASE("cat joins along a dim") {
  const Tensor a = Tensor::from_vector<double>({1, 2, 3, 4}, {2, 2});
  const Tensor b = Tensor::from_vector<double>({5, 6}, {1, 2});
  const Tensor c = Tensor::from_vector<double>({7, 8}, {2, 1});
  CHECK(cat({a, b}, 0).sizes() == Shape{3, 2});
  CHECK(cat({a, b}, 0).to_vector<double>() == std::vector<double>{1, 2, 3, 4, 5, 6});
  CHECK(cat({a, c}, 1).to_vector<double>() == std::vector<double>{1, 2, 7, 3, 4, 8});
  CHECK(cat({c, a, c}, -1).to_vector<double>() == std::vector<double>{7, 1, 2, 7, 8, 3, 4, 8});
  // Channels of NCHW: (1, 1, 1, 2) and (1, 2, 1, 2) give (1, 3, 1, 2).
  const Tensor x = Tensor::from_vector<float>({1, 2}, {1, 1, 1, 2});
  const Tensor y = Tensor::from_vector<float>({3, 4, 5, 6}, {1, 2, 1, 2});
  CHECK(cat({x, y}, 1).to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
  CHECK(cat({x}, 1).to_vector<float>() == std::vector<float>{1, 2});
}

TEST_CASE("cat backward matches finite differences") {
  Tensor a = random_tensor({2, 3, 4, 2}, 41).set_requires_grad(true);
  Tensor b = random_tensor({2, 5, 4, 2}, 42).set_requires_grad(true);
  Tensor c = random_tensor({2, 1, 4, 2}, 43).set_requires_grad(true);
  check_gradients([](const TensorList& t) { return cat({t[0], t[1], t[2]}, 1); }, {a, b, c});
  // A tensor used twice gets both slices' gradients.
  check_gradients([](const TensorList& t) { return cat({t[0], mul(t[0], t[0])}, 3); }, {a});
  Tensor d = random_tensor({3, 2}, 44).set_requires_grad(true);
  Tensor e = random_tensor({4, 2}, 45).set_requires_grad(true);
  check_gradients([](const TensorList& t) { return cat({t[0], t[1]}, 0); }, {d, e});
}

TEST_CASE("cat refuses tensors that cannot be joined") {
  const Tensor a = Tensor::zeros({2, 3});
  CHECK_THROWS_WITH_AS(cat({}, 0), doctest::Contains("at least one"), Error);
  CHECK_THROWS_WITH_AS(cat({a, Tensor::zeros({2, 4})}, 0), doctest::Contains("tensor 1 has shape [2, 4]"), Error);
  CHECK_THROWS_WITH_AS(cat({a, Tensor::zeros({2, 3, 1})}, 0), doctest::Contains("tensor 1 has shape"), Error);
  CHECK_THROWS_WITH_AS(cat({a, a}, 2), doctest::Contains("dim 2 is out of range"), Error);
  CHECK_THROWS_WITH_AS(cat({a, Tensor::zeros({2, 3}, DType::f64)}, 0), doctest::Contains("different dtypes"), Error);
}
