// MobileNetV2 and V3 (small, large) with torchvision's module trees, names,
// parameter counts and initialisation, so a state_dict loads into
// torchvision.models.mobilenet_v2 / mobilenet_v3_small / mobilenet_v3_large
// and back. MobileNetV2:
//
//   features: Sequential(Conv2dNormActivation(3, 32, stride 2), 17 InvertedResidual,
//                        Conv2dNormActivation(320, 1280, kernel 1))
//   -> adaptive average pool to 1x1 -> flatten -> classifier: Sequential(Dropout, Linear)
//
// An InvertedResidual block is conv: Sequential([Conv2dNormActivation 1x1
// expand], Conv2dNormActivation 3x3 depthwise, Conv2d 1x1, BatchNorm2d), plus
// its input when the stride is 1 and the channels stay.
//
// MobileNetV3: features: Sequential(Conv2dNormActivation(3, 16, stride 2,
// Hardswish), the configured blocks (InvertedResidualV3: block =
// Sequential([1x1 expand], depthwise, [SqueezeExcitation], 1x1 project)), a
// last 1x1 Conv2dNormActivation to 6x the channels) -> average pool ->
// classifier: Sequential(Linear, Hardswish, Dropout, Linear). Batch norms use
// eps 0.001 and momentum 0.01.
#pragma once

#include <memory>

#include <loom/core/options.h>
#include <loom/nn/layers.h>

namespace loom::nn {

// classifier(flatten(adaptive_avg_pool2d(features(input), 1))): the head of
// torchvision's MobileNets and EfficientNet; `model` names the model in the
// error for an input that is not (N, 3, H, W).
Tensor classify_pooled_features(const char* model, Module& features, Module& classifier, const Tensor& input);

// The shape of torchvision's MobileNets and EfficientNet: `features` (the
// blocks), a global average pool, `classifier` (ending in the linear layer);
// (N, 3, H, W) -> (N, num_classes) logits, 32x32 (CIFAR) and larger. A model
// builds and registers features and classifier in its constructor. (ConvNeXt
// shares it with a forward of its own: its classifier takes the unflattened pool.)
template <class Options>
class PooledClassifier : public Module {
 public:
  Tensor forward(const Tensor& input) override {
    return classify_pooled_features(type_name().c_str(), *features, *classifier, input);
  }
  const Options& options() const { return options_; }

  std::shared_ptr<Sequential> features, classifier;

 protected:
  explicit PooledClassifier(const Options& options) : options_(options) {}
  // Registers `body` as `features` and the `head` layers, in order, as `classifier`.
  void set_layers(std::shared_ptr<Sequential> body, std::initializer_list<std::shared_ptr<Module>> head) {
    register_module("features", features, std::move(body));
    register_module("classifier", classifier, std::make_shared<Sequential>(head));
  }
  Options options_;
};

// Conv2dNormActivationOptions(16, 64, 3).stride(2).groups(16).norm_eps(1e-3)
class Conv2dNormActivationOptions {
 public:
  Conv2dNormActivationOptions(int64_t in_channels, int64_t out_channels, int64_t kernel_size)
      : in_channels_(in_channels), out_channels_(out_channels), kernel_size_(kernel_size) {}
  LOOM_OPTION(int64_t, in_channels);
  LOOM_OPTION(int64_t, out_channels);
  // Square kernel; the padding is (kernel_size - 1) / 2.
  LOOM_OPTION(int64_t, kernel_size);
  // Convolution stride (default 1).
  LOOM_OPTION(int64_t, stride) = 1;
  // Convolution groups (default 1; out_channels for depthwise).
  LOOM_OPTION(int64_t, groups) = 1;
  // The batch norm's eps (default 1e-5; MobileNetV3 1e-3).
  LOOM_OPTION(double, norm_eps) = 1e-5;
  // The batch norm's momentum (default 0.1; MobileNetV3 0.01).
  LOOM_OPTION(double, norm_momentum) = 0.1;
};

// torchvision.ops.Conv2dNormActivation with BatchNorm2d: a Sequential of
// Conv2d (no bias) ("0"), BatchNorm2d ("1") and the activation ("2"), when
// one is given.
class Conv2dNormActivation : public Sequential {
 public:
  Conv2dNormActivation(const Conv2dNormActivationOptions& options, std::shared_ptr<Module> activation);
  std::string type_name() const override { return "Conv2dNormActivation"; }
};

// torchvision.ops.SqueezeExcitation: x * scale_activation(fc2(activation(fc1(
// mean over H, W of x)))), fc1 and fc2 1x1 convolutions with bias; the
// activations are children without parameters (MobileNetV3: ReLU and
// Hardsigmoid; EfficientNet: SiLU and Sigmoid).
class SqueezeExcitation : public Module {
 public:
  SqueezeExcitation(int64_t channels, int64_t squeeze_channels, std::shared_ptr<Module> activation,
                    std::shared_ptr<Module> scale_activation);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "SqueezeExcitation"; }

  std::shared_ptr<Conv2d> fc1, fc2;
  std::shared_ptr<Module> activation, scale_activation;
};

// torchvision's _make_divisible: v rounded to the nearest multiple of
// `divisor` (at least `divisor`), and not below 90% of v.
int64_t make_divisible(double v, int64_t divisor);

// The inverted-residual block of MobileNetV2, MobileNetV3 and EfficientNet
// (MBConv): `block` (expansion, depthwise convolution, squeeze-and-excitation
// where the model has it, projection), plus the input when the stride is 1
// and the channels stay (uses_residual()).
class InvertedResidualBlock : public Module {
 public:
  Tensor forward(const Tensor& input) override;  // (N, in, H, W) -> (N, out, H / stride, W / stride)
  bool uses_residual() const { return use_residual_; }

  std::shared_ptr<Sequential> block;

 protected:
  // Registers `layers` as `block` under `name` (torchvision's: "conv" in
  // MobileNetV2, "block" in the others).
  void set_block(const std::string& name, std::shared_ptr<Sequential> layers, bool use_residual);
  // The block's output on its way to the residual sum: itself, or MBConv's stochastic depth of it.
  virtual Tensor residual_branch(const Tensor& out) { return out; }

 private:
  bool use_residual_ = false;
};

// MobileNetV2's block (see above); ReLU6 activations.
class InvertedResidual : public InvertedResidualBlock {
 public:
  InvertedResidual(int64_t in_channels, int64_t out_channels, int64_t stride, int64_t expand_ratio);
  std::string type_name() const override { return "InvertedResidual"; }
};

// The options of MobileNetV2 and MobileNetV3, e.g. MobileNetV2Options().num_classes(10).
class MobileNetOptions {
  // Units of the final linear layer (default 1000, ImageNet's classes).
  LOOM_OPTION(int64_t, num_classes) = 1000;
  // Multiplier of every layer's channels (default 1.0; torchvision's weights are 1.0's).
  LOOM_OPTION(double, width_mult) = 1.0;
  // Dropout before the classifier's last linear layer (default 0.2).
  LOOM_OPTION(double, dropout) = 0.2;
};
using MobileNetV2Options = MobileNetOptions;

class MobileNetV2 : public PooledClassifier<MobileNetV2Options> {
 public:
  explicit MobileNetV2(const MobileNetV2Options& options = {});
  std::string type_name() const override { return "MobileNetV2"; }
};

std::shared_ptr<MobileNetV2> mobilenet_v2(const MobileNetV2Options& options = {});

// One MobileNetV3 block's configuration (torchvision's InvertedResidualConfig
// before width scaling): channels in, kernel, expanded channels, channels out,
// squeeze-and-excitation, Hardswish (else ReLU), stride.
struct MobileNetV3Block {
  int64_t in_channels, kernel, expanded_channels, out_channels;
  bool squeeze_excitation, hardswish;
  int64_t stride;
};

// MobileNetV3's block (see above).
class InvertedResidualV3 : public InvertedResidualBlock {
 public:
  InvertedResidualV3(const MobileNetV3Block& config, double width_mult);
  std::string type_name() const override { return "InvertedResidual"; }
};

enum class MobileNetV3Size { small, large };

using MobileNetV3Options = MobileNetOptions;

class MobileNetV3 : public PooledClassifier<MobileNetV3Options> {
 public:
  MobileNetV3(MobileNetV3Size size, const MobileNetV3Options& options = {});
  std::string type_name() const override { return "MobileNetV3"; }
};

std::shared_ptr<MobileNetV3> mobilenet_v3_small(const MobileNetV3Options& options = {});
std::shared_ptr<MobileNetV3> mobilenet_v3_large(const MobileNetV3Options& options = {});

// torchvision's initialisation of MobileNet, EfficientNet and VGG-style
// models: convolutions kaiming_normal_(fan_out), their biases zero, batch
// norms ones and zeros (their defaults), linear weights normal(0,
// `linear_std`) or, for EfficientNet (`linear_std` 0), uniform in
// +-1 / sqrt(out_features), and biases zero.
void initialize_torchvision_cnn(Module& model, double linear_std);

}  // namespace loom::nn
