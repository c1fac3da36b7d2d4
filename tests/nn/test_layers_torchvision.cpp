// The layers torchvision's CNN families add to the tutorials' ones: grouped
// Conv2d's weight shape and initialisation bounds, the activation and pooling
// modules, Dropout and StochasticDepth in training and evaluation, LayerNorm
// and ConvNeXt's LayerNorm2d (hand values and finite differences), Linear over
// (*, in), GELU, Permute, named Sequential children, trunc_normal_.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include <loom/core/generator.h>
#include <loom/nn/init.h>
#include <loom/nn/layers.h>
#include <loom/ops/elementwise.h>
#include "tests/support/gradcheck.h"

using namespace loom;
using loom::testing::check_gradients;
using loom::testing::random_tensor;

TEST_CASE("Conv2d with groups: weight (out, in / groups, k, k), PyTorch's bounds, depthwise forward") {
  nn::Conv2d depthwise(nn::Conv2dOptions(32, 32, 3).padding(1).groups(32).bias(false));
  CHECK(depthwise.weight.sizes() == Shape{32, 1, 3, 3});
  CHECK(!depthwise.bias.defined());
  // kaiming_uniform_(a = sqrt 5): bound = 1 / sqrt(fan_in), fan_in = (in / groups) * 9 = 9.
  CHECK(loom::testing::max_abs(depthwise.weight) <= 1.0 / 3.0);
  CHECK(loom::testing::max_abs(depthwise.weight) > 0.25);
  nn::Conv2d grouped(nn::Conv2dOptions(8, 12, 1).groups(4));
  CHECK(grouped.weight.sizes() == Shape{12, 2, 1, 1});
  CHECK(grouped.forward(Tensor::ones({2, 8, 5, 5})).sizes() == Shape{2, 12, 5, 5});
  CHECK(depthwise.forward(Tensor::ones({1, 32, 4, 4})).sizes() == Shape{1, 32, 4, 4});
  CHECK_THROWS_WITH_AS(nn::Conv2d(nn::Conv2dOptions(6, 4, 3).groups(4)), doctest::Contains("groups = 4"), Error);
}

TEST_CASE("activation and pooling modules compute their ops") {
  const Tensor x = Tensor::from_vector<float>({-4, -1, 0.5f, 7}, {1, 1, 2, 2});
  CHECK(nn::ReLU6().forward(x).to_vector<float>() == relu6(x).to_vector<float>());
  CHECK(nn::SiLU().forward(x).to_vector<float>() == silu(x).to_vector<float>());
  CHECK(nn::Hardswish().forward(x).to_vector<float>() == hardswish(x).to_vector<float>());
  CHECK(nn::Hardsigmoid().forward(x).to_vector<float>() == hardsigmoid(x).to_vector<float>());
  CHECK(nn::ReLU6().type_name() == "ReLU6");
  // (-4 - 1 + 0.5 + 7) / 4; stride defaults to the kernel size.
  CHECK(nn::AvgPool2d(nn::AvgPool2dOptions(2)).forward(x).to_vector<float>() == std::vector<float>{0.625f});
  // Padding 1 around the 2x2 plane, 3x3 window: every window holds all four values, divided by 9 or by 4.
  CHECK(nn::AvgPool2d(nn::AvgPool2dOptions(3).stride(1).padding(1)).forward(x).to_vector<float>()[0] ==
        doctest::Approx(2.5 / 9));
  CHECK(nn::AvgPool2d(nn::AvgPool2dOptions(3).stride(1).padding(1).count_include_pad(false))
            .forward(x)
            .to_vector<float>()[0] == doctest::Approx(0.625));
}

TEST_CASE("Dropout and StochasticDepth: random in training, the identity in evaluation") {
  const Tensor x = Tensor::ones({64, 3, 2, 2});
  nn::Dropout dropout(0.5);
  manual_seed(1);
  const std::vector<float> trained = dropout.forward(x).to_vector<float>();
  CHECK(std::count(trained.begin(), trained.end(), 0.0f) > 0);
  CHECK(std::count(trained.begin(), trained.end(), 2.0f) > 0);
  CHECK(std::count(trained.begin(), trained.end(), 0.0f) + std::count(trained.begin(), trained.end(), 2.0f) ==
        static_cast<std::ptrdiff_t>(trained.size()));
  dropout.eval();
  CHECK(dropout.forward(x).is_same(x));
  CHECK(nn::Dropout().options().p() == 0.5);
  CHECK_THROWS_WITH_AS(nn::Dropout(1.2), doctest::Contains("Dropout: p must be between 0 and 1, got 1.2"), Error);

  nn::StochasticDepth depth(nn::StochasticDepthOptions(0.5));
  const std::vector<float> rows = depth.forward(x).to_vector<float>();
  int64_t dropped = 0;
  for (int64_t n = 0; n < 64; ++n) dropped += rows[n * 12] == 0.0f;
  CHECK(dropped > 0);
  CHECK(dropped < 64);
  depth.eval();
  CHECK(depth.forward(x).is_same(x));
}

TEST_CASE("LayerNorm and LayerNorm2d: parameters, hand values, finite differences") {
  nn::LayerNorm norm(nn::LayerNormOptions(4).eps(0.0));
  CHECK(norm.named_parameters().size() == 2);
  CHECK(norm.weight.to_vector<float>() == std::vector<float>(4, 1.0f));
  CHECK(nn::LayerNorm(nn::LayerNormOptions(4).elementwise_affine(false)).named_parameters().empty());
  CHECK(nn::LayerNorm(nn::LayerNormOptions(4).bias(false)).named_parameters().size() == 1);
  // [1, 2, 3, 4]: mean 2.5, variance 1.25.
  const std::vector<float> y = norm.forward(Tensor::from_vector<float>({1, 2, 3, 4}, {1, 4})).to_vector<float>();
  CHECK(y[0] == doctest::Approx(-1.5 / std::sqrt(1.25)));
  CHECK(y[3] == doctest::Approx(1.5 / std::sqrt(1.25)));

  // LayerNorm2d over C at each position: channel 0 = (1, 3), channel 1 = (3, 7);
  // position 0 normalises (1, 3) -> (-1, 1), position 1 (3, 7) -> (-1, 1).
  nn::LayerNorm2d norm2d(nn::LayerNormOptions(2).eps(0.0));
  const Tensor image = Tensor::from_vector<float>({1, 3, 3, 7}, {1, 2, 1, 2});
  CHECK(norm2d.forward(image).to_vector<float>() == std::vector<float>{-1, -1, 1, 1});
  CHECK(norm2d.type_name() == "LayerNorm2d");
  CHECK_THROWS_WITH_AS(norm2d.forward(Tensor::ones({1, 3, 2, 2})), doctest::Contains("expected (N, 2, H, W)"), Error);

  nn::LayerNorm2d module(nn::LayerNormOptions(3));
  module.to(DType::f64);
  Generator(9).uniform_(module.weight, 0.5, 1.5);
  Generator(10).uniform_(module.bias, -1.0, 1.0);
  Tensor input = random_tensor({2, 3, 2, 3}, 81).set_requires_grad(true);
  check_gradients([&module](const TensorList& t) { return module.forward(t[0]); }, {input, module.weight, module.bias});
}

TEST_CASE("Linear over the last dim of (*, in), GELU, Permute and a Sequential of named children") {
  nn::Linear linear(3, 2);
  linear.to(DType::f64);
  Tensor x = random_tensor({2, 4, 5, 3}, 82).set_requires_grad(true);
  const Tensor y = linear.forward(x);
  CHECK(y.sizes() == Shape{2, 4, 5, 2});
  // Each position's row is what the 2-d linear gives it.
  const Tensor rows = linear.forward(x.detach().reshape({-1, 3}));
  CHECK(loom::testing::max_abs_diff(y.reshape({-1, 2}), rows) == 0.0);
  check_gradients([&linear](const TensorList& t) { return linear.forward(t[0]); }, {x, linear.weight, linear.bias});
  CHECK_THROWS_WITH_AS(linear.forward(Tensor::ones({2, 4, 2}, DType::f64)), doctest::Contains("is not 3"), Error);

  const Tensor v = Tensor::from_vector<double>({-1.0, 0.0, 2.0}, {3});
  CHECK(nn::GELU().forward(v).to_vector<double>() == gelu(v).to_vector<double>());
  CHECK(nn::GELU().type_name() == "GELU");

  // NCHW -> NHWC -> NCHW: the same tensor back, contiguous in between.
  nn::Permute to_last({0, 2, 3, 1}), to_first({0, 3, 1, 2});
  const Tensor image = random_tensor({2, 3, 4, 5}, 83);
  const Tensor last = to_last.forward(image);
  CHECK(last.sizes() == Shape{2, 4, 5, 3});
  CHECK(last.is_contiguous());
  CHECK(to_first.forward(last).to_vector<double>() == image.to_vector<double>());

  // PyTorch's Sequential(OrderedDict): the names are the caller's, applied in order.
  nn::Sequential named;
  named.push_back("a", std::make_shared<nn::ReLU>());
  named.push_back("b", std::make_shared<nn::Linear>(3, 1));
  const auto children = named.named_children();
  REQUIRE(children.size() == 2);
  CHECK(children[0].first == "a");
  CHECK(children[1].first == "b");
  CHECK(named.state_dict()[0].first == "b.weight");
  CHECK(named.forward(Tensor::ones({4, 3})).sizes() == Shape{4, 1});
  CHECK_THROWS_WITH_AS(named.push_back("a", std::make_shared<nn::ReLU>()), doctest::Contains("registered twice"), Error);
}

TEST_CASE("trunc_normal_: normal values within the bounds, PyTorch's truncated moments") {
  // normal(0, 1) within [-1, 2]: mean (phi(-1) - phi(2)) / Z, Z = Phi(2) - Phi(-1).
  Tensor t = Tensor::empty({200000}, DType::f64);
  nn::init::trunc_normal_(t, 0.0, 1.0, -1.0, 2.0);
  const std::vector<double> v = t.to_vector<double>();
  double sum = 0, lowest = 0, highest = 0;
  for (double x : v) {
    sum += x;
    lowest = std::min(lowest, x);
    highest = std::max(highest, x);
  }
  const auto phi = [](double x) { return std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI); };
  const auto cdf = [](double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); };
  const double expected_mean = (phi(-1.0) - phi(2.0)) / (cdf(2.0) - cdf(-1.0));
  CHECK(sum / static_cast<double>(v.size()) == doctest::Approx(expected_mean).epsilon(0.02));
  CHECK(lowest >= -1.0);
  CHECK(highest <= 2.0);
  CHECK(lowest < -0.99);
  CHECK(highest > 1.9);
  // ConvNeXt's std 0.02 within the default +-2: a plain normal(0, 0.02) in f32.
  Tensor weight = Tensor::empty({64, 64});
  nn::init::trunc_normal_(weight, 0.0, 0.02);
  CHECK(loom::testing::max_abs(weight) < 0.02 * 6);
  CHECK_THROWS_WITH_AS(nn::init::trunc_normal_(weight, 0.0, 1.0, 5.0, 6.0), doctest::Contains("at least 0.001"), Error);
  CHECK_THROWS_WITH_AS(nn::init::trunc_normal_(weight, 0.0, 1.0, 1.0, -1.0), doctest::Contains("low < high"), Error);
}
