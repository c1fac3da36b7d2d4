// ConvNeXt (torchvision.models.convnext) with torchvision's module tree,
// names, parameter counts and initialisation, so a state_dict loads into
// torchvision.models.convnext_tiny and back:
//
//   features: Sequential(
//     Sequential(Conv2d(3, 96, 4x4 stride 4, bias), LayerNorm2d(96)),   the stem
//     stage 1: Sequential of CNBlock(96) x 3,
//     Sequential(LayerNorm2d(96), Conv2d(96, 192, 2x2 stride 2, bias)),  downsampling
//     stage 2: CNBlock(192) x 3, downsampling to 384,
//     stage 3: CNBlock(384) x 9, downsampling to 768,
//     stage 4: CNBlock(768) x 3)
//   -> average pool to 1x1 -> classifier: Sequential(LayerNorm2d(768), Flatten, Linear)
//
// CNBlock(C): x + stochastic_depth(layer_scale * block(x)), block =
// Sequential(Conv2d(C, C, 7x7, padding 3, groups C, bias) ("0"), permute to
// NHWC ("1"), LayerNorm(C) ("2"), Linear(C, 4C) ("3"), GELU ("4"),
// Linear(4C, C) ("5"), permute back ("6")); layer_scale a (C, 1, 1) parameter
// (1e-6 at first) broadcast over the batch; stochastic depth "row" with the
// probability growing linearly from 0 over the blocks to stochastic_depth_prob
// at the last. Every LayerNorm has eps 1e-6. Convolution and linear weights
// start truncated-normal (std 0.02, within +-2), their biases zero.
#pragma once

#include <memory>

#include <loom/core/options.h>
#include <loom/nn/mobilenet.h>

namespace loom::nn {

// ConvNeXt's block (see above).
class CNBlock : public Module {
 public:
  CNBlock(int64_t channels, double layer_scale, double stochastic_depth_prob);
  // (N, C, H, W) -> (N, C, H, W).
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "CNBlock"; }

  Tensor layer_scale;  // (C, 1, 1)
  std::shared_ptr<Sequential> block;
  std::shared_ptr<StochasticDepth> stochastic_depth;
};

// One ConvNeXt stage: its blocks' channels, the channels the downsampling
// after it leads to (0: none, the last stage), blocks (torchvision's CNBlockConfig).
struct CNBlockConfig {
  int64_t input_channels, out_channels, num_layers;
};

// ConvNeXtOptions().num_classes(10)
class ConvNeXtOptions {
  // Units of the final linear layer (default 1000, ImageNet's classes).
  LOOM_OPTION(int64_t, num_classes) = 1000;
  // The last block's stochastic-depth probability (default 0.1, convnext_tiny's).
  LOOM_OPTION(double, stochastic_depth_prob) = 0.1;
  // The layer scales' initial value (default 1e-6).
  LOOM_OPTION(double, layer_scale) = 1e-6;
};

// The MobileNets' shape (features, pool, classifier), but the classifier
// takes the pooled (N, C, 1, 1) features: its LayerNorm2d comes before its
// Flatten, as in torchvision.
class ConvNeXt : public PooledClassifier<ConvNeXtOptions> {
 public:
  ConvNeXt(const std::vector<CNBlockConfig>& block_setting, const ConvNeXtOptions& options = {});
  // (N, 3, H, W) -> (N, num_classes) logits; 32x32 and larger.
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "ConvNeXt"; }

  std::shared_ptr<AdaptiveAvgPool2d> avgpool;
};

// torchvision's convnext_tiny: stages of 3, 3, 9, 3 blocks at 96, 192, 384, 768
// channels; 28,589,128 parameters at 1000 classes.
std::shared_ptr<ConvNeXt> convnext_tiny(const ConvNeXtOptions& options = {});

}  // namespace loom::nn
