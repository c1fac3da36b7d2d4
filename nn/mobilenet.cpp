#include <loom/nn/mobilenet.h>

#include <cmath>

#include <loom/core/autograd.h>
#include <loom/nn/init.h>
#include <loom/ops/elementwise.h>
#include <loom/ops/pooling.h>

namespace loom::nn {

Conv2dNormActivation::Conv2dNormActivation(int64_t in_channels, int64_t out_channels, int64_t kernel_size,
                                           int64_t stride, int64_t groups, std::shared_ptr<Module> activation) {
  push_back(std::make_shared<Conv2d>(Conv2dOptions(in_channels, out_channels, kernel_size)
                                         .stride(stride)
                                         .padding((kernel_size - 1) / 2)
                                         .groups(groups)
                                         .bias(false)));
  push_back(std::make_shared<BatchNorm2d>(out_channels));
  if (activation) push_back(std::move(activation));
}

int64_t make_divisible(double v, int64_t divisor) {
  int64_t rounded = std::max<int64_t>(divisor, static_cast<int64_t>(v + static_cast<double>(divisor) / 2) / divisor * divisor);
  if (static_cast<double>(rounded) < 0.9 * v) rounded += divisor;
  return rounded;
}

InvertedResidual::InvertedResidual(int64_t in_channels, int64_t out_channels, int64_t stride, int64_t expand_ratio)
    : use_residual_(stride == 1 && in_channels == out_channels) {
  LOOM_CHECK(stride == 1 || stride == 2, "InvertedResidual: stride must be 1 or 2, got ", stride);
  const int64_t hidden = static_cast<int64_t>(std::lround(static_cast<double>(in_channels * expand_ratio)));
  auto layers = std::make_shared<Sequential>();
  if (expand_ratio != 1) {
    layers->push_back(std::make_shared<Conv2dNormActivation>(in_channels, hidden, 1, 1, 1, std::make_shared<ReLU6>()));
  }
  layers->push_back(std::make_shared<Conv2dNormActivation>(hidden, hidden, 3, stride, hidden, std::make_shared<ReLU6>()));
  layers->push_back(std::make_shared<Conv2d>(Conv2dOptions(hidden, out_channels, 1).bias(false)));
  layers->push_back(std::make_shared<BatchNorm2d>(out_channels));
  register_module("conv", conv, std::move(layers));
}

Tensor InvertedResidual::forward(const Tensor& input) {
  Tensor out = conv->forward(input);
  return use_residual_ ? add(input, out) : out;
}

void initialize_torchvision_cnn(Module& model, double linear_std) {
  NoGradGuard no_grad;
  for (auto& [name, parameter] : model.named_parameters()) {
    // Convolution weights are the only 4-D parameters and linear weights the
    // only 2-D ones; every bias starts at zero (batch norms' already do); batch
    // norms' 1-D weights keep their ones.
    if (parameter.dim() == 4) {
      init::kaiming_normal_fan_out_(parameter);
    } else if (parameter.dim() == 2) {
      init::normal_(parameter, 0.0, linear_std);
    } else if (name == "bias" || name.ends_with(".bias")) {
      parameter.zero_();
    }
  }
}

MobileNetV2::MobileNetV2(const MobileNetV2Options& options) : options_(options) {
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
  body->push_back(std::make_shared<Conv2dNormActivation>(3, channels, 3, 2, 1, std::make_shared<ReLU6>()));
  for (const Stage& stage : kStages) {
    const int64_t out_channels = make_divisible(static_cast<double>(stage.c) * width, kRound);
    for (int64_t i = 0; i < stage.n; ++i) {
      body->push_back(std::make_shared<InvertedResidual>(channels, out_channels, i == 0 ? stage.s : 1, stage.t));
      channels = out_channels;
    }
  }
  body->push_back(std::make_shared<Conv2dNormActivation>(channels, last_channels, 1, 1, 1, std::make_shared<ReLU6>()));
  register_module("features", features, std::move(body));
  register_module("classifier", classifier,
                  std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
                      std::make_shared<Dropout>(options.dropout()),
                      std::make_shared<Linear>(last_channels, options.num_classes())}));
  initialize_torchvision_cnn(*this, 0.01);
}

Tensor MobileNetV2::forward(const Tensor& input) {
  LOOM_CHECK(input.dim() == 4 && input.size(1) == 3, "MobileNetV2 expects (N, 3, H, W) images, got ", input.str());
  const Tensor x = adaptive_avg_pool2d(features->forward(input), {1, 1}).flatten(1);
  return classifier->forward(x);
}

std::shared_ptr<MobileNetV2> mobilenet_v2(const MobileNetV2Options& options) {
  return std::make_shared<MobileNetV2>(options);
}

}  // namespace loom::nn
