// EfficientNet-B0 with torchvision's module tree, names, parameter counts and
// initialisation, so a state_dict loads into torchvision.models.efficientnet_b0
// and back:
//
//   features: Sequential(Conv2dNormActivation(3, 32, stride 2, SiLU),
//                        7 stages, each a Sequential of MBConv blocks,
//                        Conv2dNormActivation(320, 1280, kernel 1, SiLU))
//   -> average pool -> classifier: Sequential(Dropout, Linear)
//
// MBConv: block = Sequential([Conv2dNormActivation 1x1 expand], depthwise
// Conv2dNormActivation, SqueezeExcitation (SiLU, Sigmoid), Conv2dNormActivation
// 1x1 project without activation); with the stride 1 and the channels
// unchanged, stochastic_depth(block(x)) + x, the drop probability growing
// linearly from 0 over the blocks (0.2 * block index / 16).
#pragma once

#include <memory>

#include <loom/core/options.h>
#include <loom/nn/mobilenet.h>

namespace loom::nn {

// One MBConv stage of torchvision's configuration (MBConvConfig at width and
// depth 1): expansion, kernel, first stride, channels in and out, blocks.
struct MBConvStage {
  int64_t expand_ratio, kernel, stride, in_channels, out_channels, blocks;
};

class MBConv : public InvertedResidualBlock {
 public:
  // `in_channels` / `stride` are this block's (the stage's for its first block only).
  MBConv(const MBConvStage& stage, int64_t in_channels, int64_t stride, double stochastic_depth_prob);
  std::string type_name() const override { return "MBConv"; }

  std::shared_ptr<StochasticDepth> stochastic_depth;

 private:
  Tensor residual_branch(const Tensor& out) override { return stochastic_depth->forward(out); }
};

// EfficientNetOptions().num_classes(10)
class EfficientNetOptions {
  // Units of the final linear layer (default 1000, ImageNet's classes).
  LOOM_OPTION(int64_t, num_classes) = 1000;
  // Dropout before the classifier (default 0.2, B0's).
  LOOM_OPTION(double, dropout) = 0.2;
  // The last block's stochastic-depth probability (default 0.2).
  LOOM_OPTION(double, stochastic_depth_prob) = 0.2;
};

class EfficientNet : public PooledClassifier<EfficientNetOptions> {
 public:
  explicit EfficientNet(const EfficientNetOptions& options = {});
  std::string type_name() const override { return "EfficientNet"; }
};

std::shared_ptr<EfficientNet> efficientnet_b0(const EfficientNetOptions& options = {});

}  // namespace loom::nn
