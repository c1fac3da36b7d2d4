// convnext_tiny: torchvision's state_dict keys and shapes (written out below
// from torchvision/models/convnext.py's module tree), parameter count, the
// stochastic-depth probabilities, initialisation (truncated normal, layer
// scale 1e-6), a training step on CIFAR-size images, and a CNBlock's backward
// against finite differences.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include <loom/nn/convnext.h>
#include <loom/ops/autocast.h>
#include <loom/ops/elementwise.h>
#include "tests/models/torchvision_keys.h"
#include "tests/support/gradcheck.h"

using namespace loom;

namespace {
// torchvision.models.convnext_tiny(num_classes=N).state_dict(): features.0
// the stem (0: Conv2d 4x4/4 with bias, 1: LayerNorm2d); features.1, 3, 5, 7
// the stages (3, 3, 9, 3 CNBlocks of 96, 192, 384, 768 channels), each block's
// layer_scale (C, 1, 1) before block.0 (depthwise 7x7 with bias), block.2
// (LayerNorm), block.3 and block.5 (Linear C -> 4C -> C); features.2, 4, 6 the
// downsampling (0: LayerNorm2d, 1: Conv2d 2x2/2 with bias); classifier.0
// (LayerNorm2d) and classifier.2 (Linear). 182 keys.
loom::testing::TorchvisionKeys torchvision_keys(int64_t num_classes) {
  loom::testing::TorchvisionKeys keys = {{"features.0.0.weight", {96, 3, 4, 4}}, {"features.0.0.bias", {96}},
                                         {"features.0.1.weight", {96}},          {"features.0.1.bias", {96}}};
  const int64_t depths[] = {3, 3, 9, 3}, channels[] = {96, 192, 384, 768};
  for (int stage = 0; stage < 4; ++stage) {
    const int64_t c = channels[stage];
    for (int64_t j = 0; j < depths[stage]; ++j) {
      const std::string block = "features." + std::to_string(2 * stage + 1) + "." + std::to_string(j) + ".";
      keys.push_back({block + "layer_scale", {c, 1, 1}});
      keys.push_back({block + "block.0.weight", {c, 1, 7, 7}});
      keys.push_back({block + "block.0.bias", {c}});
      keys.push_back({block + "block.2.weight", {c}});
      keys.push_back({block + "block.2.bias", {c}});
      keys.push_back({block + "block.3.weight", {4 * c, c}});
      keys.push_back({block + "block.3.bias", {4 * c}});
      keys.push_back({block + "block.5.weight", {c, 4 * c}});
      keys.push_back({block + "block.5.bias", {c}});
    }
    if (stage < 3) {
      const std::string down = "features." + std::to_string(2 * stage + 2) + ".";
      keys.push_back({down + "0.weight", {c}});
      keys.push_back({down + "0.bias", {c}});
      keys.push_back({down + "1.weight", {2 * c, c, 2, 2}});
      keys.push_back({down + "1.bias", {2 * c}});
    }
  }
  for (const auto& [key, shape] : loom::testing::TorchvisionKeys{{"classifier.0.weight", {768}},
                                                                 {"classifier.0.bias", {768}},
                                                                 {"classifier.2.weight", {num_classes, 768}},
                                                                 {"classifier.2.bias", {num_classes}}})
    keys.push_back({key, shape});
  return keys;
}
}  // namespace

TEST_SUITE_BEGIN("convnext");

TEST_CASE("convnext_tiny has torchvision's state_dict keys, shapes, parameter count and initialisation") {
  // At 1000 classes (one model of 28M parameters for the whole case: each costs 28M truncated-normal draws).
  manual_seed(5);
  const auto model = nn::convnext_tiny();
  const loom::testing::TorchvisionKeys keys = torchvision_keys(1000);
  CHECK(keys.size() == 182);
  loom::testing::check_torchvision_state(*model, keys, 28589128);  // torchvision's
  // Stochastic depth 0.1 * k / 17 for block k: stage 3's last block (k = 14) and the last block (k = 17).
  auto* stage3 = model->features->named_children()[5].second;
  auto* stage4 = model->features->named_children()[7].second;
  auto* block14 = dynamic_cast<nn::CNBlock*>(stage3->named_children()[8].second);
  auto* last = dynamic_cast<nn::CNBlock*>(stage4->named_children()[2].second);
  REQUIRE((block14 != nullptr && last != nullptr));
  CHECK(block14->stochastic_depth->options().p() == doctest::Approx(0.1 * 14 / 17));
  CHECK(last->stochastic_depth->options().p() == doctest::Approx(0.1));
  CHECK(last->stochastic_depth->options().mode() == StochasticDepthMode::row);
  // Convolution and linear weights: truncated normal, std 0.02 (the +-2 bounds are 100 standard deviations);
  // biases zero; layer norms ones and zeros; layer scales 1e-6.
  for (const auto& [name, p] : model->named_parameters()) {
    INFO(name);
    const std::vector<double> v = p.to_vector<double>();
    double squares = 0;
    for (double x : v) squares += x * x;
    const double rms = std::sqrt(squares / static_cast<double>(v.size()));
    if (name.ends_with("layer_scale")) {
      CHECK(loom::testing::max_abs(p) == doctest::Approx(1e-6));
      CHECK(rms == doctest::Approx(1e-6));
    } else if (p.dim() >= 2) {
      CHECK(rms == doctest::Approx(0.02).epsilon(p.numel() >= 1000 ? 0.1 : 0.5));
      CHECK(loom::testing::max_abs(p) < 0.02 * 7);
    } else if (name.ends_with("weight")) {
      CHECK(rms == 1.0);  // layer norms
    } else {
      CHECK(rms == 0.0);  // every bias
    }
  }
}

TEST_CASE("convnext_tiny takes a training step on CIFAR-size images") {
  manual_seed(8);
  const auto model = nn::convnext_tiny(nn::ConvNeXtOptions().num_classes(10));
  CHECK(nn::count_parameters(*model) == 27827818);  // torchvision's at 10 classes: 28,589,128 less 769 * 990
  loom::testing::check_cifar_training_step(*model, 10);
  CHECK_THROWS_WITH_AS(model->forward(Tensor::zeros({1, 3, 16, 16})), doctest::Contains("at least 32x32"), Error);
}

TEST_CASE("a CNBlock with layer scale and stochastic depth: backward matches finite differences under a fixed seed") {
  // 8 channels: depthwise 7x7 -> NHWC -> LayerNorm -> Linear 8 -> 32 -> GELU -> Linear 32 -> 8 -> NCHW, times
  // the (8, 1, 1) layer scale, stochastic depth 0.5 by sample, plus the input.
  nn::CNBlock block(8, 1e-6, 0.5);
  block.to(DType::f64);
  {
    NoGradGuard no_grad;  // a layer scale of 1e-6 would hide the block's gradients from the comparison
    block.layer_scale.copy_(loom::testing::random_tensor({8, 1, 1}, 5, 0.5, 1.5));
  }
  Tensor x = loom::testing::random_tensor({4, 8, 5, 5}, 19).set_requires_grad(true);
  CHECK(block.parameters().size() == 9);  // layer_scale, the depthwise conv's 2, the layer norm's 2, the linears' 4
  loom::testing::check_block_gradients(block, x);
  // Evaluation: no drop, x + layer_scale * block(x).
  block.eval();
  const Tensor expected = add(x.detach(), mul(block.layer_scale.detach(), block.block->forward(x.detach())));
  CHECK(loom::testing::max_abs_diff(block.forward(x.detach()), expected) < 1e-12);
}

TEST_CASE("a CNBlock under autocast (amp O1): bf16 linear layers, f32 layer norm, scale and result") {
  manual_seed(2);
  nn::CNBlock block(8, 0.5, 0.0);
  const Tensor x = loom::testing::random_tensor({2, 8, 4, 4}, 3, -1.0, 1.0, DType::f32);
  const Tensor reference = block.forward(x);
  Tensor mixed, from_bf16;
  {
    ops::AutocastGuard autocast(true, DType::bf16);
    mixed = block.forward(x);
    // A stage's first block takes the downsampling convolution's bf16 output: the shortcut is promoted too.
    from_bf16 = block.forward(x.to(DType::bf16));
  }
  CHECK(mixed.dtype() == DType::f32);
  CHECK(from_bf16.dtype() == DType::f32);
  CHECK(loom::testing::relative_error(mixed, reference) < 0.05);
  CHECK(loom::testing::relative_error(from_bf16, reference) < 0.05);
  sum(mixed).backward();
  for (const auto& [name, p] : block.named_parameters()) {
    INFO(name);
    REQUIRE(p.grad().defined());
    CHECK(p.grad().dtype() == DType::f32);
  }
}

TEST_SUITE_END();
