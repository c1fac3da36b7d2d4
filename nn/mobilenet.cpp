#include <loom/nn/mobilenet.h>

#include <cmath>
#include <iterator>

#include <loom/core/autograd.h>
#include <loom/nn/init.h>
#include <loom/ops/elementwise.h>
#include <loom/ops/pooling.h>

namespace loom::nn {

Conv2dNormActivation::Conv2dNormActivation(const Conv2dNormActivationOptions& options,
                                           std::shared_ptr<Module> activation) {
  push_back(std::make_shared<Conv2d>(Conv2dOptions(options.in_channels(), options.out_channels(), options.kernel_size())
                                         .stride(options.stride())
                                         .padding((options.kernel_size() - 1) / 2)
                                         .groups(options.groups())
                                         .bias(false)));
  push_back(std::make_shared<BatchNorm2d>(
      BatchNormOptions(options.out_channels()).eps(options.norm_eps()).momentum(options.norm_momentum())));
  if (activation) push_back(std::move(activation));
}

SqueezeExcitation::SqueezeExcitation(int64_t channels, int64_t squeeze_channels, std::shared_ptr<Module> activation_in,
                                     std::shared_ptr<Module> scale_activation_in) {
  register_module("fc1", fc1, std::make_shared<Conv2d>(Conv2dOptions(channels, squeeze_channels, 1)));
  register_module("fc2", fc2, std::make_shared<Conv2d>(Conv2dOptions(squeeze_channels, channels, 1)));
  register_module("activation", activation, std::move(activation_in));
  register_module("scale_activation", scale_activation, std::move(scale_activation_in));
}

Tensor SqueezeExcitation::forward(const Tensor& input) {
  const Tensor pooled = adaptive_avg_pool2d(input, {1, 1});  // (N, C, 1, 1)
  const Tensor scale = scale_activation->forward(fc2->forward(activation->forward(fc1->forward(pooled))));
  return mul(scale, input);  // (N, C, 1, 1) broadcast over (N, C, H, W)
}

int64_t make_divisible(double v, int64_t divisor) {
  int64_t rounded = std::max<int64_t>(divisor, static_cast<int64_t>(v + static_cast<double>(divisor) / 2) / divisor * divisor);
  if (static_cast<double>(rounded) < 0.9 * v) rounded += divisor;
  return rounded;
}

Tensor InvertedResidualBlock::forward(const Tensor& input) {
  Tensor out = block->forward(input);
  return use_residual_ ? add(input, residual_branch(out)) : out;
}

void InvertedResidualBlock::set_block(const std::string& name, std::shared_ptr<Sequential> layers, bool use_residual) {
  register_module(name, block, std::move(layers));
  use_residual_ = use_residual;
}

InvertedResidual::InvertedResidual(int64_t in_channels, int64_t out_channels, int64_t stride, int64_t expand_ratio) {
  LOOM_CHECK(stride == 1 || stride == 2, "InvertedResidual: stride must be 1 or 2, got ", stride);
  const int64_t hidden = static_cast<int64_t>(std::lround(static_cast<double>(in_channels * expand_ratio)));
  auto layers = std::make_shared<Sequential>();
  if (expand_ratio != 1) {
    layers->push_back(
        std::make_shared<Conv2dNormActivation>(Conv2dNormActivationOptions(in_channels, hidden, 1), std::make_shared<ReLU6>()));
  }
  layers->push_back(std::make_shared<Conv2dNormActivation>(
      Conv2dNormActivationOptions(hidden, hidden, 3).stride(stride).groups(hidden), std::make_shared<ReLU6>()));
  layers->push_back(std::make_shared<Conv2d>(Conv2dOptions(hidden, out_channels, 1).bias(false)));
  layers->push_back(std::make_shared<BatchNorm2d>(out_channels));
  set_block("conv", std::move(layers), stride == 1 && in_channels == out_channels);
}

void initialize_torchvision_cnn(Module& model, double linear_std) {
  NoGradGuard no_grad;
  for (auto& [name, parameter] : model.named_parameters()) {
    // Convolution weights are the only 4-D parameters and linear weights the
    // only 2-D ones; every bias starts at zero (batch norms' already do); batch
    // norms' 1-D weights keep their ones.
    if (parameter.dim() == 4) {
      init::kaiming_normal_fan_out_(parameter);
    } else if (parameter.dim() == 2 && linear_std > 0) {
      init::normal_(parameter, 0.0, linear_std);
    } else if (parameter.dim() == 2) {
      const double range = 1.0 / std::sqrt(static_cast<double>(parameter.size(0)));
      init::uniform_(parameter, -range, range);
    } else if (name == "bias" || name.ends_with(".bias")) {
      parameter.zero_();
    }
  }
}

MobileNetV2::MobileNetV2(const MobileNetV2Options& options) : PooledClassifier(options) {
  LOOM_CHECK(options.num_classes() > 0, "MobileNetV2: num_classes must be positive, got ", options.num_classes());
  LOOM_CHECK(options.width_mult() > 0, "MobileNetV2: width_mult must be positive, got ", options.width_mult());
  constexpr int64_t kRound = 8;
  // torchvision's inverted_residual_setting: expansion t, channels c, blocks n, first stride s.
  struct Stage {
    int64_t t, c, n, s;
  };
  constexpr Stage kStages[] = {{1, 16, 1, 1}, {6, 24, 2, 2},  {6, 32, 3, 2}, {6, 64, 4, 2},
                               {6, 96, 3, 1}, {6, 160, 3, 2}, {6, 320, 1, 1}};
  const double width = options.width_mult();
  int64_t channels = make_divisible(32 * width, kRound);
  const int64_t last_channels = make_divisible(1280 * std::max(1.0, width), kRound);
  auto body = std::make_shared<Sequential>();
  body->push_back(
      std::make_shared<Conv2dNormActivation>(Conv2dNormActivationOptions(3, channels, 3).stride(2), std::make_shared<ReLU6>()));
  for (const Stage& stage : kStages) {
    const int64_t out_channels = make_divisible(static_cast<double>(stage.c) * width, kRound);
    for (int64_t i = 0; i < stage.n; ++i) {
      body->push_back(std::make_shared<InvertedResidual>(channels, out_channels, i == 0 ? stage.s : 1, stage.t));
      channels = out_channels;
    }
  }
  body->push_back(std::make_shared<Conv2dNormActivation>(Conv2dNormActivationOptions(channels, last_channels, 1),
                                                         std::make_shared<ReLU6>()));
  set_layers(std::move(body), {std::make_shared<Dropout>(options.dropout()),
                                std::make_shared<Linear>(last_channels, options.num_classes())});
  initialize_torchvision_cnn(*this, 0.01);
}

Tensor classify_pooled_features(const char* model, Module& features, Module& classifier, const Tensor& input) {
  LOOM_CHECK(input.dim() == 4 && input.size(1) == 3, model, " expects (N, 3, H, W) images, got ", input.str());
  return classifier.forward(adaptive_avg_pool2d(features.forward(input), {1, 1}).flatten(1));
}

std::shared_ptr<MobileNetV2> mobilenet_v2(const MobileNetV2Options& options) {
  return std::make_shared<MobileNetV2>(options);
}

namespace {
// MobileNetV3's batch norms (torchvision: partial(nn.BatchNorm2d, eps=0.001, momentum=0.01)).
Conv2dNormActivationOptions v3_layer(int64_t in_channels, int64_t out_channels, int64_t kernel_size) {
  return Conv2dNormActivationOptions(in_channels, out_channels, kernel_size).norm_eps(1e-3).norm_momentum(0.01);
}

std::shared_ptr<Module> v3_activation(bool hardswish) {
  if (hardswish) return std::make_shared<Hardswish>();
  return std::make_shared<ReLU>();
}

int64_t v3_channels(int64_t channels, double width_mult) {
  return make_divisible(static_cast<double>(channels) * width_mult, 8);
}

// torchvision's _mobilenet_v3_conf (dilation 1, reduce_divider 1).
constexpr MobileNetV3Block kLarge[] = {
    {16, 3, 16, 16, false, false, 1},   {16, 3, 64, 24, false, false, 2},   {24, 3, 72, 24, false, false, 1},
    {24, 5, 72, 40, true, false, 2},    {40, 5, 120, 40, true, false, 1},   {40, 5, 120, 40, true, false, 1},
    {40, 3, 240, 80, false, true, 2},   {80, 3, 200, 80, false, true, 1},   {80, 3, 184, 80, false, true, 1},
    {80, 3, 184, 80, false, true, 1},   {80, 3, 480, 112, true, true, 1},   {112, 3, 672, 112, true, true, 1},
    {112, 5, 672, 160, true, true, 2},  {160, 5, 960, 160, true, true, 1},  {160, 5, 960, 160, true, true, 1}};
constexpr MobileNetV3Block kSmall[] = {
    {16, 3, 16, 16, true, false, 2},  {16, 3, 72, 24, false, false, 2}, {24, 3, 88, 24, false, false, 1},
    {24, 5, 96, 40, true, true, 2},   {40, 5, 240, 40, true, true, 1},  {40, 5, 240, 40, true, true, 1},
    {40, 5, 120, 48, true, true, 1},  {48, 5, 144, 48, true, true, 1},  {48, 5, 288, 96, true, true, 2},
    {96, 5, 576, 96, true, true, 1},  {96, 5, 576, 96, true, true, 1}};
}  // namespace

InvertedResidualV3::InvertedResidualV3(const MobileNetV3Block& config, double width_mult) {
  LOOM_CHECK(config.stride == 1 || config.stride == 2, "InvertedResidual: stride must be 1 or 2, got ", config.stride);
  const int64_t in = v3_channels(config.in_channels, width_mult);
  const int64_t expanded = v3_channels(config.expanded_channels, width_mult);
  const int64_t out = v3_channels(config.out_channels, width_mult);
  auto layers = std::make_shared<Sequential>();
  if (expanded != in) {
    layers->push_back(std::make_shared<Conv2dNormActivation>(v3_layer(in, expanded, 1), v3_activation(config.hardswish)));
  }
  layers->push_back(std::make_shared<Conv2dNormActivation>(
      v3_layer(expanded, expanded, config.kernel).stride(config.stride).groups(expanded), v3_activation(config.hardswish)));
  if (config.squeeze_excitation) {
    layers->push_back(std::make_shared<SqueezeExcitation>(expanded, make_divisible(static_cast<double>(expanded / 4), 8),
                                                          std::make_shared<ReLU>(), std::make_shared<Hardsigmoid>()));
  }
  layers->push_back(std::make_shared<Conv2dNormActivation>(v3_layer(expanded, out, 1), nullptr));
  set_block("block", std::move(layers), config.stride == 1 && in == out);
}

MobileNetV3::MobileNetV3(MobileNetV3Size size, const MobileNetV3Options& options) : PooledClassifier(options) {
  LOOM_CHECK(options.num_classes() > 0, "MobileNetV3: num_classes must be positive, got ", options.num_classes());
  LOOM_CHECK(options.width_mult() > 0, "MobileNetV3: width_mult must be positive, got ", options.width_mult());
  const double width = options.width_mult();
  const bool large = size == MobileNetV3Size::large;
  const MobileNetV3Block* blocks = large ? kLarge : kSmall;
  const size_t count = large ? std::size(kLarge) : std::size(kSmall);
  auto body = std::make_shared<Sequential>();
  body->push_back(std::make_shared<Conv2dNormActivation>(
      v3_layer(3, v3_channels(blocks[0].in_channels, width), 3).stride(2), std::make_shared<Hardswish>()));
  for (size_t i = 0; i < count; ++i) body->push_back(std::make_shared<InvertedResidualV3>(blocks[i], width));
  const int64_t last_in = v3_channels(blocks[count - 1].out_channels, width), last_out = 6 * last_in;
  body->push_back(std::make_shared<Conv2dNormActivation>(v3_layer(last_in, last_out, 1), std::make_shared<Hardswish>()));
  const int64_t hidden = v3_channels(large ? 1280 : 1024, width);  // torchvision: adjust_channels(last_channel)
  set_layers(std::move(body), {std::make_shared<Linear>(last_out, hidden), std::make_shared<Hardswish>(),
                               std::make_shared<Dropout>(options.dropout()),
                               std::make_shared<Linear>(hidden, options.num_classes())});
  initialize_torchvision_cnn(*this, 0.01);
}

std::shared_ptr<MobileNetV3> mobilenet_v3_small(const MobileNetV3Options& options) {
  return std::make_shared<MobileNetV3>(MobileNetV3Size::small, options);
}

std::shared_ptr<MobileNetV3> mobilenet_v3_large(const MobileNetV3Options& options) {
  return std::make_shared<MobileNetV3>(MobileNetV3Size::large, options);
}

}  // namespace loom::nn
