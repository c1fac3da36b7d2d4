// ResNet-18/34/50/101/152 with torchvision's module tree, names, parameter
// counts and initialisation (v1.5: a Bottleneck strides in its 3x3 conv), so a
// state_dict loads into torchvision.models.resnetXX and back.
//
//   conv1 -> bn1 -> relu -> maxpool -> layer1 .. layer4 -> avgpool -> flatten -> fc
//
// layerK is a Sequential of blocks "0", "1", ...; a block that changes the
// shape carries downsample = Sequential(conv1x1 with stride, BatchNorm2d).
// The typed members below are the registered children themselves:
// replace_module("bn1", ...) on a block swaps the member too, which is how
// dist::convert_sync_batchnorm puts SyncBatchNorm into a ResNet.
#pragma once

#include <array>
#include <memory>
#include <string>

#include <loom/core/options.h>
#include <loom/nn/layers.h>

namespace loom::nn {

// The first layers before layer1.
enum class ResNetStem {
  imagenet,  // conv 7x7 stride 2 pad 3 -> BN -> ReLU -> maxpool 3x3 stride 2 pad 1 (torchvision)
  cifar,     // conv 3x3 stride 1 pad 1 -> BN -> ReLU, no maxpool (the usual CIFAR recipe:
             // conv1 = Conv2d(3, 64, 3, 1, 1, bias=False), maxpool = Identity)
};
// "imagenet" / "cifar"; throws loom::Error naming the accepted values otherwise.
ResNetStem parse_resnet_stem(const std::string& name);
const char* resnet_stem_name(ResNetStem stem);

enum class BlockKind { basic, bottleneck };

// ResNetOptions().num_classes(10).stem(ResNetStem::cifar)
class ResNetOptions {
  // Units of the final linear layer (default 1000, ImageNet's classes).
  LOOM_OPTION(int64_t, num_classes) = 1000;
  // Channels of the input images: 3 (RGB) or 1 (the MNIST ResNet-101 tutorial).
  LOOM_OPTION(int64_t, in_channels) = 3;
  // The first layers: ImageNet's 7x7/2 convolution and max pool, or CIFAR's 3x3/1 convolution.
  LOOM_OPTION(ResNetStem, stem) = ResNetStem::imagenet;
  // Starts each residual branch at zero: the last BN of every block gets
  // weight 0 (torchvision's zero_init_residual).
  LOOM_OPTION(bool, zero_init_residual) = false;
  // Channels of layer1's convolutions; layer2..4 use 2x, 4x, 8x. 64 is
  // torchvision's (and the only value whose state_dict torchvision loads); a
  // smaller width makes the same architecture cheap enough for tests.
  LOOM_OPTION(int64_t, width) = 64;
};

// conv3x3 -> BN -> ReLU -> conv3x3 -> BN, plus the identity (or downsample), -> ReLU.
class BasicBlock : public Module {
 public:
  static constexpr int64_t expansion = 1;
  // stride applies to conv1; downsample may be null.
  BasicBlock(int64_t in_channels, int64_t planes, int64_t stride, std::shared_ptr<Sequential> downsample);
  Tensor forward(const Tensor& input) override;  // (N, in, H, W) -> (N, planes, H/stride, W/stride)
  std::string type_name() const override { return "BasicBlock"; }
  // The BN whose weight zero_init_residual zeroes.
  BatchNorm2d& last_batch_norm() { return *bn2; }

  std::shared_ptr<Conv2d> conv1, conv2;
  std::shared_ptr<BatchNorm2d> bn1, bn2;
  std::shared_ptr<ReLU> relu;
  std::shared_ptr<Sequential> downsample;  // null when the shape is unchanged
};

// conv1x1 -> BN -> ReLU -> conv3x3 (stride) -> BN -> ReLU -> conv1x1 (4x planes) -> BN,
// plus the identity (or downsample), -> ReLU.
class Bottleneck : public Module {
 public:
  static constexpr int64_t expansion = 4;
  Bottleneck(int64_t in_channels, int64_t planes, int64_t stride, std::shared_ptr<Sequential> downsample);
  Tensor forward(const Tensor& input) override;  // (N, in, H, W) -> (N, 4 planes, H/stride, W/stride)
  std::string type_name() const override { return "Bottleneck"; }
  BatchNorm2d& last_batch_norm() { return *bn3; }

  std::shared_ptr<Conv2d> conv1, conv2, conv3;
  std::shared_ptr<BatchNorm2d> bn1, bn2, bn3;
  std::shared_ptr<ReLU> relu;
  std::shared_ptr<Sequential> downsample;
};

class ResNet : public Module {
 public:
  // blocks_per_layer: {2, 2, 2, 2} for ResNet-18, {3, 4, 6, 3} for ResNet-50, ...
  ResNet(BlockKind block, std::array<int64_t, 4> blocks_per_layer, const ResNetOptions& options = {});
  // (N, in_channels, H, W) -> (N, num_classes) logits. Any H, W of at least 1
  // after the stem and the three stride-2 stages (28x28 and 32x32 work with
  // either stem).
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "ResNet"; }
  const ResNetOptions& options() const { return options_; }
  BlockKind block_kind() const { return block_; }

  std::shared_ptr<Conv2d> conv1;
  std::shared_ptr<BatchNorm2d> bn1;
  std::shared_ptr<ReLU> relu;
  std::shared_ptr<MaxPool2d> maxpool;  // null with the CIFAR stem
  std::shared_ptr<Sequential> layer1, layer2, layer3, layer4;
  std::shared_ptr<AdaptiveAvgPool2d> avgpool;
  std::shared_ptr<Linear> fc;

 private:
  std::shared_ptr<Sequential> make_layer(int64_t planes, int64_t blocks, int64_t stride);
  void initialize();

  BlockKind block_;
  ResNetOptions options_;
  int64_t in_planes_;  // channels entering the next block while building
};

std::shared_ptr<ResNet> resnet18(const ResNetOptions& options = {});
std::shared_ptr<ResNet> resnet34(const ResNetOptions& options = {});
std::shared_ptr<ResNet> resnet50(const ResNetOptions& options = {});
std::shared_ptr<ResNet> resnet101(const ResNetOptions& options = {});
std::shared_ptr<ResNet> resnet152(const ResNetOptions& options = {});
// Shorthand: resnet50(10, 1) is a 10-class ResNet-50 for 1-channel images.
std::shared_ptr<ResNet> resnet18(int64_t num_classes, int64_t in_channels = 3, ResNetStem stem = ResNetStem::imagenet);
std::shared_ptr<ResNet> resnet34(int64_t num_classes, int64_t in_channels = 3, ResNetStem stem = ResNetStem::imagenet);
std::shared_ptr<ResNet> resnet50(int64_t num_classes, int64_t in_channels = 3, ResNetStem stem = ResNetStem::imagenet);
std::shared_ptr<ResNet> resnet101(int64_t num_classes, int64_t in_channels = 3,
                                  ResNetStem stem = ResNetStem::imagenet);
std::shared_ptr<ResNet> resnet152(int64_t num_classes, int64_t in_channels = 3,
                                  ResNetStem stem = ResNetStem::imagenet);

// By torchvision's name: "resnet18", "resnet34", "resnet50", "resnet101" or
// "resnet152"; throws loom::Error listing them for any other name.
std::shared_ptr<ResNet> make_resnet(const std::string& name, const ResNetOptions& options = {});
bool is_resnet_name(const std::string& name);

}  // namespace loom::nn
