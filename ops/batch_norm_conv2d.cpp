#include <loom/ops/batch_norm_conv2d.h>

#include <optional>
#include <tuple>

#include <loom/core/memory_format.h>
#include <loom/core/profiler.h>
#include <loom/ops/autocast.h>
#include <loom/ops/batch_norm_parts.h>
#include <loom/ops/dispatch.h>
#if defined(LOOM_CUDA_OPS)
#include <loom/ops/cuda/conv2d_graph.h>
#endif

namespace loom {

namespace ops {
namespace {
thread_local bool t_forced = false;
}  // namespace

bool batch_norm_conv_fusion(Device device) {
  if (t_forced) return true;
#if defined(LOOM_CUDA_OPS)
  return device.is_cuda() && cuda::conv_graphs_enabled();
#else
  return false;
#endif
}

FuseBatchNormConv::FuseBatchNormConv() : previous_(t_forced) { t_forced = true; }
FuseBatchNormConv::~FuseBatchNormConv() { t_forced = previous_; }
}  // namespace ops

namespace {
using ops::detail::ForwardStatistics;
using ops::detail::row;
using ops::detail::SavedForward;

void check_arguments(const Tensor& input, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                     const Tensor& running_var, const Tensor& conv_weight, const Conv2dParams& params) {
  const char* op = "batch_norm_relu_conv2d";
  check_batch_norm_arguments(op, input, weight, bias, running_mean, running_var);
  LOOM_CHECK(input.dim() == 4, op, ": expected an input of shape (N, C, H, W), got ", shape_str(input.sizes()));
  LOOM_CHECK(conv_weight.defined() && conv_weight.dim() == 4 && params.groups >= 1 &&
                 conv_weight.size(1) * params.groups == input.size(1) && conv_weight.size(0) % params.groups == 0,
             op, ": the convolution weight ", conv_weight.str(), " with groups = ", params.groups,
             " does not fit an input of ", input.size(1), " channels");
  ops::check_same_device_and_dtype(op, {input, conv_weight});
  LOOM_CHECK(!ops::autocast_lowers({input, conv_weight}), op,
             ": not under autocast; run batch_norm and conv2d apart there");
  conv2d_output_size({input.size(2), input.size(3)}, {conv_weight.size(2), conv_weight.size(3)}, params);
}

// The activation the convolution reads: relu(batch_norm(input)) with the
// forward's statistics (no gradient recorded).
Tensor activation(const SavedForward& s, const Tensor& bias) {
  NoGradGuard no_grad;
  return LOOM_DISPATCH(s.input, batch_norm_apply, s.input, s.statistics.mean, s.statistics.var, s.weight, bias, s.eps,
                       Activation::relu);
}

#if defined(LOOM_CUDA_OPS)
// Whether the fused cuDNN graphs could take this convolution (they may still refuse its shape).
bool graph_candidate(const Tensor& input, const Tensor& conv_weight, const Conv2dParams& params) {
  return input.device().is_cuda() && ops::cuda::conv_graphs_built_in() &&
         (input.dtype() == DType::f16 || input.dtype() == DType::bf16) && params.groups == 1 &&
         is_channels_last(input) && is_channels_last(conv_weight);
}

// The forward as one graph: the output and its f32 sums, or nothing when cuDNN refuses.
std::optional<BatchNormReluConv2d> graph_forward(const Tensor& input, const ops::cuda::GraphBatchNorm& bn,
                                                 const Tensor& conv_weight, const Conv2dParams& params,
                                                 bool want_output_stats) {
  const Size2 hw =
      conv2d_output_size({input.size(2), input.size(3)}, {conv_weight.size(2), conv_weight.size(3)}, params);
  const int64_t out_channels = conv_weight.size(0);
  const Tensor y = empty_with_format({input.size(0), out_channels, hw[0], hw[1]}, input.dtype(), input.device(),
                                     MemoryFormat::nhwc);
  const Tensor sums = Tensor::empty({2, out_channels}, DType::f32, input.device());
  if (!ops::cuda::conv2d_bn_prologue_stats(input, bn.scale, bn.shift, conv_weight, params, y, row(sums, 0),
                                           row(sums, 1))) {
    return std::nullopt;
  }
  return BatchNormReluConv2d{y, want_output_stats ? sums.to(DType::f64) : Tensor()};
}

// The gradients of the input, the batch norm's weight and bias through one
// data-gradient graph, or nothing when cuDNN refuses. dy channels-last.
std::optional<TensorList> graph_backward(const Node& node, const Tensor& dy, const SavedForward& s,
                                         const ops::cuda::GraphBatchNorm& bn, const Tensor& conv_weight,
                                         const Conv2dParams& params) {
  const Tensor& x = s.input;
  const Device device = x.device();
  const int64_t channels = x.size(1);
  // (sum dz, sum dz * xhat): backward_reduce's rows.
  const Tensor sums = Tensor::empty({2, channels}, DType::f32, device);
  const ops::cuda::BatchNormBackwardTerms terms{
      empty_with_format(x.sizes(), x.dtype(), device, MemoryFormat::nhwc), row(sums, 1), row(sums, 0),
      Tensor::empty({channels}, DType::f32, device), Tensor::empty({channels}, DType::f32, device),
      Tensor::empty({channels}, DType::f32, device)};
  if (!ops::cuda::conv2d_dgrad_relu_bn_backward(dy, conv_weight, x, bn.saved, params, terms)) return std::nullopt;
  // dz is already masked by the ReLU; batch_norm's input gradient from its sums.
  return ops::detail::batch_norm_gradients(node, terms.dz, s, {}, 1, sums.to(DType::f64));
}

// The convolution weight's gradient through the weight-gradient graph (the
// activation recomputed inside it), into the node's gradient destination
// where that fits; undefined when cuDNN refuses. dy channels-last.
Tensor graph_weight_gradient(const Node& node, const Tensor& dy, const Tensor& x, const ops::cuda::GraphBatchNorm& bn,
                             const Tensor& conv_weight, const Conv2dParams& params) {
  const Tensor& destination = node.gradient_destination(3);
  const bool fits = destination.defined() && destination.sizes() == conv_weight.sizes() &&
                    destination.dtype() == x.dtype() && destination.device() == x.device() &&
                    is_channels_last(destination);
  const Tensor dw =
      fits ? destination : empty_with_format(conv_weight.sizes(), x.dtype(), x.device(), MemoryFormat::nhwc);
  return ops::cuda::conv2d_wgrad_bn_prologue(dy, x, bn.scale, bn.shift, params, dw) ? dw : Tensor();
}
#endif

}  // namespace

BatchNormReluConv2d batch_norm_relu_conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias,
                                           const Tensor& running_mean, const Tensor& running_var, bool training,
                                           double momentum, double eps, const Tensor& conv_weight,
                                           const Conv2dParams& params, const Tensor& input_stats,
                                           bool want_output_stats) {
  profiler::Scope profile("batch_norm_relu_conv2d", input);
  check_arguments(input, weight, bias, running_mean, running_var, conv_weight, params);
  const ForwardStatistics statistics = ops::detail::forward_statistics(
      "batch_norm_relu_conv2d", input, running_mean, running_var, training, momentum, {},
      any_requires_grad({input, weight, bias, conv_weight}), input_stats);
  const SavedForward saved = ops::detail::save_forward(input, weight, bias, statistics, training, eps, {});
  const Tensor b = bias.defined() ? bias.detach() : Tensor();
  want_output_stats = want_output_stats && training;
  BatchNormReluConv2d out;
  std::shared_ptr<const void> graph_state;  // the graphs' coefficients when the forward ran as a graph
  {
    NoGradGuard no_grad;
#if defined(LOOM_CUDA_OPS)
    if (graph_candidate(input, conv_weight, params)) {
      auto bn = std::make_shared<ops::cuda::GraphBatchNorm>(
          ops::cuda::graph_batch_norm(statistics.mean, statistics.var, weight, bias, eps, input.dtype()));
      if (auto fused = graph_forward(input, *bn, conv_weight, params, want_output_stats)) {
        out = std::move(*fused);
        graph_state = std::move(bn);
      }
    }
#endif
    if (!out.output.defined()) {
      out.output = LOOM_DISPATCH(input, conv2d_forward, activation(saved, b), conv_weight, Tensor(), params);
      if (want_output_stats) out.output_stats = LOOM_DISPATCH(out.output, batch_norm_stats, out.output);
    }
  }
  record("batch_norm_relu_conv2d", {input, weight, bias, conv_weight}, {&out.output},
         [saved, b, w = conv_weight.detach(), params, graph_state](const TensorList& g, const Node& node) {
           const Tensor dy = g[0].to(saved.input.dtype());
           bool batch_norm_grads = node.needs_input_grad(0) || node.needs_input_grad(1) || node.needs_input_grad(2);
           bool weight_grad = node.needs_input_grad(3);
           TensorList grads{Tensor(), Tensor(), Tensor()};
           Tensor dw;
#if defined(LOOM_CUDA_OPS)
           // The graphs where the forward ran as one; what they refuse runs below.
           if (graph_state) {
             const auto& bn = *static_cast<const ops::cuda::GraphBatchNorm*>(graph_state.get());
             const Tensor dy_nhwc = in_memory_format(dy, MemoryFormat::nhwc);
             if (batch_norm_grads) {
               if (auto fused = graph_backward(node, dy_nhwc, saved, bn, w, params)) {
                 grads = std::move(*fused);
                 batch_norm_grads = false;
               }
             }
             if (weight_grad) {
               dw = graph_weight_gradient(node, dy_nhwc, saved.input, bn, w, params);
               weight_grad = !dw.defined();
             }
           }
#endif
           // The ops apart, as their own backwards run them.
           if (batch_norm_grads || weight_grad) {
             const Tensor a = activation(saved, b);
             Tensor da;
             if (batch_norm_grads && weight_grad) {
               std::tie(da, dw) = LOOM_DISPATCH(dy, conv2d_backward_input_weight, dy, a, w, params,
                                                node.gradient_destination(3), Tensor());
             } else if (batch_norm_grads) {
               da = LOOM_DISPATCH(dy, conv2d_backward_input, dy, w, a.sizes(), params, Tensor());
             } else {
               dw = LOOM_DISPATCH(dy, conv2d_backward_weight, dy, a, w.sizes(), params, node.gradient_destination(3));
             }
             if (batch_norm_grads) {
               grads = ops::detail::batch_norm_gradients(node, da, saved, ops::FusedRelu{true, saved.weight, b}, 1);
             }
           }
           return TensorList{grads[0], grads[1], grads[2], dw};
         });
  return out;
}

}  // namespace loom
