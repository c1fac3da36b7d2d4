// VGG with batch norm (torchvision's vgg11_bn, vgg16_bn): torchvision's module
// tree, names, parameter counts and initialisation, so a state_dict loads
// into torchvision.models.vgg11_bn / vgg16_bn and back:
//
//   features: Sequential of [Conv2d 3x3 pad 1 (bias), BatchNorm2d, ReLU] per
//             configured width and MaxPool2d(2) per "M"
//   -> avgpool: AdaptiveAvgPool2d(7, 7) -> flatten
//   -> classifier: Sequential(Linear(512*7*7, 4096), ReLU, Dropout,
//                             Linear(4096, 4096), ReLU, Dropout, Linear(4096, num_classes))
//
// On 32x32 images the features end at 1x1, which the pool spreads to 7x7, as
// in torchvision.
#pragma once

#include <memory>
#include <vector>

#include <loom/core/options.h>
#include <loom/nn/layers.h>

namespace loom::nn {

// VGGOptions().num_classes(10)
class VGGOptions {
  // Units of the final linear layer (default 1000, ImageNet's classes).
  LOOM_OPTION(int64_t, num_classes) = 1000;
  // Dropout in the classifier (default 0.5).
  LOOM_OPTION(double, dropout) = 0.5;
};

class VGG : public Module {
 public:
  // `widths`: convolution widths in order, 0 standing for a 2x2 max pool
  // (torchvision's "M"); each convolution is followed by BatchNorm2d and ReLU.
  VGG(const std::vector<int64_t>& widths, const VGGOptions& options = {});
  // (N, 3, H, W) -> (N, num_classes) logits; 32x32 and larger.
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "VGG"; }
  const VGGOptions& options() const { return options_; }

  std::shared_ptr<Sequential> features;
  std::shared_ptr<AdaptiveAvgPool2d> avgpool;
  std::shared_ptr<Sequential> classifier;

 private:
  VGGOptions options_;
};

std::shared_ptr<VGG> vgg11_bn(const VGGOptions& options = {});
std::shared_ptr<VGG> vgg16_bn(const VGGOptions& options = {});

}  // namespace loom::nn
