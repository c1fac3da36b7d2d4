// The layers of the tutorials' and torchvision's networks, with PyTorch's
// names, options and default initialisation: Conv2d (grouped and depthwise
// too), BatchNorm2d, ReLU, ReLU6, SiLU, Sigmoid, GELU, Hardswish, Hardsigmoid,
// MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, Linear, Permute, Flatten, Dropout,
// StochasticDepth, LayerNorm, LayerNorm2d, Sequential.
#pragma once

#include <array>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include <loom/core/options.h>
#include <loom/nn/module.h>
#include <loom/ops/batch_norm.h>
#include <loom/ops/conv2d.h>
#include <loom/ops/dropout.h>

namespace loom::nn {

// Conv2dOptions(in, out, kernel).stride(2).padding(1).bias(false)
class Conv2dOptions {
 public:
  using Pair = std::array<int64_t, 2>;  // (height, width)
  Conv2dOptions(int64_t in_channels, int64_t out_channels, int64_t kernel_size)
      : in_channels_(in_channels), out_channels_(out_channels), kernel_size_{kernel_size, kernel_size} {}
  // The same value along both dimensions.
  Conv2dOptions& kernel_size(int64_t h, int64_t w) { kernel_size_ = {h, w}; return *this; }
  Conv2dOptions& stride(int64_t s) { stride_ = {s, s}; return *this; }
  Conv2dOptions& padding(int64_t p) { padding_ = {p, p}; return *this; }
  Conv2dOptions& dilation(int64_t d) { dilation_ = {d, d}; return *this; }

  LOOM_OPTION(int64_t, in_channels);
  LOOM_OPTION(int64_t, out_channels);
  // Window (height, width); the constructor's is square.
  LOOM_OPTION(Pair, kernel_size);
  // Step between windows (default 1).
  LOOM_OPTION(Pair, stride) = {1, 1};
  // Zeros added on every side (default 0).
  LOOM_OPTION(Pair, padding) = {0, 0};
  // Spacing between a window's taps (default 1).
  LOOM_OPTION(Pair, dilation) = {1, 1};
  // A learned bias per output channel (default true).
  LOOM_OPTION(bool, bias) = true;
  // Channel groups: in_channels and out_channels must be multiples of it;
  // in_channels for a depthwise convolution (default 1).
  LOOM_OPTION(int64_t, groups) = 1;
};

class Conv2d : public Module {
 public:
  explicit Conv2d(const Conv2dOptions& options);
  Conv2d(int64_t in, int64_t out, int64_t kernel, int64_t stride = 1, int64_t padding = 0)
      : Conv2d(Conv2dOptions(in, out, kernel).stride(stride).padding(padding)) {}
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Conv2d"; }
  const Conv2dOptions& options() const { return options_; }
  // The options' geometry, as conv2d takes it.
  Conv2dParams params() const;

  Tensor weight;  // (out, in, kh, kw)
  Tensor bias;    // (out) or undefined

 private:
  Conv2dOptions options_;
};

// BatchNormOptions(channels).eps(1e-3).momentum(0.01)
class BatchNormOptions {
 public:
  explicit BatchNormOptions(int64_t num_features) : num_features_(num_features) {}
  // Channels.
  LOOM_OPTION(int64_t, num_features);
  // Added to the variance before the square root (default 1e-5).
  LOOM_OPTION(double, eps) = 1e-5;
  // Weight of the new batch in the running statistics (PyTorch's convention, default 0.1).
  LOOM_OPTION(double, momentum) = 0.1;
  // A learned weight and bias per channel (default true).
  LOOM_OPTION(bool, affine) = true;
  // Keep running mean and variance for evaluation (default true).
  LOOM_OPTION(bool, track_running_stats) = true;
};

class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(const BatchNormOptions& options);
  explicit BatchNorm2d(int64_t num_features) : BatchNorm2d(BatchNormOptions(num_features)) {}
  Tensor forward(const Tensor& input) override;
  // Declares all three fused tails: relu (forward_relu), add_relu
  // (forward_add_relu) and relu_max_pool_2x2 (forward_relu_max_pool_2x2).
  // A subclass that changes forward() declares anew (see Module::fuses), as
  // SyncBatchNorm does (no fused tail).
  bool fuses(FusedTail tail) const override { return true; }
  Tensor forward_fused(const Tensor& input, FusedTail tail, const Tensor& residual = {}) override;
  BatchNorm2d* batch_norm_to_synchronize() override { return this; }
  // relu(forward(input)) as one fused op (the ReLU mask is recomputed in
  // backward). Virtual: SyncBatchNorm's computes its synchronized statistics.
  virtual Tensor forward_relu(const Tensor& input);
  // relu(forward(input) + residual) as one fused op (batch_norm_add_relu): the
  // tail of a ResNet block, with this class's (local) statistics.
  // `input_stats`: the input's per-channel sums when what wrote it computed
  // them (forward_relu_conv's `output_stats`).
  Tensor forward_add_relu(const Tensor& input, const Tensor& residual, const Tensor& input_stats = Tensor());
  // conv.forward(relu(forward(input))) as one op (batch_norm_relu_conv2d),
  // with this class's (local) statistics, for a Conv2d without bias. With
  // `output_stats` non-null, in training, sets it to the output's
  // per-channel sums for the next batch norm (else to undefined).
  Tensor forward_relu_conv(const Tensor& input, const Conv2d& conv, const Tensor& input_stats = Tensor(),
                           Tensor* output_stats = nullptr);
  // max_pool2d(relu(forward(input)), 2) as one fused op
  // (batch_norm_relu_max_pool2d): the ConvNet's block tail, BatchNorm2d, ReLU
  // and MaxPool2d(2), with this class's (local) statistics.
  Tensor forward_relu_max_pool_2x2(const Tensor& input);
  std::string type_name() const override { return "BatchNorm2d"; }
  const BatchNormOptions& options() const { return options_; }

  Tensor weight, bias;                 // (C), ones / zeros
  Tensor running_mean, running_var;    // (C), zeros / ones
  Tensor num_batches_tracked;          // i64 scalar

 protected:
  Tensor normalize(const Tensor& input, Activation activation);
  // In training mode, adds one to num_batches_tracked (when it is tracked).
  void count_batch();
  BatchNormOptions options_;

 private:
  // An i64 one on num_batches_tracked's device, made once (not per step):
  // on a GPU each batch's count is one launch, the add, instead of two.
  Tensor one_;
};

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  bool computes_relu() const override { return true; }
  std::string type_name() const override { return "ReLU"; }
};

// A module that applies one elementwise function: the activations of
// MobileNet, EfficientNet and RegNet below (ops/elementwise.h). PyTorch's
// `inplace` flag has no counterpart: loom's ops write new tensors.
class ElementwiseModule : public Module {
 public:
  using Function = Tensor (*)(const Tensor&);
  ElementwiseModule(Function function, std::string name) : function_(function), name_(std::move(name)) {}
  Tensor forward(const Tensor& input) override { return function_(input); }
  std::string type_name() const override { return name_; }

 private:
  Function function_;
  std::string name_;
};

class ReLU6 : public ElementwiseModule {
 public:
  ReLU6();
};
class SiLU : public ElementwiseModule {
 public:
  SiLU();
};
class Sigmoid : public ElementwiseModule {
 public:
  Sigmoid();
};
// PyTorch's GELU with approximate 'none' (ConvNeXt).
class GELU : public ElementwiseModule {
 public:
  GELU();
};
class Hardswish : public ElementwiseModule {
 public:
  Hardswish();
};
class Hardsigmoid : public ElementwiseModule {
 public:
  Hardsigmoid();
};

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(int64_t kernel_size, int64_t stride = 0, int64_t padding = 0);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "MaxPool2d"; }
  // 2x2 windows, stride 2, no padding.
  bool is_2x2() const { return kernel_size_ == 2 && stride_ == 2 && padding_ == 0; }
  bool computes_max_pool_2x2() const override { return is_2x2(); }

 private:
  int64_t kernel_size_, stride_, padding_;
};

// AvgPool2dOptions(3).stride(2).padding(1)
class AvgPool2dOptions {
 public:
  explicit AvgPool2dOptions(int64_t kernel_size) : kernel_size_(kernel_size) {}
  // Square window.
  LOOM_OPTION(int64_t, kernel_size);
  // Step between windows; 0 (the default) means the kernel size, as PyTorch's stride=None.
  LOOM_OPTION(int64_t, stride) = 0;
  // Zeros added on every side, at most half the kernel (default 0).
  LOOM_OPTION(int64_t, padding) = 0;
  // Divide by the whole window, padding included (PyTorch's default true), or by its input elements.
  LOOM_OPTION(bool, count_include_pad) = true;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(const AvgPool2dOptions& options) : options_(options) {}
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "AvgPool2d"; }
  const AvgPool2dOptions& options() const { return options_; }

 private:
  AvgPool2dOptions options_;
};

class AdaptiveAvgPool2d : public Module {
 public:
  AdaptiveAvgPool2d(int64_t output_h, int64_t output_w) : output_h_(output_h), output_w_(output_w) {}
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "AdaptiveAvgPool2d"; }

 private:
  int64_t output_h_, output_w_;
};

// y = x W^T + b over the last dim of x: (N, in) or (*, in) -> (*, out).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Linear"; }

  Tensor weight;  // (out, in)
  Tensor bias;    // (out) or undefined
};

// torchvision.ops.misc.Permute: input.permute(dims), here made contiguous
// (ConvNeXt's NCHW <-> NHWC); no parameters.
class Permute : public Module {
 public:
  explicit Permute(std::vector<int64_t> dims) : dims_(std::move(dims)) {}
  Tensor forward(const Tensor& input) override { return input.permute(dims_).contiguous(); }
  std::string type_name() const override { return "Permute"; }

 private:
  std::vector<int64_t> dims_;
};

class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1) : start_dim_(start_dim) {}
  Tensor forward(const Tensor& input) override { return input.flatten(start_dim_); }
  std::string type_name() const override { return "Flatten"; }

 private:
  int64_t start_dim_;
};

// DropoutOptions().p(0.2)
class DropoutOptions {
  // Probability of zeroing an element in training (default 0.5).
  LOOM_OPTION(double, p) = 0.5;
};

// In training, zeroes each element with probability p and scales the rest by
// 1 / (1 - p) (ops/dropout.h); the identity in evaluation.
class Dropout : public Module {
 public:
  explicit Dropout(const DropoutOptions& options = {});
  explicit Dropout(double p) : Dropout(DropoutOptions().p(p)) {}
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Dropout"; }
  const DropoutOptions& options() const { return options_; }

 private:
  DropoutOptions options_;
};

// StochasticDepthOptions(0.1).mode(StochasticDepthMode::row)
class StochasticDepthOptions {
 public:
  explicit StochasticDepthOptions(double p) : p_(p) {}
  // Probability of dropping a sample's residual branch ("row") or the batch's ("batch").
  LOOM_OPTION(double, p);
  // One draw per sample (torchvision's "row", the default) or one for the batch.
  LOOM_OPTION(StochasticDepthMode, mode) = StochasticDepthMode::row;
};

// torchvision.ops.StochasticDepth: ops/dropout.h's stochastic_depth in
// training, the identity in evaluation.
class StochasticDepth : public Module {
 public:
  explicit StochasticDepth(const StochasticDepthOptions& options);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "StochasticDepth"; }
  const StochasticDepthOptions& options() const { return options_; }

 private:
  StochasticDepthOptions options_;
};

// LayerNormOptions(768).eps(1e-6)
class LayerNormOptions {
 public:
  explicit LayerNormOptions(int64_t normalized_shape) : normalized_shape_(normalized_shape) {}
  // The size of the last dimension, which is normalised (PyTorch's
  // normalized_shape of one dimension).
  LOOM_OPTION(int64_t, normalized_shape);
  // Added to the variance before the square root (default 1e-5).
  LOOM_OPTION(double, eps) = 1e-5;
  // A learned weight (ones) and bias (zeros) per feature (default true).
  LOOM_OPTION(bool, elementwise_affine) = true;
  // With elementwise_affine, whether the bias is learned too (default true).
  LOOM_OPTION(bool, bias) = true;
};

// PyTorch's LayerNorm over the last dimension (ops/layer_norm.h).
class LayerNorm : public Module {
 public:
  explicit LayerNorm(const LayerNormOptions& options);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "LayerNorm"; }
  const LayerNormOptions& options() const { return options_; }

  Tensor weight, bias;  // (D): ones / zeros, or undefined

 protected:
  LayerNormOptions options_;
};

// torchvision's ConvNeXt LayerNorm2d: LayerNorm over the channels of an
// (N, C, H, W) input, computed on its NHWC permutation and permuted back.
class LayerNorm2d : public LayerNorm {
 public:
  using LayerNorm::LayerNorm;
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "LayerNorm2d"; }
};

// Children named "0", "1", ..., applied in order; or named by the caller, as
// PyTorch's Sequential(OrderedDict) (RegNet's "a", "b", "se", "c"). A module
// that fuses() a tail followed by the modules it stands for runs as one fused
// op (same result): BatchNorm2d + ReLU (+ MaxPool2d(2)).
class Sequential : public Module {
 public:
  Sequential() = default;
  Sequential(std::initializer_list<std::shared_ptr<Module>> modules);
  // Appends `module` named by its position ("0", "1", ...).
  void push_back(std::shared_ptr<Module> module);
  // Appends `module` named `name`.
  void push_back(const std::string& name, std::shared_ptr<Module> module);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Sequential"; }
  size_t size() const { return named_children().size(); }
};

}  // namespace loom::nn
