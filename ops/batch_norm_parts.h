// The parts every batch-norm op is built from (ops/batch_norm.cpp defines
// them): its statistics, what its backward keeps, and its gradients. Shared
// by the ops that fuse a batch norm with what follows it (batch_norm,
// batch_norm_add_relu, batch_norm_relu_max_pool2d, batch_norm_relu_conv2d);
// not an API of its own.
#pragma once

#include <loom/core/autograd.h>
#include <loom/ops/batch_norm.h>

namespace loom::ops::detail {

// Row `i` of a (2, C) tensor of per-channel pairs, as a (C) view.
Tensor row(const Tensor& pairs, int64_t i);

// The mean and variance a forward normalises with, and the elements per
// channel they cover (over every participant once reduced).
struct ForwardStatistics {
  Tensor mean, var;  // (C)
  StatisticsCount count;
};

// A batch norm's statistics for `op` (its name in errors): in training the
// batch's (reduced by `reduce` when given; the running stats updated), in
// eval the running stats, cloned when `keep_for_backward` so that backward
// sees this forward's values even if a later step updates the buffers in
// place. `input_stats`, when defined in training, are the input's
// per-channel (sum, sum of squares) as batch_norm_stats returns them (an f64
// (2, C) tensor), computed by whatever wrote the input (a fused convolution's
// statistics epilogue): the input is then not read here.
ForwardStatistics forward_statistics(const char* op, const Tensor& input, const Tensor& running_mean,
                                     const Tensor& running_var, bool training, double momentum,
                                     const BatchStatisticsReduction& reduce, bool keep_for_backward,
                                     const Tensor& input_stats = Tensor());

// What a batch norm's backward keeps from the forward.
struct SavedForward {
  Tensor input, weight;  // detached; weight undefined without an affine transform
  ForwardStatistics statistics;
  bool training = false;
  double eps = 0;
  BatchStatisticsReduction reduce;  // empty in eval mode
  DType weight_dtype = DType::f32, bias_dtype = DType::f32;
};

SavedForward save_forward(const Tensor& input, const Tensor& weight, const Tensor& bias,
                          const ForwardStatistics& statistics, bool training, double eps,
                          const BatchStatisticsReduction& reduce);

// Whether batch_norm_gradients needs backward_reduce's sums.
bool needs_sums(const Node& node, const SavedForward& s, size_t weight_index);

// The input, weight and bias gradients of batch norm for the output gradient
// dy (masked by `relu` inside the kernels when enabled); the input is the
// node's input 0, weight and bias its inputs `weight_index` and
// `weight_index + 1`. `reduced`, when defined, are backward_reduce's sums for
// dy, computed by the caller (batch_norm_add_relu's, with its mask; a fused
// convolution's data-gradient graph).
TensorList batch_norm_gradients(const Node& node, const Tensor& dy, const SavedForward& s, const FusedRelu& relu,
                                size_t weight_index, const Tensor& reduced = Tensor());

}  // namespace loom::ops::detail
