// MobileNetV3 small and large: torchvision's state_dict keys and shapes
// (written out below from torchvision/models/mobilenetv3.py's
// _mobilenet_v3_conf and module tree), parameter counts, the batch norms'
// eps and momentum, squeeze-and-excitation by hand, and a training step on
// CIFAR-size images.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <loom/nn/mobilenet.h>
#include <loom/ops/elementwise.h>
#include "tests/models/torchvision_keys.h"
#include "tests/support/gradcheck.h"

using namespace loom;

namespace {
using loom::testing::add_conv_norm;

// One row of mobilenetv3.py's _mobilenet_v3_conf: kernel, expanded and output
// channels, and the squeeze-and-excitation's squeeze channels
// (_make_divisible(expanded // 4, 8); 0 without one). Activation and stride
// change no key.
struct BlockSetting {
  int64_t kernel, expanded_channels, out_channels, squeeze_channels;
};

// torchvision.models.mobilenet_v3_<size>(num_classes=10).state_dict():
// features.0 (16 channels) and the last features entry (6x the last block's
// output) are Conv2dNormActivation; each features.{i}.block is
// Sequential([expand], depthwise, [SqueezeExcitation (fc1, fc2)], project),
// the expansion only where it widens; classifier.0 and .3 are the linear layers.
loom::testing::TorchvisionKeys torchvision_keys(const std::vector<BlockSetting>& blocks, int64_t last_channels) {
  loom::testing::TorchvisionKeys keys;
  add_conv_norm(keys, "features.0.", 16, 3, 3);
  int64_t feature = 1, in_channels = 16;
  for (const BlockSetting& setting : blocks) {
    loom::testing::add_inverted_residual(keys, "features." + std::to_string(feature++) + ".block.",
                                         {.in_channels = in_channels,
                                          .expanded_channels = setting.expanded_channels,
                                          .out_channels = setting.out_channels,
                                          .kernel = setting.kernel,
                                          .squeeze_channels = setting.squeeze_channels});
    in_channels = setting.out_channels;
  }
  add_conv_norm(keys, "features." + std::to_string(feature) + ".", 6 * in_channels, in_channels, 1);
  loom::testing::add_linear(keys, "classifier.0.", last_channels, 6 * in_channels);
  loom::testing::add_linear(keys, "classifier.3.", 10, last_channels);
  return keys;
}

// mobilenet_v3_large's 15 blocks and mobilenet_v3_small's 11, four to a line.
const loom::testing::TorchvisionKeys kLargeKeys =
    torchvision_keys({{3, 16, 16, 0}, {3, 64, 24, 0}, {3, 72, 24, 0}, {5, 72, 40, 24},
                      {5, 120, 40, 32}, {5, 120, 40, 32}, {3, 240, 80, 0}, {3, 200, 80, 0},
                      {3, 184, 80, 0}, {3, 184, 80, 0}, {3, 480, 112, 120}, {3, 672, 112, 168},
                      {5, 672, 160, 168}, {5, 960, 160, 240}, {5, 960, 160, 240}},
                     1280);
const loom::testing::TorchvisionKeys kSmallKeys =
    torchvision_keys({{3, 16, 16, 8}, {3, 72, 24, 0}, {3, 88, 24, 0}, {5, 96, 40, 24},
                      {5, 240, 40, 64}, {5, 240, 40, 64}, {5, 120, 48, 32}, {5, 144, 48, 40},
                      {5, 288, 96, 72}, {5, 576, 96, 144}, {5, 576, 96, 144}},
                     1024);

}  // namespace
TEST_SUITE_BEGIN("mobilenet_v3");

TEST_CASE("mobilenet_v3_large and mobilenet_v3_small have torchvision's keys, shapes and parameter counts") {
  const auto large = nn::mobilenet_v3_large(nn::MobileNetV3Options().num_classes(10));
  // torchvision's 5,483,032 (1000 classes) less 1281 * 990.
  loom::testing::check_torchvision_state(*large, kLargeKeys, 4214842);
  CHECK(nn::count_parameters(*nn::mobilenet_v3_large()) == 5483032);
  const auto small = nn::mobilenet_v3_small(nn::MobileNetV3Options().num_classes(10));
  // torchvision's 2,542,856 less 1025 * 990.
  loom::testing::check_torchvision_state(*small, kSmallKeys, 1528106);
  // width_mult scales every layer, the classifier's hidden one too (torchvision
  // 0.29's mobilenet_v3_small / _large(width_mult=0.5): 917,264 and 1,734,576,
  // hidden widths 512 and 640).
  const auto half = nn::MobileNetV3Options().width_mult(0.5);
  CHECK(nn::count_parameters(*nn::mobilenet_v3_small(half)) == 917264);
  CHECK(nn::count_parameters(*nn::mobilenet_v3_large(half)) == 1734576);
  // Batch norms: eps 0.001, momentum 0.01.
  for (auto& [name, module] : small->named_modules()) {
    if (auto* bn = module->batch_norm_to_synchronize()) {
      INFO(name);
      CHECK(bn->options().eps() == 1e-3);
      CHECK(bn->options().momentum() == 0.01);
    }
  }
}

TEST_CASE("SqueezeExcitation scales each channel by hardsigmoid(fc2(relu(fc1(mean))))") {
  nn::SqueezeExcitation se(2, 1, std::make_shared<nn::ReLU>(), std::make_shared<nn::Hardsigmoid>());
  // fc1: squeeze = 1 * mean0 + 2 * mean1 - 1; fc2: channel c gets w_c * relu(squeeze) + b_c.
  se.fc1->weight.copy_(Tensor::from_vector<float>({1, 2}, {1, 2, 1, 1}));
  se.fc1->bias.fill_(-1);
  se.fc2->weight.copy_(Tensor::from_vector<float>({0.5f, -1}, {2, 1, 1, 1}));
  se.fc2->bias.copy_(Tensor::from_vector<float>({0, 1}, {2}));
  // Channel means 1 and 2: squeeze = 1 + 4 - 1 = 4; fc2 = (2, -3); hardsigmoid = ((2 + 3) / 6, 0).
  const Tensor x = Tensor::from_vector<float>({0, 2, 1, 3}, {1, 2, 1, 2});
  const std::vector<float> y = se.forward(x).to_vector<float>();
  CHECK(y[0] == 0.0f);
  CHECK(y[1] == doctest::Approx(2.0 * 5 / 6));
  CHECK(y[2] == 0.0f);
  CHECK(y[3] == 0.0f);
}

TEST_CASE("mobilenet_v3_small takes a training step on CIFAR-size images") {
  manual_seed(2);
  const auto model = nn::mobilenet_v3_small(nn::MobileNetV3Options().num_classes(10));
  loom::testing::check_cifar_training_step(*model, 4);
}

TEST_CASE("a MobileNetV3 block with squeeze-and-excitation: backward matches finite differences") {
  // 8 -> 16 (expand, Hardswish) -> depthwise 3x3 -> SE (squeeze 8) -> 8, with the residual.
  nn::InvertedResidualV3 block({8, 3, 16, 8, true, true, 1}, 1.0);
  block.to(DType::f64);
  loom::testing::check_block_gradients(block, loom::testing::random_tensor({2, 8, 4, 4}, 12).set_requires_grad(true));
}

TEST_SUITE_END();
