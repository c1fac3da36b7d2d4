// What the torchvision model tests share: a model's state_dict against
// torchvision's keys and shapes (which the test files write out, in order, as
// a TorchvisionKeys list, with the builders below), one training step on
// CIFAR-size images, and a block's gradients against finite differences.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <loom/nn/module.h>
#include <loom/ops/elementwise.h>
#include "tests/support/gradcheck.h"

namespace loom::testing {

using TorchvisionKeys = std::vector<std::pair<std::string, Shape>>;

// The pieces torchvision's module trees repeat, for the tests that write a
// model's keys out from its configuration. Each prefix ends with a dot.

// BatchNorm2d: its parameters, then its buffers.
inline void add_batch_norm(TorchvisionKeys& keys, const std::string& prefix, int64_t channels) {
  for (const char* name : {"weight", "bias", "running_mean", "running_var"}) {
    keys.push_back({prefix + name, {channels}});
  }
  keys.push_back({prefix + "num_batches_tracked", {}});
}

// Conv2dNormActivation: 0 a square Conv2d without bias, 1 its BatchNorm2d.
inline void add_conv_norm(TorchvisionKeys& keys, const std::string& prefix, int64_t out_channels,
                          int64_t in_channels_per_group, int64_t kernel) {
  keys.push_back({prefix + "0.weight", {out_channels, in_channels_per_group, kernel, kernel}});
  add_batch_norm(keys, prefix + "1.", out_channels);
}

// SqueezeExcitation: fc1 (channels -> squeeze) and fc2 (back), 1x1 convolutions with bias.
inline void add_squeeze_excitation(TorchvisionKeys& keys, const std::string& prefix, int64_t channels,
                                   int64_t squeeze_channels) {
  keys.push_back({prefix + "fc1.weight", {squeeze_channels, channels, 1, 1}});
  keys.push_back({prefix + "fc1.bias", {squeeze_channels}});
  keys.push_back({prefix + "fc2.weight", {channels, squeeze_channels, 1, 1}});
  keys.push_back({prefix + "fc2.bias", {channels}});
}

// How an inverted-residual block stores its 1x1 projection: as one
// Conv2dNormActivation (MBConv, MobileNetV3), or as a Conv2d and a
// BatchNorm2d of their own numbers (MobileNetV2).
enum class Projection { conv_norm, conv_then_batch_norm };

// One inverted-residual block as its keys show it: channels, depthwise kernel, parts.
struct InvertedResidualLayout {
  int64_t in_channels, expanded_channels, out_channels, kernel;
  int64_t squeeze_channels = 0;  // 0: no squeeze-and-excitation
  Projection projection = Projection::conv_norm;
};

// An inverted-residual block's layers under `prefix`, numbered from 0: the 1x1
// expansion (only where expanded_channels differs from in_channels), the
// depthwise kernel x kernel convolution, the squeeze-and-excitation, and the
// projection.
inline void add_inverted_residual(TorchvisionKeys& keys, const std::string& prefix,
                                  const InvertedResidualLayout& block) {
  int64_t layer = 0;
  const auto next_layer = [&] { return prefix + std::to_string(layer++) + "."; };
  const int64_t expanded = block.expanded_channels;
  if (expanded != block.in_channels) add_conv_norm(keys, next_layer(), expanded, block.in_channels, 1);
  add_conv_norm(keys, next_layer(), expanded, 1, block.kernel);
  if (block.squeeze_channels != 0) add_squeeze_excitation(keys, next_layer(), expanded, block.squeeze_channels);
  if (block.projection == Projection::conv_norm) {
    add_conv_norm(keys, next_layer(), block.out_channels, expanded, 1);
  } else {
    keys.push_back({next_layer() + "weight", {block.out_channels, expanded, 1, 1}});
    add_batch_norm(keys, next_layer(), block.out_channels);
  }
}

// Linear: weight (out, in) and bias.
inline void add_linear(TorchvisionKeys& keys, const std::string& prefix, int64_t out_features, int64_t in_features) {
  keys.push_back({prefix + "weight", {out_features, in_features}});
  keys.push_back({prefix + "bias", {out_features}});
}

// torchvision's two networks of inverted-residual stages in one frame.
enum class InvertedResidualNetwork { mobilenet_v2, efficientnet_b0 };

// torchvision.models.<network>(num_classes=10).state_dict(): every key, in
// order, with its shape. Both networks: features.0 a 3x3
// Conv2dNormActivation (0: Conv2d, 1: BatchNorm2d) from RGB to 32 channels;
// the blocks of the network's settings rows (mobilenetv2.py's
// inverted_residual_setting, B0's MBConvConfig rows in efficientnet.py:
// expand ratio, depthwise kernel, output channels, layers; the stride changes
// no key); a 1x1 Conv2dNormActivation to 1280 channels; classifier.1 the
// linear layer (classifier.0 is a dropout).
// mobilenet_v2 numbers its blocks features.1-17, each one's layers under
// conv: features.1 (expand ratio 1) has conv.0 (depthwise
// Conv2dNormActivation), conv.1 (1x1 Conv2d), conv.2 (BatchNorm2d);
// features.2-17 add the 1x1 expansion as conv.0.
// efficientnet_b0 numbers its stages features.1-7 and their blocks within,
// each block's layers under block: Sequential([expand], depthwise,
// SqueezeExcitation (fc1, fc2), project), squeezing to a quarter of the
// block's input channels.
inline TorchvisionKeys inverted_residual_network_keys(InvertedResidualNetwork network) {
  struct Stage {
    int64_t expand_ratio, kernel, out_channels, layers;
  };
  const bool mobilenet = network == InvertedResidualNetwork::mobilenet_v2;
  const std::vector<Stage> stages =
      mobilenet ? std::vector<Stage>{{1, 3, 16, 1}, {6, 3, 24, 2}, {6, 3, 32, 3}, {6, 3, 64, 4},
                                     {6, 3, 96, 3}, {6, 3, 160, 3}, {6, 3, 320, 1}}
                : std::vector<Stage>{{1, 3, 16, 1},  {6, 3, 24, 2},  {6, 5, 40, 2}, {6, 3, 80, 3},
                                     {6, 5, 112, 3}, {6, 5, 192, 4}, {6, 3, 320, 1}};
  TorchvisionKeys keys;
  add_conv_norm(keys, "features.0.", 32, 3, 3);
  int64_t feature = 1, in_channels = 32;
  for (size_t stage = 0; stage < stages.size(); ++stage) {
    const Stage& setting = stages[stage];
    for (int64_t layer = 0; layer < setting.layers; ++layer) {
      InvertedResidualLayout block{.in_channels = in_channels,
                                   .expanded_channels = in_channels * setting.expand_ratio,
                                   .out_channels = setting.out_channels,
                                   .kernel = setting.kernel};
      std::string prefix;
      if (mobilenet) {
        block.projection = Projection::conv_then_batch_norm;
        prefix = "features." + std::to_string(feature++) + ".conv.";
      } else {
        block.squeeze_channels = in_channels / 4;
        prefix = "features." + std::to_string(stage + 1) + "." + std::to_string(layer) + ".block.";
      }
      add_inverted_residual(keys, prefix, block);
      in_channels = setting.out_channels;
    }
  }
  const size_t last = mobilenet ? static_cast<size_t>(feature) : stages.size() + 1;
  add_conv_norm(keys, "features." + std::to_string(last) + ".", 1280, in_channels, 1);
  add_linear(keys, "classifier.1.", 10, 1280);
  return keys;
}

// Every key of model.state_dict(), in order, equals torchvision's, with its shape.
inline void check_torchvision_keys(const nn::Module& model, const TorchvisionKeys& expected) {
  const nn::NamedTensors state = model.state_dict();
  REQUIRE(state.size() == expected.size());
  for (size_t i = 0; i < state.size(); ++i) {
    INFO("key ", i, ": ", state[i].first);
    CHECK(state[i].first == expected[i].first);
    CHECK(state[i].second.sizes() == expected[i].second);
  }
}

// check_torchvision_keys, and the model's parameter count: torchvision's
// `parameter_count`, which the expected shapes (all but the batch norms'
// buffers) must add up to as well.
inline void check_torchvision_state(const nn::Module& model, const TorchvisionKeys& expected,
                                    int64_t parameter_count) {
  check_torchvision_keys(model, expected);
  CHECK(nn::count_parameters(model) == parameter_count);
  int64_t listed = 0;
  for (const auto& [name, shape] : expected) {
    const bool buffer =
        name.ends_with("running_mean") || name.ends_with("running_var") || name.ends_with("num_batches_tracked");
    if (!buffer) listed += shape_numel(shape);
  }
  CHECK(listed == parameter_count);
}

// A 10-class model's forward on two random 32x32 RGB images gives (2, 10)
// logits, and backward reaches every parameter.
inline void check_cifar_training_step(nn::Module& model, uint64_t seed) {
  const Tensor images = random_tensor({2, 3, 32, 32}, seed, -1.0, 1.0, DType::f32);
  const Tensor logits = model.forward(images);
  CHECK(logits.sizes() == Shape{2, 10});
  sum(mul(logits, logits)).backward();
  for (const auto& [name, t] : model.named_parameters()) {
    INFO(name);
    CHECK(t.grad().defined());
  }
}

// A block's backward against finite differences for its f64 input and every
// parameter, the default generator reseeded before each evaluation so that a
// block with stochastic depth drops the same samples every time.
inline void check_block_gradients(nn::Module& block, const Tensor& input, double tolerance = 1e-5) {
  TensorList inputs{input};
  for (const Tensor& p : block.parameters()) inputs.push_back(p);
  check_gradients(
      [&block](const TensorList& t) {
        manual_seed(4);
        return block.forward(t[0]);
      },
      inputs, tolerance);
}

}  // namespace loom::testing
