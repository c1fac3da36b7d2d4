// MobileNetV2 with torchvision's module tree, names, parameter counts and
// initialisation, so a state_dict loads into torchvision.models.mobilenet_v2
// and back:
//
//   features: Sequential(Conv2dNormActivation(3, 32, stride 2), 17 InvertedResidual,
//                        Conv2dNormActivation(320, 1280, kernel 1))
//   -> adaptive average pool to 1x1 -> flatten -> classifier: Sequential(Dropout, Linear)
//
// An InvertedResidual block is conv: Sequential([Conv2dNormActivation 1x1
// expand], Conv2dNormActivation 3x3 depthwise, Conv2d 1x1, BatchNorm2d), plus
// its input when the stride is 1 and the channels stay.
#pragma once

#include <memory>

#include <loom/core/options.h>
#include <loom/nn/layers.h>

namespace loom::nn {

// torchvision.ops.Conv2dNormActivation with BatchNorm2d: a Sequential of
// Conv2d(kernel, stride, padding (kernel - 1) / 2, groups, no bias) ("0"),
// BatchNorm2d ("1") and the activation ("2"), when one is given.
class Conv2dNormActivation : public Sequential {
 public:
  Conv2dNormActivation(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride, int64_t groups,
                       std::shared_ptr<Module> activation);
  std::string type_name() const override { return "Conv2dNormActivation"; }
};

// torchvision's _make_divisible: v rounded to the nearest multiple of
// `divisor` (at least `divisor`), and not below 90% of v.
int64_t make_divisible(double v, int64_t divisor);

// MobileNetV2's block (see above); ReLU6 activations.
class InvertedResidual : public Module {
 public:
  InvertedResidual(int64_t in_channels, int64_t out_channels, int64_t stride, int64_t expand_ratio);
  Tensor forward(const Tensor& input) override;  // (N, in, H, W) -> (N, out, H / stride, W / stride)
  std::string type_name() const override { return "InvertedResidual"; }
  bool uses_residual() const { return use_residual_; }

  std::shared_ptr<Sequential> conv;

 private:
  bool use_residual_;
};

// MobileNetV2Options().num_classes(10)
class MobileNetV2Options {
  // Units of the final linear layer (default 1000, ImageNet's classes).
  LOOM_OPTION(int64_t, num_classes) = 1000;
  // Multiplier of every layer's channels (default 1.0; torchvision's weights are 1.0's).
  LOOM_OPTION(double, width_mult) = 1.0;
  // Dropout before the classifier's linear layer (default 0.2).
  LOOM_OPTION(double, dropout) = 0.2;
};

class MobileNetV2 : public Module {
 public:
  explicit MobileNetV2(const MobileNetV2Options& options = {});
  // (N, 3, H, W) -> (N, num_classes) logits; 32x32 (CIFAR) and larger work.
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "MobileNetV2"; }
  const MobileNetV2Options& options() const { return options_; }

  std::shared_ptr<Sequential> features, classifier;

 private:
  MobileNetV2Options options_;
};

std::shared_ptr<MobileNetV2> mobilenet_v2(const MobileNetV2Options& options = {});

// torchvision's initialisation of MobileNet, EfficientNet and VGG-style
// models: convolutions kaiming_normal_(fan_out), their biases zero, batch
// norms ones and zeros (their defaults), linear weights normal(0, `linear_std`)
// and biases zero.
void initialize_torchvision_cnn(Module& model, double linear_std);

}  // namespace loom::nn
