#include <loom/nn/convnext.h>

#include <utility>

#include <loom/core/autograd.h>
#include <loom/nn/init.h>
#include <loom/ops/elementwise.h>
#include <loom/ops/pooling.h>

namespace loom::nn {

namespace {
constexpr double kNormEps = 1e-6;  // torchvision: partial(LayerNorm / LayerNorm2d, eps=1e-6)

std::shared_ptr<LayerNorm2d> layer_norm_2d(int64_t channels) {
  return std::make_shared<LayerNorm2d>(LayerNormOptions(channels).eps(kNormEps));
}

// PyTorch's type promotion where amp O1 mixes dtypes in a block (the linear
// layers' and the downsampling convolution's f16 or bf16 outputs against the
// f32 layer scale and layer norms): both tensors in the wider dtype, f32 for
// f16 against bf16.
std::pair<Tensor, Tensor> promoted(const Tensor& a, const Tensor& b) {
  if (a.dtype() == b.dtype()) return {a, b};
  const size_t size_a = element_size(a.dtype()), size_b = element_size(b.dtype());
  const DType wider = size_a == size_b ? DType::f32 : size_a > size_b ? a.dtype() : b.dtype();
  return {a.to(wider), b.to(wider)};
}

// A Sequential of torchvision's Conv2dNormActivation shape (conv "0", norm "1").
class ConvNormStem : public Sequential {
 public:
  explicit ConvNormStem(int64_t channels) {
    push_back(std::make_shared<Conv2d>(Conv2dOptions(3, channels, 4).stride(4)));
    push_back(layer_norm_2d(channels));
  }
  std::string type_name() const override { return "Conv2dNormActivation"; }
};
}  // namespace

CNBlock::CNBlock(int64_t channels, double layer_scale_value, double stochastic_depth_prob) {
  LOOM_CHECK(channels > 0, "CNBlock: channels must be positive, got ", channels);
  // torchvision registers layer_scale after block, but a module's own
  // parameters come first in its state_dict: "layer_scale", then "block.*".
  layer_scale = Tensor::full({channels, 1, 1}, layer_scale_value, DType::f32);
  register_parameter("layer_scale", layer_scale);
  register_module("block", block,
                  std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
                      std::make_shared<Conv2d>(Conv2dOptions(channels, channels, 7).padding(3).groups(channels)),
                      std::make_shared<Permute>(std::vector<int64_t>{0, 2, 3, 1}),
                      std::make_shared<LayerNorm>(LayerNormOptions(channels).eps(kNormEps)),
                      std::make_shared<Linear>(channels, 4 * channels), std::make_shared<GELU>(),
                      std::make_shared<Linear>(4 * channels, channels),
                      std::make_shared<Permute>(std::vector<int64_t>{0, 3, 1, 2})}));
  register_module("stochastic_depth", stochastic_depth,
                  std::make_shared<StochasticDepth>(StochasticDepthOptions(stochastic_depth_prob)));
}

Tensor CNBlock::forward(const Tensor& input) {
  // layer_scale (C, 1, 1) broadcast over (N, C, H, W) (ops/elementwise.h's mul).
  auto [scale, branch] = promoted(layer_scale, block->forward(input));
  auto [result, shortcut] = promoted(stochastic_depth->forward(mul(scale, branch)), input);
  return add(result, shortcut);
}

ConvNeXt::ConvNeXt(const std::vector<CNBlockConfig>& block_setting, const ConvNeXtOptions& options)
    : PooledClassifier(options) {
  LOOM_CHECK(!block_setting.empty(), "ConvNeXt: the block setting is empty");
  LOOM_CHECK(options.num_classes() > 0, "ConvNeXt: num_classes must be positive, got ", options.num_classes());
  int64_t total_blocks = 0;
  for (const CNBlockConfig& config : block_setting) {
    LOOM_CHECK(config.input_channels > 0 && config.out_channels >= 0 && config.num_layers > 0,
               "ConvNeXt: invalid stage (", config.input_channels, " channels, out ", config.out_channels, ", ",
               config.num_layers, " blocks)");
    total_blocks += config.num_layers;
  }
  auto layers = std::make_shared<Sequential>();
  layers->push_back(std::make_shared<ConvNormStem>(block_setting.front().input_channels));
  int64_t block_id = 0;
  for (const CNBlockConfig& config : block_setting) {
    auto stage = std::make_shared<Sequential>();
    for (int64_t i = 0; i < config.num_layers; ++i, ++block_id) {
      // torchvision: stochastic_depth_prob * block_id / (total_blocks - 1.0) (a NaN for a one-block model there).
      const double drop = total_blocks > 1 ? options.stochastic_depth_prob() * static_cast<double>(block_id) /
                                                 (static_cast<double>(total_blocks) - 1.0)
                                           : 0.0;
      stage->push_back(std::make_shared<CNBlock>(config.input_channels, options.layer_scale(), drop));
    }
    layers->push_back(std::move(stage));
    if (config.out_channels > 0) {
      layers->push_back(std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
          layer_norm_2d(config.input_channels),
          std::make_shared<Conv2d>(Conv2dOptions(config.input_channels, config.out_channels, 2).stride(2))}));
    }
  }
  register_module("features", features, std::move(layers));
  register_module("avgpool", avgpool, std::make_shared<AdaptiveAvgPool2d>(1, 1));
  const CNBlockConfig& last = block_setting.back();
  const int64_t last_channels = last.out_channels > 0 ? last.out_channels : last.input_channels;
  register_module("classifier", classifier,
                  std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
                      layer_norm_2d(last_channels), std::make_shared<Flatten>(1),
                      std::make_shared<Linear>(last_channels, options.num_classes())}));
  // torchvision: every Conv2d and Linear weight trunc_normal_(std=0.02) (within
  // the absolute bounds -2, 2), their biases zero; layer norms ones and zeros.
  // Convolution weights are the only 4-D parameters and linear weights the
  // only 2-D ones (layer scales are (C, 1, 1)); layer norms' biases start at
  // zero already.
  NoGradGuard no_grad;
  for (auto& [name, parameter] : named_parameters()) {
    if (parameter.dim() == 4 || parameter.dim() == 2) {
      init::trunc_normal_(parameter, 0.0, 0.02);
    } else if (name.ends_with(".bias")) {
      parameter.zero_();
    }
  }
}

Tensor ConvNeXt::forward(const Tensor& input) {
  LOOM_CHECK(input.dim() == 4 && input.size(1) == 3, "ConvNeXt expects (N, 3, H, W) images, got ", input.str());
  LOOM_CHECK(input.size(2) >= 32 && input.size(3) >= 32, "ConvNeXt needs images of at least 32x32 (its stride is ",
             "32), got ", input.str());
  return classifier->forward(avgpool->forward(features->forward(input)));
}

std::shared_ptr<ConvNeXt> convnext_tiny(const ConvNeXtOptions& options) {
  return std::make_shared<ConvNeXt>(std::vector<CNBlockConfig>{{96, 192, 3}, {192, 384, 3}, {384, 768, 9}, {768, 0, 3}},
                                    options);
}

}  // namespace loom::nn
