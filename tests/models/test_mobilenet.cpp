// MobileNetV2: torchvision's state_dict keys and shapes (written out in
// tests/models/torchvision_keys.h from torchvision/models/mobilenetv2.py's
// module tree), parameter count, initialisation, forward on CIFAR-size
// images, and an inverted-residual block's backward against finite
// differences.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include <loom/nn/mobilenet.h>
#include <loom/ops/elementwise.h>
#include "tests/models/torchvision_keys.h"
#include "tests/support/gradcheck.h"

using namespace loom;
using loom::testing::random_tensor;
constexpr auto kMobileNetV2 = loom::testing::InvertedResidualNetwork::mobilenet_v2;

TEST_SUITE_BEGIN("mobilenet_v2");

TEST_CASE("mobilenet_v2 has torchvision's state_dict keys, shapes and parameter count") {
  const auto model = nn::mobilenet_v2(nn::MobileNetV2Options().num_classes(10));
  // 2,236,682 with 10 classes: torchvision's 3,504,872 less 1281 * (1000 - 10).
  const loom::testing::TorchvisionKeys keys = loom::testing::inverted_residual_network_keys(kMobileNetV2);
  loom::testing::check_torchvision_state(*model, keys, 2236682);
  CHECK(nn::count_parameters(*nn::mobilenet_v2()) == 3504872);
}

TEST_CASE("make_divisible rounds as torchvision's _make_divisible") {
  CHECK(nn::make_divisible(32, 8) == 32);
  CHECK(nn::make_divisible(32 * 0.35, 8) == 16);  // 11.2 -> 8, below 90%: 16
  CHECK(nn::make_divisible(24 * 0.5, 8) == 16);   // 12 -> 16
  CHECK(nn::make_divisible(3, 8) == 8);
  CHECK(nn::make_divisible(1280 * 1.4, 8) == 1792);
}

TEST_CASE("mobilenet_v2 initialisation: kaiming normal (fan_out) convolutions, normal(0, 0.01) classifier, zero biases") {
  manual_seed(0);
  const auto model = nn::mobilenet_v2(nn::MobileNetV2Options().num_classes(10));
  for (const auto& [name, t] : model->named_parameters()) {
    INFO(name);
    if (name.ends_with("bias")) CHECK(loom::testing::max_abs(t) == 0.0);
  }
  // The last 1x1 convolution, (1280, 320, 1, 1): std sqrt(2 / 1280).
  const size_t key_count = loom::testing::inverted_residual_network_keys(kMobileNetV2).size();
  const std::vector<float> w = model->state_dict()[key_count - 8].second.to_vector<float>();
  double squares = 0;
  for (float v : w) squares += static_cast<double>(v) * v;
  CHECK(std::sqrt(squares / static_cast<double>(w.size())) == doctest::Approx(std::sqrt(2.0 / 1280)).epsilon(0.02));
  const Tensor fc = model->state_dict()[key_count - 2].second;
  CHECK(loom::testing::max_abs(fc) < 0.06);  // 6 standard deviations of 0.01
}

TEST_CASE("mobilenet_v2 trains on CIFAR-size images: logits, gradients for every parameter") {
  manual_seed(1);
  const auto model = nn::mobilenet_v2(nn::MobileNetV2Options().num_classes(10).width_mult(0.25));
  loom::testing::check_cifar_training_step(*model, 5);
  model->eval();
  const Tensor images = random_tensor({2, 3, 32, 32}, 5, -1.0, 1.0, DType::f32);
  const Tensor a = model->forward(images), b = model->forward(images);
  CHECK(a.to_vector<float>() == b.to_vector<float>());  // evaluation: no dropout
}

TEST_CASE("an inverted residual block's backward matches finite differences") {
  for (auto [stride, expand] : {std::pair<int64_t, int64_t>{1, 2}, std::pair<int64_t, int64_t>{2, 1}}) {
    nn::InvertedResidual block(4, 4, stride, expand);
    CHECK(block.uses_residual() == (stride == 1));
    block.to(DType::f64);
    loom::testing::check_block_gradients(block, random_tensor({2, 4, 5, 5}, 7).set_requires_grad(true));
  }
}

TEST_SUITE_END();
