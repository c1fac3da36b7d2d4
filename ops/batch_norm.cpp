#include <loom/core/profiler.h>
#include <loom/ops/batch_norm.h>
#include <loom/ops/batch_norm_parts.h>

#include <loom/ops/dispatch.h>
#include <loom/ops/elementwise.h>
#include <loom/ops/pooling.h>

#include <tuple>

namespace loom {

namespace {
void check_per_channel(const char* op, const char* what, const Tensor& t, const Tensor& input) {
  if (!t.defined()) return;
  const int64_t channels = input.size(1);
  LOOM_CHECK(t.dim() == 1 && t.size(0) == channels, op, ": expected ", what, " of shape [", channels,
             "] for an input with ", channels, " channels, got ", shape_str(t.sizes()));
  LOOM_CHECK(is_floating(t.dtype()), op, ": ", what, " must be floating-point, got ", dtype_name(t.dtype()));
  LOOM_CHECK(t.device() == input.device(), op, ": ", what, " is on ", t.device().str(), " but the input on ",
             input.device().str());
}
}  // namespace

void check_batch_norm_arguments(const char* op, const Tensor& input, const Tensor& weight, const Tensor& bias,
                                const Tensor& running_mean, const Tensor& running_var) {
  LOOM_CHECK(input.defined() && input.dim() >= 2, op, ": expected an input of shape (N, C, ...), got ",
             input.defined() ? shape_str(input.sizes()) : "an undefined tensor");
  LOOM_CHECK(is_floating(input.dtype()), op, ": expected a floating-point input, got ", dtype_name(input.dtype()));
  check_per_channel(op, "weight", weight, input);
  check_per_channel(op, "bias", bias, input);
  check_per_channel(op, "running_mean", running_mean, input);
  check_per_channel(op, "running_var", running_var, input);
  LOOM_CHECK(running_mean.defined() == running_var.defined(), op,
             ": running_mean and running_var must be both defined or both undefined");
}

void ops::check_statistics_count(const char* op, const StatisticsCount& count, Device device) {
  LOOM_CHECK(count.known > 0, op, ": statistics over ", count.known, " elements per channel");
  const Tensor& total = count.total;
  LOOM_CHECK(!total.defined() || (total.dtype() == DType::f64 && total.numel() == 1 && total.device() == device), op,
             ": the total count must be an f64 tensor of one element on ", device.str(), ", got ", total.str());
}

namespace ops::detail {

Tensor row(const Tensor& pairs, int64_t i) { return pairs.slice(0, i, i + 1).reshape({pairs.size(1)}); }

ForwardStatistics forward_statistics(const char* op, const Tensor& input, const Tensor& running_mean,
                                     const Tensor& running_var, bool training, double momentum,
                                     const BatchStatisticsReduction& reduce, bool keep_for_backward,
                                     const Tensor& input_stats) {
  LOOM_CHECK(training || running_mean.defined(), op,
             ": eval mode normalises with the running statistics, but none were given");
  const int64_t channels = input.size(1);
  ForwardStatistics out;
  out.count = channels == 0 ? 0 : input.numel() / channels;
  LOOM_CHECK(!training || reduce || out.count.known > 1, op, ": training needs more than one value per channel, got input ",
             shape_str(input.sizes()));
  NoGradGuard no_grad;
  if (!training) {
    out.mean = keep_for_backward ? running_mean.clone() : running_mean;
    out.var = keep_for_backward ? running_var.clone() : running_var;
    return out;
  }
  LOOM_CHECK(!input_stats.defined() || (input_stats.dtype() == DType::f64 && input_stats.device() == input.device() &&
                                        input_stats.sizes() == Shape{2, channels}),
             op, ": the input's statistics must be an f64 (2, ", channels, ") tensor on ", input.device().str(),
             ", got ", input_stats.str());
  // A reduction sums in place: the caller's statistics stay as they were.
  const Tensor stats = !input_stats.defined() ? LOOM_DISPATCH(input, batch_norm_stats, input)
                       : reduce               ? input_stats.clone()
                                              : input_stats;
  if (reduce) {
    out.count = reduce.forward(stats, out.count.known);
    // A total on the device is at least `known`, which the reduction makes more than one.
    LOOM_CHECK(out.count.known > 1, op, ": training needs more than one value per channel over all participants, got ",
               out.count.known, " (this one's input is ", shape_str(input.sizes()), ")");
  }
  const Tensor mean_var =
      LOOM_DISPATCH(input, batch_norm_gather_stats, stats, out.count, running_mean, running_var, momentum);
  out.mean = row(mean_var, 0);
  out.var = row(mean_var, 1);
  return out;
}

SavedForward save_forward(const Tensor& input, const Tensor& weight, const Tensor& bias,
                          const ForwardStatistics& statistics, bool training, double eps,
                          const BatchStatisticsReduction& reduce) {
  return {input.detach(), weight.defined() ? weight.detach() : Tensor(), statistics, training, eps, reduce,
          weight.defined() ? weight.dtype() : DType::f32, bias.defined() ? bias.dtype() : DType::f32};
}

bool needs_sums(const Node& node, const SavedForward& s, size_t weight_index) {
  return s.training || node.needs_input_grad(weight_index) || node.needs_input_grad(weight_index + 1);
}

TensorList batch_norm_gradients(const Node& node, const Tensor& dy, const SavedForward& s, const FusedRelu& relu,
                                size_t weight_index, const Tensor& reduced) {
  const Tensor& x = s.input;
  const Tensor &mean = s.statistics.mean, &var = s.statistics.var;
  const size_t bias_index = weight_index + 1;
  Tensor sums = reduced;  // (2, C) f64: (sum dy, sum dy * xhat)
  if (!sums.defined() && needs_sums(node, s, weight_index)) {
    sums = LOOM_DISPATCH(x, batch_norm_backward_reduce, dy, x, mean, var, s.eps, relu);
  }
  Tensor dx;
  if (node.needs_input_grad(0)) {
    Tensor batch_sums = s.training ? sums : Tensor();
    if (s.reduce) {  // the parameter gradients below keep this call's own sums
      batch_sums = sums.clone();
      s.reduce.backward(batch_sums);
    }
    dx = LOOM_DISPATCH(x, batch_norm_backward_apply, dy, x, mean, var, s.weight, batch_sums, s.statistics.count, s.eps,
                       relu);
  }
  // The (C) parameter gradients convert from f64 into their gradient destinations when offered.
  return TensorList{
      dx,
      node.needs_input_grad(weight_index) ? gradient_to_destination(node, weight_index, row(sums, 1), s.weight_dtype)
                                          : Tensor(),
      node.needs_input_grad(bias_index) ? gradient_to_destination(node, bias_index, row(sums, 0), s.bias_dtype)
                                        : Tensor()};
}

}  // namespace ops::detail

using ops::detail::batch_norm_gradients;
using ops::detail::forward_statistics;
using ops::detail::ForwardStatistics;
using ops::detail::needs_sums;
using ops::detail::row;
using ops::detail::save_forward;

Tensor batch_norm(const Tensor& input, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum, double eps, Activation activation,
                  const BatchStatisticsReduction& reduction) {
  profiler::Scope profile("batch_norm", input);
  check_batch_norm_arguments("batch_norm", input, weight, bias, running_mean, running_var);
  const BatchStatisticsReduction reduce = training ? reduction : BatchStatisticsReduction{};
  const ForwardStatistics statistics = forward_statistics(
      "batch_norm", input, running_mean, running_var, training, momentum, reduce, any_requires_grad({input, weight, bias}));
  Tensor out;
  {
    NoGradGuard no_grad;
    out = LOOM_DISPATCH(input, batch_norm_apply, input, statistics.mean, statistics.var, weight, bias, eps, activation);
  }
  // Under Activation::relu backward masks the gradient, recomputing the sign from the input.
  const bool fused_relu = activation == Activation::relu;
  record("batch_norm", {input, weight, bias}, {&out},
         [saved = save_forward(input, weight, bias, statistics, training, eps, reduce), fused_relu,
          b = bias.defined() ? bias.detach() : Tensor()](const TensorList& g, const Node& node) {
           const ops::FusedRelu relu_mask{fused_relu, saved.weight, b};  // the kernels mask dy as they read it
           return batch_norm_gradients(node, g[0].to(saved.input.dtype()), saved, relu_mask, 1);
         });
  return out;
}

Tensor batch_norm_add_relu(const Tensor& input, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                           const Tensor& running_mean, const Tensor& running_var, bool training, double momentum,
                           double eps, const Tensor& input_stats) {
  LOOM_CHECK(residual.defined() && input.defined() && residual.sizes() == input.sizes(),
             "batch_norm_add_relu: the residual ", residual.defined() ? shape_str(residual.sizes()) : "(undefined)",
             " must have the input's shape ", input.defined() ? shape_str(input.sizes()) : "(undefined)");
  ops::check_same_device_and_dtype("batch_norm_add_relu", {input, residual});
  profiler::Scope profile("batch_norm_add_relu", input);
  check_batch_norm_arguments("batch_norm_add_relu", input, weight, bias, running_mean, running_var);
  const ForwardStatistics statistics =
      forward_statistics("batch_norm_add_relu", input, running_mean, running_var, training, momentum, {},
                         any_requires_grad({input, residual, weight, bias}), input_stats);
  Tensor out;
  {
    NoGradGuard no_grad;
    out = LOOM_DISPATCH(input, batch_norm_apply, input, statistics.mean, statistics.var, weight, bias, eps,
                        Activation::relu, residual);
  }
  // Backward masks with the output itself (the block's output, kept anyway as
  // the next block's input), then runs batch_norm's backward on the masked
  // gradient, which is also the residual's. When backward needs the sums, one
  // pass masks and sums.
  record("batch_norm_add_relu", {input, residual, weight, bias}, {&out},
         [saved = save_forward(input, weight, bias, statistics, training, eps, {}),
          y = out.detach()](const TensorList& g, const Node& node) {
           const Tensor dy = g[0].to(y.dtype());
           Tensor masked, sums;
           if (needs_sums(node, saved, 2)) {
             std::tie(sums, masked) =
                 LOOM_DISPATCH(y, batch_norm_backward_reduce_relu_output, dy, y, saved.input,
                               saved.statistics.mean, saved.statistics.var, saved.eps);
           } else {
             masked = LOOM_DISPATCH(y, unary_backward, ops::Unary::relu, dy, y);
           }
           TensorList grads = batch_norm_gradients(node, masked, saved, {}, 2, sums);
           return TensorList{grads[0], node.needs_input_grad(1) ? masked : Tensor(), grads[1], grads[2]};
         });
  return out;
}

Tensor batch_norm_relu_max_pool2d(const Tensor& input, const Tensor& weight, const Tensor& bias,
                                  const Tensor& running_mean, const Tensor& running_var, bool training,
                                  double momentum, double eps) {
  check_batch_norm_arguments("batch_norm_relu_max_pool2d", input, weight, bias, running_mean, running_var);
  LOOM_CHECK(input.dim() == 4 && input.size(2) >= 2 && input.size(3) >= 2,
             "batch_norm_relu_max_pool2d: expected an (N, C, H, W) input with H, W >= 2, got ", shape_str(input.sizes()));
  // Elsewhere, and in f16 / bf16 (whose rounding can tie values the f32
  // kernels tell apart), the ops apart.
  if (!input.device().is_cpu() || (input.dtype() != DType::f32 && input.dtype() != DType::f64)) {
    return max_pool2d(batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps,
                                 Activation::relu),
                      {2, 2});
  }
  profiler::Scope profile("batch_norm_relu_max_pool2d", input);
  const ForwardStatistics statistics =
      forward_statistics("batch_norm_relu_max_pool2d", input, running_mean, running_var, training, momentum, {},
                         any_requires_grad({input, weight, bias}));
  Tensor out;
  {
    NoGradGuard no_grad;
    out = ops::cpu::batch_norm_relu_max_pool2d_apply(input, statistics.mean, statistics.var, weight, bias, eps);
  }
  // Backward hands the pooled gradient to batch_norm's kernels, which rebuild
  // the full one plane by plane (ops::FusedRelu::pooled).
  record("batch_norm_relu_max_pool2d", {input, weight, bias}, {&out},
         [saved = save_forward(input, weight, bias, statistics, training, eps, {}),
          b = bias.defined() ? bias.detach() : Tensor()](const TensorList& g, const Node& node) {
           const ops::FusedRelu relu_mask{true, saved.weight, b, true};
           return batch_norm_gradients(node, g[0].to(saved.input.dtype()), saved, relu_mask, 1);
         });
  return out;
}

}  // namespace loom
