// layer_norm over the last dimension: rows normalised by hand, backward
// against finite differences (input, weight, bias).
#include <doctest/doctest.h>

#include <cmath>

#include <loom/ops/elementwise.h>
#include <loom/ops/layer_norm.h>
#include "tests/support/gradcheck.h"

using namespace loom;
using loom::testing::check_gradients;
using loom::testing::random_tensor;

TEST_CASE("layer_norm normalises each row by hand") {
  // Row [1, 2, 3, 4]: mean 2.5, biased variance 1.25, xhat = [-1.5, -0.5, 0.5, 1.5] / sqrt(1.25).
  // Row [0, 0, 0, 2]: mean 0.5, variance 0.75, xhat = [-0.5, -0.5, -0.5, 1.5] / sqrt(0.75).
  const Tensor x = Tensor::from_vector<double>({1, 2, 3, 4, 0, 0, 0, 2}, {2, 4});
  const Tensor w = Tensor::from_vector<double>({1, 2, 0.5, -1}, {4});
  const Tensor b = Tensor::from_vector<double>({0, 1, 0, 0.5}, {4});
  const double s1 = 1 / std::sqrt(1.25), s2 = 1 / std::sqrt(0.75);
  const std::vector<double> expected{-1.5 * s1,       -0.5 * s1 * 2 + 1, 0.5 * s1 * 0.5,   1.5 * s1 * -1 + 0.5,
                                     -0.5 * s2,       -0.5 * s2 * 2 + 1, -0.5 * s2 * 0.5, 1.5 * s2 * -1 + 0.5};
  const std::vector<double> y = layer_norm(x, w, b, 0.0).to_vector<double>();
  for (size_t i = 0; i < y.size(); ++i) CHECK(y[i] == doctest::Approx(expected[i]).epsilon(1e-14));
  // No affine parameters, PyTorch's default eps = 1e-5 inside the square root.
  const std::vector<double> plain = layer_norm(x, Tensor(), Tensor()).to_vector<double>();
  CHECK(plain[0] == doctest::Approx(-1.5 / std::sqrt(1.25 + 1e-5)).epsilon(1e-14));
  CHECK(plain[7] == doctest::Approx(1.5 / std::sqrt(0.75 + 1e-5)).epsilon(1e-14));
  // f32, and bf16 computed in f32.
  const std::vector<float> y32 = layer_norm(x.to(DType::f32), w.to(DType::f32), b.to(DType::f32), 0.0).to_vector<float>();
  for (size_t i = 0; i < y32.size(); ++i) CHECK(y32[i] == doctest::Approx(expected[i]).epsilon(1e-6));
  CHECK(layer_norm(x.to(DType::bf16), w.to(DType::bf16), b.to(DType::bf16)).dtype() == DType::bf16);
}

TEST_CASE("layer_norm backward matches finite differences") {
  Tensor x = random_tensor({2, 3, 7}, 51, -2.0, 2.0).set_requires_grad(true);
  Tensor w = random_tensor({7}, 52, 0.5, 1.5).set_requires_grad(true);
  Tensor b = random_tensor({7}, 53).set_requires_grad(true);
  check_gradients([](const TensorList& t) { return layer_norm(t[0], t[1], t[2]); }, {x, w, b});
  check_gradients([](const TensorList& t) { return layer_norm(t[0], Tensor(), Tensor(), 1e-3); }, {x});
  // Through a permute, as ConvNeXt's LayerNorm2d uses it (NCHW -> NHWC -> NCHW).
  Tensor image = random_tensor({2, 5, 3, 2}, 54).set_requires_grad(true);
  Tensor w5 = random_tensor({5}, 55, 0.5, 1.5).set_requires_grad(true);
  Tensor b5 = random_tensor({5}, 56).set_requires_grad(true);
  check_gradients(
      [](const TensorList& t) {
        return layer_norm(t[0].permute({0, 2, 3, 1}).contiguous(), t[1], t[2]).permute({0, 3, 1, 2}).contiguous();
      },
      {image, w5, b5});
}

TEST_CASE("layer_norm refuses parameters of the wrong size") {
  const Tensor x = Tensor::zeros({2, 4});
  CHECK_THROWS_WITH_AS(layer_norm(x, Tensor::ones({3}), Tensor()),
                       doctest::Contains("expected a weight of shape [4] (the input's last dimension), got [3]"), Error);
  CHECK_THROWS_WITH_AS(layer_norm(x, Tensor(), Tensor::ones({4}, DType::f64)), doctest::Contains("different dtypes"),
                       Error);
}
