// efficientnet_b0: torchvision's state_dict keys and shapes (written out in
// tests/models/torchvision_keys.h from torchvision/models/efficientnet.py's
// MBConvConfig settings for B0, MBConv and EfficientNet), parameter count, the stochastic-depth
// probabilities, and a training step on CIFAR-size images.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include <loom/nn/efficientnet.h>
#include <loom/ops/elementwise.h>
#include "tests/models/torchvision_keys.h"
#include "tests/support/gradcheck.h"

using namespace loom;

TEST_SUITE_BEGIN("efficientnet");

TEST_CASE("efficientnet_b0 has torchvision's state_dict keys, shapes and parameter count") {
  const loom::testing::TorchvisionKeys keys =
      loom::testing::inverted_residual_network_keys(loom::testing::InvertedResidualNetwork::efficientnet_b0);
  const auto model = nn::efficientnet_b0(nn::EfficientNetOptions().num_classes(10));
  // torchvision's 5,288,548 (1000 classes) less 1281 * 990.
  loom::testing::check_torchvision_state(*model, keys, 4020358);
  CHECK(nn::count_parameters(*nn::efficientnet_b0()) == 5288548);
  // Stochastic depth 0.2 * k / 16 for block k: stage 6's last block (k = 14) 0.175.
  auto* stage6 = model->features->named_children()[6].second;
  auto* last = dynamic_cast<nn::MBConv*>(stage6->named_children()[3].second);
  REQUIRE(last != nullptr);
  CHECK(last->stochastic_depth->options().p() == doctest::Approx(0.2 * 14 / 16));
  // The classifier: uniform in +-1 / sqrt(10), zero bias.
  const Tensor fc = model->state_dict()[keys.size() - 2].second;
  CHECK(loom::testing::max_abs(fc) <= 1.0 / std::sqrt(10.0));
  CHECK(loom::testing::max_abs(fc) > 0.2);
}

TEST_CASE("efficientnet_b0 takes a training step on CIFAR-size images") {
  manual_seed(6);
  const auto model = nn::efficientnet_b0(nn::EfficientNetOptions().num_classes(10));
  loom::testing::check_cifar_training_step(*model, 8);
}

TEST_CASE("an MBConv block with stochastic depth: backward matches finite differences under a fixed seed") {
  // 16 -> 96 (expand, SiLU) -> depthwise 3x3 -> SE (squeeze 4, SiLU, Sigmoid) -> 16, with the residual.
  nn::MBConv block({6, 3, 1, 16, 16, 1}, 16, 1, 0.5);
  block.to(DType::f64);
  loom::testing::check_block_gradients(block, loom::testing::random_tensor({3, 16, 3, 3}, 13).set_requires_grad(true));
}

TEST_SUITE_END();
