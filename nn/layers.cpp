#include <loom/nn/layers.h>

#include <cmath>
#include <typeinfo>

#include <loom/core/autograd.h>
#include <loom/nn/init.h>
#include <loom/ops/batch_norm.h>
#include <loom/ops/batch_norm_conv2d.h>
#include <loom/ops/conv2d.h>
#include <loom/ops/dropout.h>
#include <loom/ops/layer_norm.h>
#include <loom/ops/elementwise.h>
#include <loom/ops/linear.h>
#include <loom/ops/pooling.h>

namespace loom::nn {

Conv2d::Conv2d(const Conv2dOptions& options) : options_(options) {
  LOOM_CHECK(options.in_channels() > 0 && options.out_channels() > 0, "Conv2d: channel counts must be positive, got ",
             options.in_channels(), " -> ", options.out_channels());
  const int64_t groups = options.groups();
  LOOM_CHECK(groups > 0 && options.in_channels() % groups == 0 && options.out_channels() % groups == 0,
             "Conv2d: groups = ", groups, " must be positive and divide in_channels (", options.in_channels(),
             ") and out_channels (", options.out_channels(), ")");
  weight = Tensor::empty(
      {options.out_channels(), options.in_channels() / groups, options.kernel_size()[0], options.kernel_size()[1]});
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  register_parameter("weight", weight);
  if (options.bias()) {
    bias = Tensor::empty({options.out_channels()});
    const double bound = 1.0 / std::sqrt(static_cast<double>(init::fan_in(weight)));
    init::uniform_(bias, -bound, bound);
    register_parameter("bias", bias);
  }
}

Conv2dParams Conv2d::params() const {
  return {options_.stride(), options_.padding(), options_.dilation(), options_.groups()};
}

Tensor Conv2d::forward(const Tensor& input) { return conv2d(input, weight, bias, params()); }

BatchNorm2d::BatchNorm2d(const BatchNormOptions& options) : options_(options) {
  const int64_t c = options.num_features();
  LOOM_CHECK(c > 0, "BatchNorm2d: num_features must be positive, got ", c);
  if (options.affine()) {
    weight = Tensor::ones({c});
    bias = Tensor::zeros({c});
    register_parameter("weight", weight);
    register_parameter("bias", bias);
  }
  if (options.track_running_stats()) {
    running_mean = Tensor::zeros({c});
    running_var = Tensor::ones({c});
    num_batches_tracked = Tensor::zeros({}, DType::i64);
  }
  register_buffer("running_mean", running_mean);
  register_buffer("running_var", running_var);
  register_buffer("num_batches_tracked", num_batches_tracked);
}

Tensor BatchNorm2d::forward(const Tensor& input) { return normalize(input, Activation::none); }

Tensor BatchNorm2d::forward_fused(const Tensor& input, FusedTail tail, const Tensor& residual) {
  switch (tail) {
    case FusedTail::relu: return forward_relu(input);
    case FusedTail::add_relu: return forward_add_relu(input, residual);
    case FusedTail::relu_max_pool_2x2: return forward_relu_max_pool_2x2(input);
  }
  LOOM_FAIL("BatchNorm2d::forward_fused: unknown tail");
}

Tensor BatchNorm2d::forward_relu(const Tensor& input) { return normalize(input, Activation::relu); }

Tensor BatchNorm2d::forward_add_relu(const Tensor& input, const Tensor& residual, const Tensor& input_stats) {
  LOOM_CHECK(input.dim() == 4 && input.size(1) == options_.num_features(), "BatchNorm2d(", options_.num_features(),
             "): expected (N, ", options_.num_features(), ", H, W) input, got ", input.str());
  const bool use_batch_stats = is_training() || !running_mean.defined();
  count_batch();
  return batch_norm_add_relu(input, residual, weight, bias, running_mean, running_var, use_batch_stats,
                             options_.momentum(), options_.eps(), input_stats);
}

Tensor BatchNorm2d::forward_relu_conv(const Tensor& input, const Conv2d& conv, const Tensor& input_stats,
                                      Tensor* output_stats) {
  LOOM_CHECK(input.dim() == 4 && input.size(1) == options_.num_features(), "BatchNorm2d(", options_.num_features(),
             "): expected (N, ", options_.num_features(), ", H, W) input, got ", input.str());
  LOOM_CHECK(!conv.bias.defined(), "BatchNorm2d::forward_relu_conv: the convolution must have no bias");
  const bool use_batch_stats = is_training() || !running_mean.defined();
  count_batch();
  BatchNormReluConv2d out =
      batch_norm_relu_conv2d(input, weight, bias, running_mean, running_var, use_batch_stats, options_.momentum(),
                             options_.eps(), conv.weight, conv.params(), input_stats, output_stats != nullptr);
  if (output_stats) *output_stats = std::move(out.output_stats);
  return std::move(out.output);
}

Tensor BatchNorm2d::forward_relu_max_pool_2x2(const Tensor& input) {
  LOOM_CHECK(input.dim() == 4 && input.size(1) == options_.num_features(), "BatchNorm2d(", options_.num_features(),
             "): expected (N, ", options_.num_features(), ", H, W) input, got ", input.str());
  const bool use_batch_stats = is_training() || !running_mean.defined();
  count_batch();
  return batch_norm_relu_max_pool2d(input, weight, bias, running_mean, running_var, use_batch_stats,
                                    options_.momentum(), options_.eps());
}

void BatchNorm2d::count_batch() {
  if (is_training() && num_batches_tracked.defined()) {
    if (num_batches_tracked.device().is_cpu()) {
      ++num_batches_tracked.data<int64_t>()[0];
    } else {
      // On the device, without item(): that would wait for the GPU at every step.
      if (!one_.defined() || one_.device() != num_batches_tracked.device()) {
        one_ = Tensor::ones({}, DType::i64, num_batches_tracked.device());
      }
      num_batches_tracked.add_(one_);
    }
  }
}

Tensor BatchNorm2d::normalize(const Tensor& input, Activation activation) {
  LOOM_CHECK(input.dim() == 4 && input.size(1) == options_.num_features(), "BatchNorm2d(", options_.num_features(),
             "): expected (N, ", options_.num_features(), ", H, W) input, got ", input.str());
  const bool use_batch_stats = is_training() || !running_mean.defined();
  count_batch();
  return batch_norm(input, weight, bias, running_mean, running_var, use_batch_stats, options_.momentum(),
                    options_.eps(), activation);
}

Tensor ReLU::forward(const Tensor& input) { return relu(input); }

ReLU6::ReLU6() : ElementwiseModule(relu6, "ReLU6") {}
SiLU::SiLU() : ElementwiseModule(silu, "SiLU") {}
Sigmoid::Sigmoid() : ElementwiseModule(sigmoid, "Sigmoid") {}
GELU::GELU() : ElementwiseModule(gelu, "GELU") {}
Hardswish::Hardswish() : ElementwiseModule(hardswish, "Hardswish") {}
Hardsigmoid::Hardsigmoid() : ElementwiseModule(hardsigmoid, "Hardsigmoid") {}

MaxPool2d::MaxPool2d(int64_t kernel_size, int64_t stride, int64_t padding)
    : kernel_size_(kernel_size), stride_(stride == 0 ? kernel_size : stride), padding_(padding) {}

Tensor MaxPool2d::forward(const Tensor& input) {
  return max_pool2d(input, {kernel_size_, kernel_size_}, {stride_, stride_}, {padding_, padding_});
}

Tensor AvgPool2d::forward(const Tensor& input) {
  const int64_t k = options_.kernel_size(), s = options_.stride() == 0 ? k : options_.stride(), p = options_.padding();
  return avg_pool2d(input, {.kernel = {k, k}, .stride = {s, s}, .padding = {p, p},
                            .count_include_pad = options_.count_include_pad()});
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& input) { return adaptive_avg_pool2d(input, {output_h_, output_w_}); }

Linear::Linear(int64_t in_features, int64_t out_features, bool with_bias) {
  LOOM_CHECK(in_features > 0 && out_features > 0, "Linear: feature counts must be positive, got ", in_features,
             " -> ", out_features);
  weight = Tensor::empty({out_features, in_features});
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  register_parameter("weight", weight);
  if (with_bias) {
    bias = Tensor::empty({out_features});
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
    init::uniform_(bias, -bound, bound);
    register_parameter("bias", bias);
  }
}

Tensor Linear::forward(const Tensor& input) {
  if (input.dim() <= 2) return linear(input, weight, bias);
  // PyTorch's (*, in_features) -> (*, out_features): the leading dims as rows.
  LOOM_CHECK(input.size(input.dim() - 1) == weight.size(1), "Linear(", weight.size(1), ", ", weight.size(0),
             "): the last dim of ", input.str(), " is not ", weight.size(1));
  Shape out_sizes = input.sizes();
  out_sizes.back() = weight.size(0);
  return linear(input.reshape({-1, weight.size(1)}), weight, bias).view(out_sizes);
}

Dropout::Dropout(const DropoutOptions& options) : options_(options) {
  LOOM_CHECK(options.p() >= 0.0 && options.p() <= 1.0, "Dropout: p must be between 0 and 1, got ", options.p());
}

Tensor Dropout::forward(const Tensor& input) { return dropout(input, options_.p(), is_training()); }

StochasticDepth::StochasticDepth(const StochasticDepthOptions& options) : options_(options) {
  LOOM_CHECK(options.p() >= 0.0 && options.p() <= 1.0, "StochasticDepth: p must be between 0 and 1, got ",
             options.p());
}

Tensor StochasticDepth::forward(const Tensor& input) {
  return stochastic_depth(input, options_.p(), options_.mode(), is_training());
}

LayerNorm::LayerNorm(const LayerNormOptions& options) : options_(options) {
  const int64_t features = options.normalized_shape();
  LOOM_CHECK(features > 0, type_name(), ": normalized_shape must be positive, got ", features);
  if (options.elementwise_affine()) {
    weight = Tensor::ones({features});
    register_parameter("weight", weight);
    if (options.bias()) {
      bias = Tensor::zeros({features});
      register_parameter("bias", bias);
    }
  }
}

Tensor LayerNorm::forward(const Tensor& input) { return layer_norm(input, weight, bias, options_.eps()); }

Tensor LayerNorm2d::forward(const Tensor& input) {
  LOOM_CHECK(input.dim() == 4 && input.size(1) == options_.normalized_shape(), "LayerNorm2d(",
             options_.normalized_shape(), "): expected (N, ", options_.normalized_shape(), ", H, W) input, got ",
             input.str());
  // torchvision: x.permute(0, 2, 3, 1), F.layer_norm over C, permute(0, 3, 1, 2).
  const Tensor channels_last = input.permute({0, 2, 3, 1}).contiguous();
  return layer_norm(channels_last, weight, bias, options_.eps()).permute({0, 3, 1, 2}).contiguous();
}

Sequential::Sequential(std::initializer_list<std::shared_ptr<Module>> modules) {
  for (auto& m : modules) push_back(m);
}

void Sequential::push_back(std::shared_ptr<Module> module) {
  register_module(std::to_string(named_children().size()), std::move(module));
}

void Sequential::push_back(const std::string& name, std::shared_ptr<Module> module) {
  register_module(name, std::move(module));
}

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  const auto children = named_children();
  for (size_t i = 0; i < children.size(); ++i) {
    Module* module = children[i].second;
    // What the modules declare (Module::fuses, computes_relu, computes_max_pool_2x2), not their types.
    Module* next = i + 1 < children.size() ? children[i + 1].second : nullptr;
    Module* after = i + 2 < children.size() ? children[i + 2].second : nullptr;
    const bool relu_next = next != nullptr && next->computes_relu();
    if (relu_next && after != nullptr && after->computes_max_pool_2x2() && module->fuses(FusedTail::relu_max_pool_2x2)) {
      x = module->forward_fused(x, FusedTail::relu_max_pool_2x2);
      i += 2;
    } else if (relu_next && module->fuses(FusedTail::relu)) {
      x = module->forward_fused(x, FusedTail::relu);
      ++i;
    } else {
      x = module->forward(x);
    }
  }
  return x;
}

}  // namespace loom::nn
