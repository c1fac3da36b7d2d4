#include <loom/nn/regnet.h>

#include <algorithm>
#include <cmath>
#include <string>

#include <loom/core/autograd.h>
#include <loom/nn/init.h>
#include <loom/ops/elementwise.h>
#include <loom/ops/pooling.h>

namespace loom::nn {

namespace {
// Python's round() and torch.round: halves to even (the default rounding mode).
int64_t round_half_even(double v) { return static_cast<int64_t>(std::nearbyint(v)); }

// torchvision's BottleneckTransform (see regnet.h): a Sequential named a, b, [se], c.
class BottleneckTransform : public Sequential {
 public:
  BottleneckTransform(int64_t width_in, int64_t width_out, int64_t stride, int64_t group_width,
                      double bottleneck_multiplier, double se_ratio) {
    const int64_t w_b = round_half_even(static_cast<double>(width_out) * bottleneck_multiplier);
    LOOM_CHECK(w_b >= group_width && w_b % group_width == 0, "RegNet: the bottleneck width ", w_b,
               " is not a multiple of the group width ", group_width);
    push_back("a", std::make_shared<Conv2dNormActivation>(Conv2dNormActivationOptions(width_in, w_b, 1),
                                                          std::make_shared<ReLU>()));
    push_back("b", std::make_shared<Conv2dNormActivation>(
                       Conv2dNormActivationOptions(w_b, w_b, 3).stride(stride).groups(w_b / group_width),
                       std::make_shared<ReLU>()));
    if (se_ratio > 0) {
      const int64_t squeeze = round_half_even(se_ratio * static_cast<double>(width_in));
      push_back("se", std::make_shared<SqueezeExcitation>(w_b, squeeze, std::make_shared<ReLU>(),
                                                          std::make_shared<Sigmoid>()));
    }
    push_back("c", std::make_shared<Conv2dNormActivation>(Conv2dNormActivationOptions(w_b, width_out, 1), nullptr));
  }
  std::string type_name() const override { return "BottleneckTransform"; }
};

// torchvision's AnyStage: a Sequential of blocks named block<stage>-<i>.
class AnyStage : public Sequential {
 public:
  AnyStage(int64_t width_in, const RegNetStage& stage, double se_ratio, int64_t stage_index) {
    for (int64_t i = 0; i < stage.depth; ++i) {
      push_back("block" + std::to_string(stage_index) + "-" + std::to_string(i),
                std::make_shared<ResBottleneckBlock>(i == 0 ? width_in : stage.width, stage.width,
                                                     i == 0 ? stage.stride : 1, stage.group_width,
                                                     stage.bottleneck_multiplier, se_ratio));
    }
  }
  std::string type_name() const override { return "AnyStage"; }
};
}  // namespace

std::vector<RegNetStage> regnet_stages(const RegNetParams& params) {
  const int64_t depth = params.depth(), w_0 = params.w_0();
  const double w_a = params.w_a(), w_m = params.w_m();
  LOOM_CHECK(depth > 0 && w_a >= 0 && w_0 > 0 && w_m > 1 && w_0 % 8 == 0 && params.group_width() > 0 &&
                 params.bottleneck_multiplier() > 0,
             "RegNet: invalid settings (depth ", depth, ", w_0 ", w_0, ", w_a ", w_a, ", w_m ", w_m, ", group width ",
             params.group_width(), "): torchvision needs w_a >= 0, w_0 > 0 and a multiple of 8, w_m > 1");
  constexpr int64_t kQuant = 8, kStride = 2;
  // The widths of the blocks, then the runs of equal widths as stages.
  std::vector<RegNetStage> stages;
  for (int64_t i = 0; i < depth; ++i) {
    const double continuous = static_cast<double>(i) * w_a + static_cast<double>(w_0);
    const double capacity = static_cast<double>(round_half_even(std::log(continuous / w_0) / std::log(w_m)));
    const int64_t width = round_half_even(static_cast<double>(w_0) * std::pow(w_m, capacity) / kQuant) * kQuant;
    if (stages.empty() || stages.back().width != width) {
      stages.push_back({0, width, params.group_width(), params.bottleneck_multiplier(), kStride});
    }
    ++stages.back().depth;
  }
  // _adjust_widths_groups_compatibilty: the bottleneck widths divisible by their group widths.
  for (RegNetStage& stage : stages) {
    const int64_t bottleneck = static_cast<int64_t>(static_cast<double>(stage.width) * stage.bottleneck_multiplier);
    stage.group_width = std::min(stage.group_width, bottleneck);
    const int64_t divisible = make_divisible(static_cast<double>(bottleneck), stage.group_width);
    stage.width = static_cast<int64_t>(static_cast<double>(divisible) / stage.bottleneck_multiplier);
  }
  return stages;
}

ResBottleneckBlock::ResBottleneckBlock(int64_t width_in, int64_t width_out, int64_t stride, int64_t group_width,
                                       double bottleneck_multiplier, double se_ratio) {
  if (width_in != width_out || stride != 1) {
    register_module("proj", proj,
                    std::make_shared<Conv2dNormActivation>(
                        Conv2dNormActivationOptions(width_in, width_out, 1).stride(stride), nullptr));
  }
  register_module("f", f,
                  std::static_pointer_cast<Sequential>(std::make_shared<BottleneckTransform>(
                      width_in, width_out, stride, group_width, bottleneck_multiplier, se_ratio)));
  register_module("activation", activation, std::make_shared<ReLU>());
}

Tensor ResBottleneckBlock::forward(const Tensor& input) {
  const Tensor shortcut = proj ? proj->forward(input) : input;
  return activation->forward(add(shortcut, f->forward(input)));
}

RegNet::RegNet(const RegNetParams& params, const RegNetOptions& options)
    : options_(options), stages_(regnet_stages(params)) {
  LOOM_CHECK(options.num_classes() > 0, "RegNet: num_classes must be positive, got ", options.num_classes());
  LOOM_CHECK(options.stem_width() > 0, "RegNet: stem_width must be positive, got ", options.stem_width());
  register_module("stem", stem,
                  std::make_shared<Conv2dNormActivation>(
                      Conv2dNormActivationOptions(3, options.stem_width(), 3).stride(2), std::make_shared<ReLU>()));
  auto trunk = std::make_shared<Sequential>();
  int64_t width = options.stem_width();
  for (size_t i = 0; i < stages_.size(); ++i) {
    trunk->push_back("block" + std::to_string(i + 1),
                     std::make_shared<AnyStage>(width, stages_[i], params.se_ratio(), static_cast<int64_t>(i + 1)));
    width = stages_[i].width;
  }
  register_module("trunk_output", trunk_output, std::move(trunk));
  register_module("avgpool", avgpool, std::make_shared<AdaptiveAvgPool2d>(1, 1));
  register_module("fc", fc, std::make_shared<Linear>(width, options.num_classes()));
  // torchvision's RegNet: every convolution's weight (the squeeze-excitation's
  // 1x1 ones too) normal with std sqrt(2 / fan_out); their biases (only the
  // squeeze-excitation's have one) keep Conv2d's default; batch norms ones and
  // zeros; the linear layer normal(0, 0.01) with a zero bias.
  NoGradGuard no_grad;
  for (auto& [name, parameter] : named_parameters()) {
    if (parameter.dim() == 4) init::kaiming_normal_fan_out_(parameter);
  }
  init::normal_(fc->weight, 0.0, 0.01);
  fc->bias.zero_();
}

Tensor RegNet::forward(const Tensor& input) {
  LOOM_CHECK(input.dim() == 4 && input.size(1) == 3, "RegNet expects (N, 3, H, W) images, got ", input.str());
  return fc->forward(avgpool->forward(trunk_output->forward(stem->forward(input))).flatten(1));
}

std::shared_ptr<RegNet> regnet_y_400mf(const RegNetOptions& options) {
  return std::make_shared<RegNet>(RegNetParams(16, 48, 27.89, 2.09, 8).se_ratio(0.25), options);
}

}  // namespace loom::nn
