// Batch normalisation over dim 1 of an (N, C) or (N, C, H, W) (any trailing
// dims) input, with PyTorch's semantics.
//
// Forward, per channel c over the m = numel / C elements of the channel:
//   training: mean, var = batch mean and biased variance; the running stats,
//             when defined, are updated in place:
//               running_mean = (1 - momentum) * running_mean + momentum * mean
//               running_var  = (1 - momentum) * running_var  + momentum * var * m / (m - 1)
//   eval:     mean, var = running_mean, running_var
//   xhat = (x - mean) * invstd,  invstd = 1 / sqrt(var + eps)
//   y    = xhat * weight + bias     (weight = 1, bias = 0 when undefined)
//
// Backward rules, with the sums over the channel's m elements
//   sum_dy = sum(dy),  sum_dy_xhat = sum(dy * xhat):
//   d weight = sum_dy_xhat,  d bias = sum_dy
//   training: dx = weight * invstd * (dy - sum_dy / m - xhat * sum_dy_xhat / m)
//   eval:     dx = weight * invstd * dy
//
// The op is built from four backend steps, with an optional statistics
// reduction between them (BatchStatisticsReduction: SyncBatchNorm's
// all-reduces): stats -> (reduce sums and count) -> gather_stats -> apply
// forward; backward_reduce -> (reduce the two sums) -> backward_apply.
//
// Mixed precision: weight, bias and the running stats may have another dtype
// than the input (f32 parameters with an f16 / bf16 input); the output and the
// input gradient have the input's dtype, the parameter gradients the
// parameter's.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>

#include <loom/core/tensor.h>

namespace loom {

// weight, bias: (C) or undefined (no affine transform). running_mean,
// running_var: (C) buffers updated in place in training, or undefined (no
// tracking; then eval mode is not possible).
// What follows the normalisation inside the same op. `relu` computes
// relu(batch_norm(x)) in one pass over the data forward and masks the incoming
// gradient inside the backward passes: BatchNorm2d + ReLU (every block of the
// ConvNet and ResNet) without the separate ReLU's two full passes.
enum class Activation { none, relu };

// How many elements per channel batch statistics cover. Usually the host
// knows it (a number converts). SyncBatchNorm's total is summed over ranks
// by the statistics' all-reduce into `total`, an f64 (1) tensor on the
// statistics' device, and the kernels read it there (PyTorch's
// batch_norm_gather_stats_with_counts): the host never waits for the
// collective to learn it.
struct StatisticsCount {
  StatisticsCount(int64_t known = 0) : known(known) {}  // NOLINT(google-explicit-constructor): a count the host knows
  StatisticsCount(int64_t at_least, Tensor total) : known(at_least), total(std::move(total)) {}
  // The count when `total` is undefined; else a lower bound of the total
  // (this participant's own count), for the host's checks.
  int64_t known = 0;
  Tensor total;
};

// Where training mode's batch statistics come from: by default this call's
// batch alone; a reduction sums them over more (SyncBatchNorm: every rank of
// a process group, dist/sync_batch_norm.h), so one op serves both.
struct BatchStatisticsReduction {
  // Forward: sums the (2, C) f64 per-channel (sum, sum of squares) in place
  // over every participant; given this batch's elements per channel, returns
  // the total (on the device, or known on the host).
  std::function<StatisticsCount(const Tensor& sums, int64_t count)> forward;
  // Backward: sums the (2, C) f64 per-channel (sum dy, sum dy * xhat) in
  // place over every participant, for the input gradient (the weight and bias
  // gradients stay this call's own).
  std::function<void(const Tensor& grad_sums)> backward;
  explicit operator bool() const { return forward != nullptr; }
};

// `reduction` applies in training mode only.
Tensor batch_norm(const Tensor& input, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum = 0.1, double eps = 1e-5,
                  Activation activation = Activation::none, const BatchStatisticsReduction& reduction = {});

// relu(batch_norm(input) + residual) in one op: the tail of a ResNet block
// (bn3, the identity add, the ReLU). The same statistics and running-stat
// updates as batch_norm; residual has the input's shape, dtype and device.
// Backward, with g = dy where the output is positive, else 0:
//   d residual = g,  d input / d weight / d bias = batch_norm's rules for g.
// On both backends one pass writes the output (batch_norm_apply with a
// residual; no normalised or summed tensor in between). `input_stats`, when
// defined, are the input's per-channel (sum, sum of squares) as
// batch_norm_stats returns them, computed by whatever wrote the input
// (batch_norm_relu_conv2d's `output_stats`); training then skips its own
// statistics pass over the input.
Tensor batch_norm_add_relu(const Tensor& input, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                           const Tensor& running_mean, const Tensor& running_var, bool training, double momentum = 0.1,
                           double eps = 1e-5, const Tensor& input_stats = Tensor());

// max_pool2d(relu(batch_norm(input)), 2) (2x2 windows, stride 2, no
// padding) in one op: the ConvNet's block tail (BatchNorm2d, ReLU,
// MaxPool2d(2)). The same statistics, running-stat updates, outputs and
// gradients as the three ops apart (the pool's choice of element: the first
// maximum, the last NaN). On the CPU neither the normalised tensor nor the
// pool's indices are written: the forward pools each plane's ReLU output
// while it is in cache, and backward recomputes the pool's choice from the
// input. On other devices it runs the ops apart.
Tensor batch_norm_relu_max_pool2d(const Tensor& input, const Tensor& weight, const Tensor& bias,
                                  const Tensor& running_mean, const Tensor& running_var, bool training,
                                  double momentum = 0.1, double eps = 1e-5);

// The argument checks batch_norm and sync_batch_norm share, with messages
// prefixed by `op`: an (N, C, ...) floating-point input; weight, bias and the
// running stats each undefined or a floating-point (C) tensor on the input's
// device; the running stats both defined or both undefined.
void check_batch_norm_arguments(const char* op, const Tensor& input, const Tensor& weight, const Tensor& bias,
                                const Tensor& running_mean, const Tensor& running_var);

namespace ops {
// The checks every backend makes of the count its kernels divide by, with
// messages prefixed by `op`: a positive `known`; a defined `total` an f64 (1)
// tensor on `device`.
void check_statistics_count(const char* op, const StatisticsCount& count, Device device);

// The fused ReLU of a forward under Activation::relu, as backward sees it: dy
// is masked to where the forward's output was positive, recomputed from the
// input (weight * xhat + bias > 0, ops/batch_norm_math.h) rather than read
// from a stored output.
struct FusedRelu {
  bool enabled = false;
  Tensor weight, bias;  // the forward's affine parameters (either may be undefined)
  // dy is the gradient of the ReLU's output pooled 2x2 with stride 2
  // (batch_norm_relu_max_pool2d): (N, C, H / 2, W / 2). CPU kernels only.
  bool pooled = false;
};
}  // namespace ops

// The kernels, twins declared once (ops/batch_norm_kernels.def).
namespace ops::cpu {
#include <loom/ops/batch_norm_kernels.def>
// batch_norm_relu_max_pool2d's forward: max_pool2d(relu(y), 2) for y as
// batch_norm_apply computes it, (N, C, H / 2, W / 2).
Tensor batch_norm_relu_max_pool2d_apply(const Tensor& input, const Tensor& mean, const Tensor& var,
                                        const Tensor& weight, const Tensor& bias, double eps);
}  // namespace ops::cpu

namespace ops::cuda {
#include <loom/ops/batch_norm_kernels.def>
}  // namespace ops::cuda

}  // namespace loom
