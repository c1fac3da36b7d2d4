// RegNet (torchvision.models.regnet) with torchvision's module tree, names,
// parameter counts and initialisation, so a state_dict loads into
// torchvision.models.regnet_y_400mf and back:
//
//   stem: Conv2dNormActivation(3, 32, 3x3 stride 2, ReLU)   (SimpleStemIN)
//   -> trunk_output: Sequential(block1 .. block4), stage i an AnyStage of
//      ResBottleneckBlocks named "block<i>-0", "block<i>-1", ...
//   -> avgpool: AdaptiveAvgPool2d(1, 1) -> flatten -> fc: Linear
//
// ResBottleneckBlock: relu(proj(x) + f(x)), or relu(x + f(x)) when the width
// and the stride stay; proj is a 1x1 Conv2dNormActivation (stride s, no
// activation). f, a BottleneckTransform: Sequential("a": 1x1
// Conv2dNormActivation with ReLU to w_b = round(width_out * bottleneck
// multiplier) channels, "b": 3x3 stride s grouped (w_b / group width groups),
// ReLU, ["se": SqueezeExcitation(w_b, round(se_ratio * width_in), ReLU,
// Sigmoid)], "c": 1x1 Conv2dNormActivation to width_out without activation).
//
// The stages come from RegNet's parameters (depth, w_0, w_a, w_m, group
// width) as torchvision's BlockParams.from_init_params computes them
// (regnet_stages); regnet_y_400mf: 1, 3, 6, 6 blocks of 48, 104, 208, 440.
#pragma once

#include <memory>
#include <vector>

#include <loom/core/options.h>
#include <loom/nn/mobilenet.h>

namespace loom::nn {

// RegNetParams(16, 48, 27.89, 2.09, 8).se_ratio(0.25): torchvision's
// BlockParams.from_init_params arguments.
class RegNetParams {
 public:
  RegNetParams(int64_t depth, int64_t w_0, double w_a, double w_m, int64_t group_width)
      : depth_(depth), w_0_(w_0), w_a_(w_a), w_m_(w_m), group_width_(group_width) {}
  // Blocks over all stages.
  LOOM_OPTION(int64_t, depth);
  // The first block's width, a multiple of 8.
  LOOM_OPTION(int64_t, w_0);
  // The width's slope per block (at least 0).
  LOOM_OPTION(double, w_a);
  // The width's step in log space (over 1).
  LOOM_OPTION(double, w_m);
  // Channels per group of the 3x3 convolutions.
  LOOM_OPTION(int64_t, group_width);
  // Bottleneck width over the block's output width (default 1).
  LOOM_OPTION(double, bottleneck_multiplier) = 1.0;
  // Squeeze-and-excitation channels over the block's input width; 0 (the
  // default, RegNetX) for none, 0.25 for RegNetY.
  LOOM_OPTION(double, se_ratio) = 0.0;
};

// One stage: blocks, output width, group width, bottleneck multiplier, the
// first block's stride.
struct RegNetStage {
  int64_t depth, width, group_width;
  double bottleneck_multiplier;
  int64_t stride;
};

// torchvision's BlockParams.from_init_params: the block widths w_0 * w_m^round(
// log((i * w_a + w_0) / w_0) / log(w_m)) quantised to multiples of 8 (halves
// to even, as torch.round), the runs of equal widths as stages (stride 2
// each), then the widths made divisible by min(group width, width).
std::vector<RegNetStage> regnet_stages(const RegNetParams& params);

// RegNet's block (see above).
class ResBottleneckBlock : public Module {
 public:
  ResBottleneckBlock(int64_t width_in, int64_t width_out, int64_t stride, int64_t group_width,
                     double bottleneck_multiplier, double se_ratio);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "ResBottleneckBlock"; }

  std::shared_ptr<Conv2dNormActivation> proj;  // null when the width and stride stay
  std::shared_ptr<Sequential> f;               // BottleneckTransform: a, b, [se], c
  std::shared_ptr<ReLU> activation;
};

// RegNetOptions().num_classes(10)
class RegNetOptions {
  // Units of the final linear layer (default 1000, ImageNet's classes).
  LOOM_OPTION(int64_t, num_classes) = 1000;
  // The stem's output channels (default 32).
  LOOM_OPTION(int64_t, stem_width) = 32;
};

class RegNet : public Module {
 public:
  RegNet(const RegNetParams& params, const RegNetOptions& options = {});
  // (N, 3, H, W) -> (N, num_classes) logits; any H, W of at least 1.
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "RegNet"; }
  const RegNetOptions& options() const { return options_; }
  const std::vector<RegNetStage>& stages() const { return stages_; }

  std::shared_ptr<Conv2dNormActivation> stem;
  std::shared_ptr<Sequential> trunk_output;
  std::shared_ptr<AdaptiveAvgPool2d> avgpool;
  std::shared_ptr<Linear> fc;

 private:
  RegNetOptions options_;
  std::vector<RegNetStage> stages_;
};

// torchvision's regnet_y_400mf: RegNetParams(16, 48, 27.89, 2.09, 8).se_ratio(0.25);
// 4,344,144 parameters at 1000 classes.
std::shared_ptr<RegNet> regnet_y_400mf(const RegNetOptions& options = {});

}  // namespace loom::nn
