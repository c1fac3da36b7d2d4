#include <loom/core/profiler.h>
#include <loom/ops/batch_norm.h>

#include <loom/ops/dispatch.h>
#include <loom/ops/elementwise.h>

namespace loom {

namespace {
// Row `i` of a (2, C) tensor of per-channel pairs, as a (C) view.
Tensor row(const Tensor& pairs, int64_t i) { return pairs.slice(0, i, i + 1).reshape({pairs.size(1)}); }

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

Tensor batch_norm(const Tensor& input, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum, double eps, Activation activation,
                  const BatchStatisticsReduction& reduction) {
  profiler::Scope profile("batch_norm", input);
  check_batch_norm_arguments("batch_norm", input, weight, bias, running_mean, running_var);
  LOOM_CHECK(training || running_mean.defined(),
             "batch_norm: eval mode normalises with the running statistics, but none were given");
  const int64_t channels = input.size(1);
  int64_t count = channels == 0 ? 0 : input.numel() / channels;  // over every participant once reduced
  const BatchStatisticsReduction reduce = training ? reduction : BatchStatisticsReduction{};
  LOOM_CHECK(!training || reduce || count > 1,
             "batch_norm: training needs more than one value per channel, got input ", shape_str(input.sizes()));

  Tensor out, mean, var;
  {
    NoGradGuard no_grad;
    if (training) {
      const Tensor stats = LOOM_DISPATCH(input, batch_norm_stats, input);
      if (reduce) {
        count = reduce.forward(stats, count);
        LOOM_CHECK(count > 1,
                   "batch_norm: training needs more than one value per channel over all participants, got ", count,
                   " (this one's input is ", shape_str(input.sizes()), ")");
      }
      const Tensor mean_var =
          LOOM_DISPATCH(input, batch_norm_gather_stats, stats, count, running_mean, running_var, momentum);
      mean = row(mean_var, 0);
      var = row(mean_var, 1);
    } else if (any_requires_grad({input, weight, bias})) {
      // Backward must see the statistics of this forward even if a later
      // training step updates the buffers in place.
      mean = running_mean.clone();
      var = running_var.clone();
    } else {
      mean = running_mean;
      var = running_var;
    }
    out = LOOM_DISPATCH(input, batch_norm_apply, input, mean, var, weight, bias, eps, activation);
  }
  // Under Activation::relu backward masks the gradient, recomputing the sign from the input.
  const bool fused_relu = activation == Activation::relu;

  record("batch_norm", {input, weight, bias}, {&out},
         [x = input.detach(), w = weight.defined() ? weight.detach() : Tensor(), mean, var, training, count, eps,
          reduce, fused_relu, b = bias.defined() ? bias.detach() : Tensor(),
          weight_dtype = weight.defined() ? weight.dtype() : DType::f32,
          bias_dtype = bias.defined() ? bias.dtype() : DType::f32](const TensorList& g, const Node& node) {
           const Tensor dy = g[0].to(x.dtype());
           const ops::FusedRelu relu_mask{fused_relu, w, b};  // the kernels mask dy as they read it
           Tensor sums;  // (2, C) f64: (sum dy, sum dy * xhat)
           if (training || node.needs_input_grad(1) || node.needs_input_grad(2)) {
             sums = LOOM_DISPATCH(x, batch_norm_backward_reduce, dy, x, mean, var, eps, relu_mask);
           }
           Tensor dx;
           if (node.needs_input_grad(0)) {
             Tensor batch_sums = training ? sums : Tensor();
             if (reduce) {  // the parameter gradients below keep this call's own sums
               batch_sums = sums.clone();
               reduce.backward(batch_sums);
             }
             dx = LOOM_DISPATCH(x, batch_norm_backward_apply, dy, x, mean, var, w, batch_sums, count, eps, relu_mask);
           }
           // The (C) parameter gradients convert from f64 into their gradient destinations when offered.
           return TensorList{dx,
                             node.needs_input_grad(1) ? gradient_to_destination(node, 1, row(sums, 1), weight_dtype)
                                                      : Tensor(),
                             node.needs_input_grad(2) ? gradient_to_destination(node, 2, row(sums, 0), bias_dtype)
                                                      : Tensor()};
         });
  return out;
}

Tensor batch_norm_add_relu(const Tensor& input, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                           const Tensor& running_mean, const Tensor& running_var, bool training, double momentum,
                           double eps) {
  LOOM_CHECK(residual.defined() && input.defined() && residual.sizes() == input.sizes(),
             "batch_norm_add_relu: the residual ", residual.defined() ? shape_str(residual.sizes()) : "(undefined)",
             " must have the input's shape ", input.defined() ? shape_str(input.sizes()) : "(undefined)");
  ops::check_same_device_and_dtype("batch_norm_add_relu", {input, residual});
  if (ops::on_cuda(input)) return relu(add(batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps), residual));
  profiler::Scope profile("batch_norm_add_relu", input);
  check_batch_norm_arguments("batch_norm_add_relu", input, weight, bias, running_mean, running_var);
  LOOM_CHECK(training || running_mean.defined(),
             "batch_norm_add_relu: eval mode normalises with the running statistics, but none were given");
  const int64_t channels = input.size(1);
  const int64_t count = channels == 0 ? 0 : input.numel() / channels;
  LOOM_CHECK(!training || count > 1, "batch_norm_add_relu: training needs more than one value per channel, got input ",
             shape_str(input.sizes()));
  // The statistics as batch_norm computes them.
  Tensor out, mean, var;
  {
    NoGradGuard no_grad;
    if (training) {
      const Tensor mean_var = ops::cpu::batch_norm_gather_stats(ops::cpu::batch_norm_stats(input), count, running_mean,
                                                           running_var, momentum);
      mean = row(mean_var, 0);
      var = row(mean_var, 1);
    } else if (any_requires_grad({input, residual, weight, bias})) {
      mean = running_mean.clone();
      var = running_var.clone();
    } else {
      mean = running_mean;
      var = running_var;
    }
    out = ops::cpu::batch_norm_apply_add_relu(input, residual, mean, var, weight, bias, eps);
  }
  // Backward masks with the output itself (the block's output, kept anyway as
  // the next block's input), then runs batch_norm's backward on the masked
  // gradient, which is also the residual's.
  record("batch_norm_add_relu", {input, residual, weight, bias}, {&out},
         [x = input.detach(), y = out.detach(), w = weight.defined() ? weight.detach() : Tensor(), mean, var, training,
          count, eps, weight_dtype = weight.defined() ? weight.dtype() : DType::f32,
          bias_dtype = bias.defined() ? bias.dtype() : DType::f32](const TensorList& g, const Node& node) {
           const Tensor masked = ops::cpu::unary_backward(ops::Unary::relu, g[0].to(x.dtype()), y);
           Tensor sums;  // (2, C) f64: (sum g, sum g * xhat)
           if (training || node.needs_input_grad(2) || node.needs_input_grad(3)) {
             sums = ops::cpu::batch_norm_backward_reduce(masked, x, mean, var, eps);
           }
           Tensor dx;
           if (node.needs_input_grad(0)) {
             dx = ops::cpu::batch_norm_backward_apply(masked, x, mean, var, w, training ? sums : Tensor(), count, eps);
           }
           return TensorList{dx, node.needs_input_grad(1) ? masked : Tensor(),
                             node.needs_input_grad(2) ? gradient_to_destination(node, 2, row(sums, 1), weight_dtype)
                                                      : Tensor(),
                             node.needs_input_grad(3) ? gradient_to_destination(node, 3, row(sums, 0), bias_dtype)
                                                      : Tensor()};
         });
  return out;
}

}  // namespace loom
