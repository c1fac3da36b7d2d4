#include <loom/nn/efficientnet.h>

#include <algorithm>

namespace loom::nn {

namespace {
// torchvision's efficientnet_b0 configuration (width and depth multipliers 1).
constexpr MBConvStage kB0Stages[] = {{1, 3, 1, 32, 16, 1}, {6, 3, 2, 16, 24, 2},  {6, 5, 2, 24, 40, 2},
                                     {6, 3, 2, 40, 80, 3}, {6, 5, 1, 80, 112, 3}, {6, 5, 2, 112, 192, 4},
                                     {6, 3, 1, 192, 320, 1}};
}  // namespace

MBConv::MBConv(const MBConvStage& stage, int64_t in_channels, int64_t stride, double stochastic_depth_prob) {
  const int64_t expanded = make_divisible(static_cast<double>(in_channels * stage.expand_ratio), 8);
  auto layers = std::make_shared<Sequential>();
  if (expanded != in_channels) {
    layers->push_back(
        std::make_shared<Conv2dNormActivation>(Conv2dNormActivationOptions(in_channels, expanded, 1), std::make_shared<SiLU>()));
  }
  layers->push_back(std::make_shared<Conv2dNormActivation>(
      Conv2dNormActivationOptions(expanded, expanded, stage.kernel).stride(stride).groups(expanded),
      std::make_shared<SiLU>()));
  layers->push_back(std::make_shared<SqueezeExcitation>(expanded, std::max<int64_t>(1, in_channels / 4),
                                                        std::make_shared<SiLU>(), std::make_shared<Sigmoid>()));
  layers->push_back(
      std::make_shared<Conv2dNormActivation>(Conv2dNormActivationOptions(expanded, stage.out_channels, 1), nullptr));
  set_block("block", std::move(layers), stride == 1 && in_channels == stage.out_channels);
  register_module("stochastic_depth", stochastic_depth,
                  std::make_shared<StochasticDepth>(StochasticDepthOptions(stochastic_depth_prob)));
}

EfficientNet::EfficientNet(const EfficientNetOptions& options) : PooledClassifier(options) {
  LOOM_CHECK(options.num_classes() > 0, "EfficientNet: num_classes must be positive, got ", options.num_classes());
  auto body = std::make_shared<Sequential>();
  body->push_back(std::make_shared<Conv2dNormActivation>(
      Conv2dNormActivationOptions(3, kB0Stages[0].in_channels, 3).stride(2), std::make_shared<SiLU>()));
  int64_t total_blocks = 0;
  for (const MBConvStage& stage : kB0Stages) total_blocks += stage.blocks;
  int64_t block_index = 0;
  for (const MBConvStage& stage : kB0Stages) {
    auto blocks = std::make_shared<Sequential>();
    for (int64_t i = 0; i < stage.blocks; ++i, ++block_index) {
      const double drop = options.stochastic_depth_prob() * static_cast<double>(block_index) / total_blocks;
      blocks->push_back(std::make_shared<MBConv>(stage, i == 0 ? stage.in_channels : stage.out_channels,
                                                 i == 0 ? stage.stride : 1, drop));
    }
    body->push_back(std::move(blocks));
  }
  const int64_t last_in = std::end(kB0Stages)[-1].out_channels, last_out = 4 * last_in;
  body->push_back(std::make_shared<Conv2dNormActivation>(Conv2dNormActivationOptions(last_in, last_out, 1),
                                                         std::make_shared<SiLU>()));
  set_layers(std::move(body),
             {std::make_shared<Dropout>(options.dropout()), std::make_shared<Linear>(last_out, options.num_classes())});
  // torchvision's EfficientNet draws the classifier's weight uniform in +-1 / sqrt(out_features).
  initialize_torchvision_cnn(*this, 0.0);
}

std::shared_ptr<EfficientNet> efficientnet_b0(const EfficientNetOptions& options) {
  return std::make_shared<EfficientNet>(options);
}

}  // namespace loom::nn
