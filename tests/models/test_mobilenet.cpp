// MobileNetV2: torchvision's state_dict keys and shapes (written out below
// from torchvision/models/mobilenetv2.py's module tree), parameter count,
// initialisation, forward on CIFAR-size images, and an inverted-residual
// block's backward against finite differences.
#include <doctest/doctest.h>

#include <cmath>
#include <utility>

#include <loom/nn/mobilenet.h>
#include <loom/ops/elementwise.h>
#include "tests/models/torchvision_keys.h"
#include "tests/support/gradcheck.h"

using namespace loom;
using loom::testing::random_tensor;

namespace {
// torchvision.models.mobilenet_v2(num_classes=10).state_dict(): every key, in
// order, with its shape. features.0 and features.18 are Conv2dNormActivation
// (0: Conv2d, 1: BatchNorm2d, 2: ReLU6); features.1 (expand ratio 1) has
// conv.0 (depthwise Conv2dNormActivation), conv.1 (1x1 Conv2d), conv.2
// (BatchNorm2d); features.2-17 add the 1x1 expansion as conv.0.
const loom::testing::TorchvisionKeys kTorchvisionKeys = {
      {"features.0.0.weight", {32, 3, 3, 3}}, {"features.0.1.weight", {32}}, {"features.0.1.bias", {32}},
      {"features.0.1.running_mean", {32}}, {"features.0.1.running_var", {32}},
      {"features.0.1.num_batches_tracked", {}}, {"features.1.conv.0.0.weight", {32, 1, 3, 3}},
      {"features.1.conv.0.1.weight", {32}}, {"features.1.conv.0.1.bias", {32}},
      {"features.1.conv.0.1.running_mean", {32}}, {"features.1.conv.0.1.running_var", {32}},
      {"features.1.conv.0.1.num_batches_tracked", {}}, {"features.1.conv.1.weight", {16, 32, 1, 1}},
      {"features.1.conv.2.weight", {16}}, {"features.1.conv.2.bias", {16}},
      {"features.1.conv.2.running_mean", {16}}, {"features.1.conv.2.running_var", {16}},
      {"features.1.conv.2.num_batches_tracked", {}}, {"features.2.conv.0.0.weight", {96, 16, 1, 1}},
      {"features.2.conv.0.1.weight", {96}}, {"features.2.conv.0.1.bias", {96}},
      {"features.2.conv.0.1.running_mean", {96}}, {"features.2.conv.0.1.running_var", {96}},
      {"features.2.conv.0.1.num_batches_tracked", {}}, {"features.2.conv.1.0.weight", {96, 1, 3, 3}},
      {"features.2.conv.1.1.weight", {96}}, {"features.2.conv.1.1.bias", {96}},
      {"features.2.conv.1.1.running_mean", {96}}, {"features.2.conv.1.1.running_var", {96}},
      {"features.2.conv.1.1.num_batches_tracked", {}}, {"features.2.conv.2.weight", {24, 96, 1, 1}},
      {"features.2.conv.3.weight", {24}}, {"features.2.conv.3.bias", {24}},
      {"features.2.conv.3.running_mean", {24}}, {"features.2.conv.3.running_var", {24}},
      {"features.2.conv.3.num_batches_tracked", {}}, {"features.3.conv.0.0.weight", {144, 24, 1, 1}},
      {"features.3.conv.0.1.weight", {144}}, {"features.3.conv.0.1.bias", {144}},
      {"features.3.conv.0.1.running_mean", {144}}, {"features.3.conv.0.1.running_var", {144}},
      {"features.3.conv.0.1.num_batches_tracked", {}}, {"features.3.conv.1.0.weight", {144, 1, 3, 3}},
      {"features.3.conv.1.1.weight", {144}}, {"features.3.conv.1.1.bias", {144}},
      {"features.3.conv.1.1.running_mean", {144}}, {"features.3.conv.1.1.running_var", {144}},
      {"features.3.conv.1.1.num_batches_tracked", {}}, {"features.3.conv.2.weight", {24, 144, 1, 1}},
      {"features.3.conv.3.weight", {24}}, {"features.3.conv.3.bias", {24}},
      {"features.3.conv.3.running_mean", {24}}, {"features.3.conv.3.running_var", {24}},
      {"features.3.conv.3.num_batches_tracked", {}}, {"features.4.conv.0.0.weight", {144, 24, 1, 1}},
      {"features.4.conv.0.1.weight", {144}}, {"features.4.conv.0.1.bias", {144}},
      {"features.4.conv.0.1.running_mean", {144}}, {"features.4.conv.0.1.running_var", {144}},
      {"features.4.conv.0.1.num_batches_tracked", {}}, {"features.4.conv.1.0.weight", {144, 1, 3, 3}},
      {"features.4.conv.1.1.weight", {144}}, {"features.4.conv.1.1.bias", {144}},
      {"features.4.conv.1.1.running_mean", {144}}, {"features.4.conv.1.1.running_var", {144}},
      {"features.4.conv.1.1.num_batches_tracked", {}}, {"features.4.conv.2.weight", {32, 144, 1, 1}},
      {"features.4.conv.3.weight", {32}}, {"features.4.conv.3.bias", {32}},
      {"features.4.conv.3.running_mean", {32}}, {"features.4.conv.3.running_var", {32}},
      {"features.4.conv.3.num_batches_tracked", {}}, {"features.5.conv.0.0.weight", {192, 32, 1, 1}},
      {"features.5.conv.0.1.weight", {192}}, {"features.5.conv.0.1.bias", {192}},
      {"features.5.conv.0.1.running_mean", {192}}, {"features.5.conv.0.1.running_var", {192}},
      {"features.5.conv.0.1.num_batches_tracked", {}}, {"features.5.conv.1.0.weight", {192, 1, 3, 3}},
      {"features.5.conv.1.1.weight", {192}}, {"features.5.conv.1.1.bias", {192}},
      {"features.5.conv.1.1.running_mean", {192}}, {"features.5.conv.1.1.running_var", {192}},
      {"features.5.conv.1.1.num_batches_tracked", {}}, {"features.5.conv.2.weight", {32, 192, 1, 1}},
      {"features.5.conv.3.weight", {32}}, {"features.5.conv.3.bias", {32}},
      {"features.5.conv.3.running_mean", {32}}, {"features.5.conv.3.running_var", {32}},
      {"features.5.conv.3.num_batches_tracked", {}}, {"features.6.conv.0.0.weight", {192, 32, 1, 1}},
      {"features.6.conv.0.1.weight", {192}}, {"features.6.conv.0.1.bias", {192}},
      {"features.6.conv.0.1.running_mean", {192}}, {"features.6.conv.0.1.running_var", {192}},
      {"features.6.conv.0.1.num_batches_tracked", {}}, {"features.6.conv.1.0.weight", {192, 1, 3, 3}},
      {"features.6.conv.1.1.weight", {192}}, {"features.6.conv.1.1.bias", {192}},
      {"features.6.conv.1.1.running_mean", {192}}, {"features.6.conv.1.1.running_var", {192}},
      {"features.6.conv.1.1.num_batches_tracked", {}}, {"features.6.conv.2.weight", {32, 192, 1, 1}},
      {"features.6.conv.3.weight", {32}}, {"features.6.conv.3.bias", {32}},
      {"features.6.conv.3.running_mean", {32}}, {"features.6.conv.3.running_var", {32}},
      {"features.6.conv.3.num_batches_tracked", {}}, {"features.7.conv.0.0.weight", {192, 32, 1, 1}},
      {"features.7.conv.0.1.weight", {192}}, {"features.7.conv.0.1.bias", {192}},
      {"features.7.conv.0.1.running_mean", {192}}, {"features.7.conv.0.1.running_var", {192}},
      {"features.7.conv.0.1.num_batches_tracked", {}}, {"features.7.conv.1.0.weight", {192, 1, 3, 3}},
      {"features.7.conv.1.1.weight", {192}}, {"features.7.conv.1.1.bias", {192}},
      {"features.7.conv.1.1.running_mean", {192}}, {"features.7.conv.1.1.running_var", {192}},
      {"features.7.conv.1.1.num_batches_tracked", {}}, {"features.7.conv.2.weight", {64, 192, 1, 1}},
      {"features.7.conv.3.weight", {64}}, {"features.7.conv.3.bias", {64}},
      {"features.7.conv.3.running_mean", {64}}, {"features.7.conv.3.running_var", {64}},
      {"features.7.conv.3.num_batches_tracked", {}}, {"features.8.conv.0.0.weight", {384, 64, 1, 1}},
      {"features.8.conv.0.1.weight", {384}}, {"features.8.conv.0.1.bias", {384}},
      {"features.8.conv.0.1.running_mean", {384}}, {"features.8.conv.0.1.running_var", {384}},
      {"features.8.conv.0.1.num_batches_tracked", {}}, {"features.8.conv.1.0.weight", {384, 1, 3, 3}},
      {"features.8.conv.1.1.weight", {384}}, {"features.8.conv.1.1.bias", {384}},
      {"features.8.conv.1.1.running_mean", {384}}, {"features.8.conv.1.1.running_var", {384}},
      {"features.8.conv.1.1.num_batches_tracked", {}}, {"features.8.conv.2.weight", {64, 384, 1, 1}},
      {"features.8.conv.3.weight", {64}}, {"features.8.conv.3.bias", {64}},
      {"features.8.conv.3.running_mean", {64}}, {"features.8.conv.3.running_var", {64}},
      {"features.8.conv.3.num_batches_tracked", {}}, {"features.9.conv.0.0.weight", {384, 64, 1, 1}},
      {"features.9.conv.0.1.weight", {384}}, {"features.9.conv.0.1.bias", {384}},
      {"features.9.conv.0.1.running_mean", {384}}, {"features.9.conv.0.1.running_var", {384}},
      {"features.9.conv.0.1.num_batches_tracked", {}}, {"features.9.conv.1.0.weight", {384, 1, 3, 3}},
      {"features.9.conv.1.1.weight", {384}}, {"features.9.conv.1.1.bias", {384}},
      {"features.9.conv.1.1.running_mean", {384}}, {"features.9.conv.1.1.running_var", {384}},
      {"features.9.conv.1.1.num_batches_tracked", {}}, {"features.9.conv.2.weight", {64, 384, 1, 1}},
      {"features.9.conv.3.weight", {64}}, {"features.9.conv.3.bias", {64}},
      {"features.9.conv.3.running_mean", {64}}, {"features.9.conv.3.running_var", {64}},
      {"features.9.conv.3.num_batches_tracked", {}}, {"features.10.conv.0.0.weight", {384, 64, 1, 1}},
      {"features.10.conv.0.1.weight", {384}}, {"features.10.conv.0.1.bias", {384}},
      {"features.10.conv.0.1.running_mean", {384}}, {"features.10.conv.0.1.running_var", {384}},
      {"features.10.conv.0.1.num_batches_tracked", {}}, {"features.10.conv.1.0.weight", {384, 1, 3, 3}},
      {"features.10.conv.1.1.weight", {384}}, {"features.10.conv.1.1.bias", {384}},
      {"features.10.conv.1.1.running_mean", {384}}, {"features.10.conv.1.1.running_var", {384}},
      {"features.10.conv.1.1.num_batches_tracked", {}}, {"features.10.conv.2.weight", {64, 384, 1, 1}},
      {"features.10.conv.3.weight", {64}}, {"features.10.conv.3.bias", {64}},
      {"features.10.conv.3.running_mean", {64}}, {"features.10.conv.3.running_var", {64}},
      {"features.10.conv.3.num_batches_tracked", {}}, {"features.11.conv.0.0.weight", {384, 64, 1, 1}},
      {"features.11.conv.0.1.weight", {384}}, {"features.11.conv.0.1.bias", {384}},
      {"features.11.conv.0.1.running_mean", {384}}, {"features.11.conv.0.1.running_var", {384}},
      {"features.11.conv.0.1.num_batches_tracked", {}}, {"features.11.conv.1.0.weight", {384, 1, 3, 3}},
      {"features.11.conv.1.1.weight", {384}}, {"features.11.conv.1.1.bias", {384}},
      {"features.11.conv.1.1.running_mean", {384}}, {"features.11.conv.1.1.running_var", {384}},
      {"features.11.conv.1.1.num_batches_tracked", {}}, {"features.11.conv.2.weight", {96, 384, 1, 1}},
      {"features.11.conv.3.weight", {96}}, {"features.11.conv.3.bias", {96}},
      {"features.11.conv.3.running_mean", {96}}, {"features.11.conv.3.running_var", {96}},
      {"features.11.conv.3.num_batches_tracked", {}}, {"features.12.conv.0.0.weight", {576, 96, 1, 1}},
      {"features.12.conv.0.1.weight", {576}}, {"features.12.conv.0.1.bias", {576}},
      {"features.12.conv.0.1.running_mean", {576}}, {"features.12.conv.0.1.running_var", {576}},
      {"features.12.conv.0.1.num_batches_tracked", {}}, {"features.12.conv.1.0.weight", {576, 1, 3, 3}},
      {"features.12.conv.1.1.weight", {576}}, {"features.12.conv.1.1.bias", {576}},
      {"features.12.conv.1.1.running_mean", {576}}, {"features.12.conv.1.1.running_var", {576}},
      {"features.12.conv.1.1.num_batches_tracked", {}}, {"features.12.conv.2.weight", {96, 576, 1, 1}},
      {"features.12.conv.3.weight", {96}}, {"features.12.conv.3.bias", {96}},
      {"features.12.conv.3.running_mean", {96}}, {"features.12.conv.3.running_var", {96}},
      {"features.12.conv.3.num_batches_tracked", {}}, {"features.13.conv.0.0.weight", {576, 96, 1, 1}},
      {"features.13.conv.0.1.weight", {576}}, {"features.13.conv.0.1.bias", {576}},
      {"features.13.conv.0.1.running_mean", {576}}, {"features.13.conv.0.1.running_var", {576}},
      {"features.13.conv.0.1.num_batches_tracked", {}}, {"features.13.conv.1.0.weight", {576, 1, 3, 3}},
      {"features.13.conv.1.1.weight", {576}}, {"features.13.conv.1.1.bias", {576}},
      {"features.13.conv.1.1.running_mean", {576}}, {"features.13.conv.1.1.running_var", {576}},
      {"features.13.conv.1.1.num_batches_tracked", {}}, {"features.13.conv.2.weight", {96, 576, 1, 1}},
      {"features.13.conv.3.weight", {96}}, {"features.13.conv.3.bias", {96}},
      {"features.13.conv.3.running_mean", {96}}, {"features.13.conv.3.running_var", {96}},
      {"features.13.conv.3.num_batches_tracked", {}}, {"features.14.conv.0.0.weight", {576, 96, 1, 1}},
      {"features.14.conv.0.1.weight", {576}}, {"features.14.conv.0.1.bias", {576}},
      {"features.14.conv.0.1.running_mean", {576}}, {"features.14.conv.0.1.running_var", {576}},
      {"features.14.conv.0.1.num_batches_tracked", {}}, {"features.14.conv.1.0.weight", {576, 1, 3, 3}},
      {"features.14.conv.1.1.weight", {576}}, {"features.14.conv.1.1.bias", {576}},
      {"features.14.conv.1.1.running_mean", {576}}, {"features.14.conv.1.1.running_var", {576}},
      {"features.14.conv.1.1.num_batches_tracked", {}}, {"features.14.conv.2.weight", {160, 576, 1, 1}},
      {"features.14.conv.3.weight", {160}}, {"features.14.conv.3.bias", {160}},
      {"features.14.conv.3.running_mean", {160}}, {"features.14.conv.3.running_var", {160}},
      {"features.14.conv.3.num_batches_tracked", {}}, {"features.15.conv.0.0.weight", {960, 160, 1, 1}},
      {"features.15.conv.0.1.weight", {960}}, {"features.15.conv.0.1.bias", {960}},
      {"features.15.conv.0.1.running_mean", {960}}, {"features.15.conv.0.1.running_var", {960}},
      {"features.15.conv.0.1.num_batches_tracked", {}}, {"features.15.conv.1.0.weight", {960, 1, 3, 3}},
      {"features.15.conv.1.1.weight", {960}}, {"features.15.conv.1.1.bias", {960}},
      {"features.15.conv.1.1.running_mean", {960}}, {"features.15.conv.1.1.running_var", {960}},
      {"features.15.conv.1.1.num_batches_tracked", {}}, {"features.15.conv.2.weight", {160, 960, 1, 1}},
      {"features.15.conv.3.weight", {160}}, {"features.15.conv.3.bias", {160}},
      {"features.15.conv.3.running_mean", {160}}, {"features.15.conv.3.running_var", {160}},
      {"features.15.conv.3.num_batches_tracked", {}}, {"features.16.conv.0.0.weight", {960, 160, 1, 1}},
      {"features.16.conv.0.1.weight", {960}}, {"features.16.conv.0.1.bias", {960}},
      {"features.16.conv.0.1.running_mean", {960}}, {"features.16.conv.0.1.running_var", {960}},
      {"features.16.conv.0.1.num_batches_tracked", {}}, {"features.16.conv.1.0.weight", {960, 1, 3, 3}},
      {"features.16.conv.1.1.weight", {960}}, {"features.16.conv.1.1.bias", {960}},
      {"features.16.conv.1.1.running_mean", {960}}, {"features.16.conv.1.1.running_var", {960}},
      {"features.16.conv.1.1.num_batches_tracked", {}}, {"features.16.conv.2.weight", {160, 960, 1, 1}},
      {"features.16.conv.3.weight", {160}}, {"features.16.conv.3.bias", {160}},
      {"features.16.conv.3.running_mean", {160}}, {"features.16.conv.3.running_var", {160}},
      {"features.16.conv.3.num_batches_tracked", {}}, {"features.17.conv.0.0.weight", {960, 160, 1, 1}},
      {"features.17.conv.0.1.weight", {960}}, {"features.17.conv.0.1.bias", {960}},
      {"features.17.conv.0.1.running_mean", {960}}, {"features.17.conv.0.1.running_var", {960}},
      {"features.17.conv.0.1.num_batches_tracked", {}}, {"features.17.conv.1.0.weight", {960, 1, 3, 3}},
      {"features.17.conv.1.1.weight", {960}}, {"features.17.conv.1.1.bias", {960}},
      {"features.17.conv.1.1.running_mean", {960}}, {"features.17.conv.1.1.running_var", {960}},
      {"features.17.conv.1.1.num_batches_tracked", {}}, {"features.17.conv.2.weight", {320, 960, 1, 1}},
      {"features.17.conv.3.weight", {320}}, {"features.17.conv.3.bias", {320}},
      {"features.17.conv.3.running_mean", {320}}, {"features.17.conv.3.running_var", {320}},
      {"features.17.conv.3.num_batches_tracked", {}}, {"features.18.0.weight", {1280, 320, 1, 1}},
      {"features.18.1.weight", {1280}}, {"features.18.1.bias", {1280}}, {"features.18.1.running_mean", {1280}},
      {"features.18.1.running_var", {1280}}, {"features.18.1.num_batches_tracked", {}},
      {"classifier.1.weight", {10, 1280}}, {"classifier.1.bias", {10}},
};

bool is_buffer(const std::string& name) {
  return name.ends_with("running_mean") || name.ends_with("running_var") || name.ends_with("num_batches_tracked");
}
}  // namespace
TEST_SUITE_BEGIN("mobilenet_v2");

TEST_CASE("mobilenet_v2 has torchvision's state_dict keys, shapes and parameter count") {
  const auto model = nn::mobilenet_v2(nn::MobileNetV2Options().num_classes(10));
  loom::testing::check_torchvision_keys(*model, kTorchvisionKeys);
  // 2,236,682 with 10 classes: torchvision's 3,504,872 less 1281 * (1000 - 10).
  CHECK(nn::count_parameters(*model) == 2236682);
  CHECK(nn::count_parameters(*nn::mobilenet_v2()) == 3504872);
  int64_t parameters = 0;
  for (const auto& [name, t] : kTorchvisionKeys) parameters += is_buffer(name) ? 0 : shape_numel(t);
  CHECK(parameters == 2236682);
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
  const std::vector<float> w = model->state_dict()[kTorchvisionKeys.size() - 8].second.to_vector<float>();
  double squares = 0;
  for (float v : w) squares += static_cast<double>(v) * v;
  CHECK(std::sqrt(squares / static_cast<double>(w.size())) == doctest::Approx(std::sqrt(2.0 / 1280)).epsilon(0.02));
  const Tensor fc = model->state_dict()[kTorchvisionKeys.size() - 2].second;
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
