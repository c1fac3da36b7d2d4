#include <loom/nn/resnet.h>

#include <loom/core/autograd.h>
#include <loom/core/enum_names.h>
#include <loom/nn/init.h>
#include <loom/ops/autocast.h>
#include <loom/ops/batch_norm_conv2d.h>
#include <loom/ops/elementwise.h>

namespace loom::nn {
namespace {

std::shared_ptr<Conv2d> conv3x3(int64_t in, int64_t out, int64_t stride) {
  return std::make_shared<Conv2d>(Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false));
}

std::shared_ptr<Conv2d> conv1x1(int64_t in, int64_t out, int64_t stride) {
  return std::make_shared<Conv2d>(Conv2dOptions(in, out, 1).stride(stride).bias(false));
}

// relu(bn(x)) as one fused op (the ReLU mask is recomputed in backward, so
// no separate ReLU pass or tensor) when the modules declare it (Module::fuses,
// computes_relu); otherwise each runs its own forward.
Tensor bn_relu(BatchNorm2d& bn, Module& relu, const Tensor& x) {
  if (bn.fuses(FusedTail::relu) && relu.computes_relu()) return bn.forward_fused(x, FusedTail::relu);
  return relu.forward(bn.forward(x));
}

// relu(bn(x) + identity), the block's tail, as one fused op when declared as for bn_relu.
Tensor bn_add_relu(BatchNorm2d& bn, Module& relu, const Tensor& x, const Tensor& identity) {
  if (bn.fuses(FusedTail::add_relu) && relu.computes_relu()) return bn.forward_fused(x, FusedTail::add_relu, identity);
  return relu.forward(add(bn.forward(x), identity));
}

// Whether bn -> relu -> conv runs as one op (BatchNorm2d::forward_relu_conv,
// batch_norm_relu_conv2d) for an input x: where ops::batch_norm_conv_fusion
// says so for x's device (CUDA under LOOM_CUDNN_GRAPH=1), the modules declare
// what the op computes (a batch norm with the relu tail, not SyncBatchNorm;
// a ReLU; a convolution without bias) and autocast changes no dtype.
bool fuses_into_conv(BatchNorm2d& bn, Module& relu, const Conv2d& conv, const Tensor& x) {
  return ops::batch_norm_conv_fusion(x.device()) && bn.fuses(FusedTail::relu) && relu.computes_relu() &&
         !conv.bias.defined() && !ops::autocast_lowers({x, conv.weight});
}

}  // namespace

namespace {
constexpr EnumNames<ResNetStem, 2> kStemNames{{{ResNetStem::imagenet, "imagenet"}, {ResNetStem::cifar, "cifar"}}};
}  // namespace

ResNetStem parse_resnet_stem(const std::string& name) {
  if (auto stem = kStemNames.parse(name)) return *stem;
  LOOM_FAIL("unknown ResNet stem '", name, "'; expected imagenet or cifar");
}

const char* resnet_stem_name(ResNetStem stem) { return kStemNames.name(stem); }

// Registration order is torchvision's: it fixes the state_dict order. Each
// child is registered with the member forward() calls, so replacing a child
// by name (convert_sync_batchnorm) replaces what forward() runs.
BasicBlock::BasicBlock(int64_t in_channels, int64_t planes, int64_t stride, std::shared_ptr<Sequential> downsample_) {
  register_module("conv1", conv1, conv3x3(in_channels, planes, stride));
  register_module("bn1", bn1, std::make_shared<BatchNorm2d>(planes));
  register_module("relu", relu, std::make_shared<ReLU>());
  register_module("conv2", conv2, conv3x3(planes, planes, 1));
  register_module("bn2", bn2, std::make_shared<BatchNorm2d>(planes));
  if (downsample_) register_module("downsample", downsample, std::move(downsample_));
}

// With the batch norm and the convolution after it fused (fuses_into_conv),
// the statistics of each fused convolution's output go to the next batch
// norm; the autograd graph records the same order of ops otherwise.
Tensor BasicBlock::forward(const Tensor& input) {
  Tensor out = conv1->forward(input);
  if (fuses_into_conv(*bn1, *relu, *conv2, out)) {
    const bool tail_fuses = bn2->fuses(FusedTail::add_relu) && relu->computes_relu();
    Tensor stats;
    out = bn1->forward_relu_conv(out, *conv2, {}, tail_fuses ? &stats : nullptr);
    const Tensor identity = downsample ? downsample->forward(input) : input;
    if (tail_fuses) return bn2->forward_add_relu(out, identity, stats);
    return bn_add_relu(*bn2, *relu, out, identity);
  }
  out = conv2->forward(bn_relu(*bn1, *relu, out));
  const Tensor identity = downsample ? downsample->forward(input) : input;
  return bn_add_relu(*bn2, *relu, out, identity);
}

Bottleneck::Bottleneck(int64_t in_channels, int64_t planes, int64_t stride, std::shared_ptr<Sequential> downsample_) {
  register_module("conv1", conv1, conv1x1(in_channels, planes, 1));
  register_module("bn1", bn1, std::make_shared<BatchNorm2d>(planes));
  register_module("conv2", conv2, conv3x3(planes, planes, stride));
  register_module("bn2", bn2, std::make_shared<BatchNorm2d>(planes));
  register_module("conv3", conv3, conv1x1(planes, planes * expansion, 1));
  register_module("bn3", bn3, std::make_shared<BatchNorm2d>(planes * expansion));
  register_module("relu", relu, std::make_shared<ReLU>());
  if (downsample_) register_module("downsample", downsample, std::move(downsample_));
}

Tensor Bottleneck::forward(const Tensor& input) {
  Tensor out = conv1->forward(input);
  if (fuses_into_conv(*bn1, *relu, *conv2, out) && fuses_into_conv(*bn2, *relu, *conv3, out)) {
    const bool tail_fuses = bn3->fuses(FusedTail::add_relu) && relu->computes_relu();
    Tensor stats2, stats3;
    out = bn1->forward_relu_conv(out, *conv2, {}, &stats2);
    out = bn2->forward_relu_conv(out, *conv3, stats2, tail_fuses ? &stats3 : nullptr);
    const Tensor identity = downsample ? downsample->forward(input) : input;
    if (tail_fuses) return bn3->forward_add_relu(out, identity, stats3);
    return bn_add_relu(*bn3, *relu, out, identity);
  }
  out = bn_relu(*bn2, *relu, conv2->forward(bn_relu(*bn1, *relu, out)));
  out = conv3->forward(out);
  const Tensor identity = downsample ? downsample->forward(input) : input;
  return bn_add_relu(*bn3, *relu, out, identity);
}

ResNet::ResNet(BlockKind block, std::array<int64_t, 4> blocks_per_layer, const ResNetOptions& options)
    : block_(block), options_(options), in_planes_(options.width()) {
  LOOM_CHECK(options.num_classes() > 0, "ResNet: num_classes must be positive, got ", options.num_classes());
  LOOM_CHECK(options.in_channels() > 0, "ResNet: in_channels must be positive, got ", options.in_channels());
  LOOM_CHECK(options.width() > 0, "ResNet: width must be positive, got ", options.width());
  for (int64_t blocks : blocks_per_layer) LOOM_CHECK(blocks > 0, "ResNet: every layer needs at least one block");
  const int64_t width = options.width();
  if (options.stem() == ResNetStem::imagenet) {
    register_module("conv1", conv1,
                    std::make_shared<Conv2d>(Conv2dOptions(options.in_channels(), width, 7).stride(2).padding(3).bias(false)));
  } else {
    register_module("conv1", conv1, conv3x3(options.in_channels(), width, 1));
  }
  register_module("bn1", bn1, std::make_shared<BatchNorm2d>(width));
  register_module("relu", relu, std::make_shared<ReLU>());
  if (options.stem() == ResNetStem::imagenet) register_module("maxpool", maxpool, std::make_shared<MaxPool2d>(3, 2, 1));
  register_module("layer1", layer1, make_layer(width, blocks_per_layer[0], 1));
  register_module("layer2", layer2, make_layer(2 * width, blocks_per_layer[1], 2));
  register_module("layer3", layer3, make_layer(4 * width, blocks_per_layer[2], 2));
  register_module("layer4", layer4, make_layer(8 * width, blocks_per_layer[3], 2));
  register_module("avgpool", avgpool, std::make_shared<AdaptiveAvgPool2d>(1, 1));
  const int64_t expansion = block == BlockKind::basic ? BasicBlock::expansion : Bottleneck::expansion;
  register_module("fc", fc, std::make_shared<Linear>(8 * width * expansion, options.num_classes()));
  initialize();
}

std::shared_ptr<Sequential> ResNet::make_layer(int64_t planes, int64_t blocks, int64_t stride) {
  const int64_t expansion = block_ == BlockKind::basic ? BasicBlock::expansion : Bottleneck::expansion;
  auto layer = std::make_shared<Sequential>();
  for (int64_t i = 0; i < blocks; ++i) {
    const int64_t block_stride = i == 0 ? stride : 1;
    std::shared_ptr<Sequential> downsample;
    if (i == 0 && (stride != 1 || in_planes_ != planes * expansion)) {
      downsample = std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
          conv1x1(in_planes_, planes * expansion, stride), std::make_shared<BatchNorm2d>(planes * expansion)});
    }
    // torchvision's zero_init_residual: the last batch norm of each block starts at weight 0.
    if (block_ == BlockKind::basic) {
      auto residual_block = std::make_shared<BasicBlock>(in_planes_, planes, block_stride, std::move(downsample));
      if (options_.zero_init_residual()) residual_block->last_batch_norm().weight.zero_();
      layer->push_back(std::move(residual_block));
    } else {
      auto residual_block = std::make_shared<Bottleneck>(in_planes_, planes, block_stride, std::move(downsample));
      if (options_.zero_init_residual()) residual_block->last_batch_norm().weight.zero_();
      layer->push_back(std::move(residual_block));
    }
    in_planes_ = planes * expansion;
  }
  return layer;
}

// torchvision's ResNet.__init__ tail: convolutions kaiming_normal_(fan_out,
// relu), batch norms weight 1 and bias 0 (their defaults), fc keeps Linear's
// default (zero_init_residual is applied in make_layer). The convolutions'
// weights are the model's only 4-D parameters, drawn in the modules' order.
void ResNet::initialize() {
  NoGradGuard no_grad;
  for (auto& [name, parameter] : named_parameters()) {
    if (parameter.dim() == 4) init::kaiming_normal_fan_out_(parameter);
  }
}

Tensor ResNet::forward(const Tensor& input) {
  LOOM_CHECK(input.dim() == 4 && input.size(1) == options_.in_channels(), "ResNet expects (N, ",
             options_.in_channels(), ", H, W) images, got ", input.str());
  Tensor x = bn_relu(*bn1, *relu, conv1->forward(input));
  if (maxpool) x = maxpool->forward(x);
  x = layer4->forward(layer3->forward(layer2->forward(layer1->forward(x))));
  x = avgpool->forward(x).flatten(1);
  return fc->forward(x);
}

std::shared_ptr<ResNet> resnet18(const ResNetOptions& options) {
  return std::make_shared<ResNet>(BlockKind::basic, std::array<int64_t, 4>{2, 2, 2, 2}, options);
}
std::shared_ptr<ResNet> resnet34(const ResNetOptions& options) {
  return std::make_shared<ResNet>(BlockKind::basic, std::array<int64_t, 4>{3, 4, 6, 3}, options);
}
std::shared_ptr<ResNet> resnet50(const ResNetOptions& options) {
  return std::make_shared<ResNet>(BlockKind::bottleneck, std::array<int64_t, 4>{3, 4, 6, 3}, options);
}
std::shared_ptr<ResNet> resnet101(const ResNetOptions& options) {
  return std::make_shared<ResNet>(BlockKind::bottleneck, std::array<int64_t, 4>{3, 4, 23, 3}, options);
}
std::shared_ptr<ResNet> resnet152(const ResNetOptions& options) {
  return std::make_shared<ResNet>(BlockKind::bottleneck, std::array<int64_t, 4>{3, 8, 36, 3}, options);
}

namespace {
ResNetOptions shorthand(int64_t num_classes, int64_t in_channels, ResNetStem stem) {
  return ResNetOptions().num_classes(num_classes).in_channels(in_channels).stem(stem);
}
}  // namespace

std::shared_ptr<ResNet> resnet18(int64_t num_classes, int64_t in_channels, ResNetStem stem) {
  return resnet18(shorthand(num_classes, in_channels, stem));
}
std::shared_ptr<ResNet> resnet34(int64_t num_classes, int64_t in_channels, ResNetStem stem) {
  return resnet34(shorthand(num_classes, in_channels, stem));
}
std::shared_ptr<ResNet> resnet50(int64_t num_classes, int64_t in_channels, ResNetStem stem) {
  return resnet50(shorthand(num_classes, in_channels, stem));
}
std::shared_ptr<ResNet> resnet101(int64_t num_classes, int64_t in_channels, ResNetStem stem) {
  return resnet101(shorthand(num_classes, in_channels, stem));
}
std::shared_ptr<ResNet> resnet152(int64_t num_classes, int64_t in_channels, ResNetStem stem) {
  return resnet152(shorthand(num_classes, in_channels, stem));
}

bool is_resnet_name(const std::string& name) {
  return name == "resnet18" || name == "resnet34" || name == "resnet50" || name == "resnet101" || name == "resnet152";
}

std::shared_ptr<ResNet> make_resnet(const std::string& name, const ResNetOptions& options) {
  if (name == "resnet18") return resnet18(options);
  if (name == "resnet34") return resnet34(options);
  if (name == "resnet50") return resnet50(options);
  if (name == "resnet101") return resnet101(options);
  if (name == "resnet152") return resnet152(options);
  LOOM_FAIL("unknown model '", name, "'; expected resnet18, resnet34, resnet50, resnet101 or resnet152");
}

}  // namespace loom::nn
