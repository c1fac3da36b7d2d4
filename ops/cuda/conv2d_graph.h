// Fused convolution graphs through cuDNN's graph API (issue 47), built with
// NVIDIA's header-only cudnn-frontend where the build found it
// (cmake/LoomCuda.cmake; its headers stay inside ops/cuda/conv2d_graph.cpp).
//
// Two graphs: the forward of a ResNet convolution between two batch norms,
// as one cuDNN kernel,
//
//   a      = max(x * scale[c] + bias[c], 0)     the previous batch norm's
//                                               coefficients and ReLU (prologue)
//   y      = conv2d(a, w)                       no bias, groups = 1
//   sum[k] = Σ_{n,p,q} y[n,k,p,q]               the next batch norm's statistics
//   sq_sum[k] = Σ_{n,p,q} y[n,k,p,q]²           (epilogue, f32)
//
// its data gradient through the ReLU and the first batch norm's backward
// reductions (conv2d_dgrad_relu_bn_backward, below), and its weight gradient
// with the prologue recomputed as the kernel reads x (conv2d_wgrad_bn_prologue).
//
// A shape, dtype or GPU for which cuDNN has no engine is refused: the call
// returns false having written nothing, and counts a graph fallback
// (cuda::Counters::graph_fallbacks); the caller runs the unfused ops. Plans
// are built once per (device, shape, dtype, padding, stride, dilation) and
// cached, refusals too. Not yet proven on a GPU, so behind a flag: the
// training path takes them (batch_norm_relu_conv2d, ops/batch_norm_conv2d.h,
// in nn's ResNet blocks) only when conv_graphs_enabled() (LOOM_CUDNN_GRAPH=1);
// the tests also call them directly.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include <loom/core/environment.h>
#include <loom/core/tensor.h>
#include <loom/ops/conv2d.h>

namespace loom::ops::cuda {

// Whether this build holds the graphs (cudnn-frontend found when configuring).
// Without them every graph call is refused.
bool conv_graphs_built_in();

// Whether LOOM_CUDNN_GRAPH=1 is set (read once, at the first call): the
// switch for the training path (ops::batch_norm_conv_fusion). Off by default
// until a GPU run proves the graphs; the graph functions themselves run
// whatever it says. Throws
// loom::Error for a value other than 0 or 1 (conv_graphs_switch).
bool conv_graphs_enabled();

// LOOM_CUDNN_GRAPH's meaning: unset, empty or "0" off, "1" on; any other
// value throws loom::Error naming the variable and what it takes.
inline bool conv_graphs_switch(const char* value) {
  return choose_from("LOOM_CUDNN_GRAPH", value,
                     {{"0", "the default: unfused"},
                      {"1", "the fused cuDNN convolution graphs, not yet proven on a GPU"}}) == 1;
}

// Which graph a plan is for.
enum class ConvGraphKind : int64_t { forward_prologue_stats = 1, backward_data_relu_bn = 2, backward_weight_prologue = 3 };

// What a plan is built for and cached by: the graph, the device, the dtype,
// x's (N, C, H, W) (the convolution's input, or the gradient's), w's (K, R, S) (w's C is x's: groups = 1), padding, stride
// and dilation. Layouts are not part of it: every tensor of a graph is
// channels-last, its strides follow from its sizes.
using ConvGraphKey = std::array<int64_t, 16>;
inline ConvGraphKey conv_graph_key(ConvGraphKind kind, int device, DType dtype, const Shape& x_sizes,
                                   const Shape& w_sizes, const Conv2dParams& p) {
  return {static_cast<int64_t>(kind), device, static_cast<int64_t>(dtype), x_sizes[0], x_sizes[1], x_sizes[2],
          x_sizes[3], w_sizes[0], w_sizes[2], w_sizes[3], p.padding[0], p.padding[1], p.stride[0], p.stride[1],
          p.dilation[0], p.dilation[1]};
}

// The fused forward above on x's device and current stream.
//   x       (N, C, H, W) channels-last, f16 or bf16, on a CUDA device
//   scale   (C) contiguous, x's dtype (the batch norm's weight * invstd)
//   bias    (C) contiguous, x's dtype (its bias - mean * weight * invstd)
//   w       (K, C, R, S) channels-last, x's dtype; params.groups == 1
//   y       (N, K, P, Q) channels-last, x's dtype (P, Q: conv2d_output_size)
//   sum, sq_sum  (K) contiguous f32
// y, sum and sq_sum are outputs, written in place (as conv2d_backward_weight's `out`).
// Returns false, writing nothing, when the graph is refused (see above;
// groups != 1 is refused too). Throws on arguments outside this contract,
// or when cuDNN fails to run a plan it accepted.
[[nodiscard]] bool conv2d_bn_prologue_stats(const Tensor& x, const Tensor& scale, const Tensor& bias,
                                            const Tensor& w, const Conv2dParams& params, const Tensor& y,
                                            const Tensor& sum, const Tensor& sq_sum);

// The weight gradient of that forward's convolution, its input's prologue
// recomputed inside the kernel (nothing but x is read):
//   dw = the weight gradient of conv2d(max(x * scale[c] + bias[c], 0), w) for dy
//   dy (N, K, P, Q), x (N, C, H, W): channels-last, f16 or bf16 (one dtype);
//   scale, bias as conv2d_bn_prologue_stats takes them; dw (K, C, R, S)
//   channels-last, x's dtype, written in place; params.groups == 1.
// Returns false, writing nothing, when the graph is refused; throws as
// conv2d_bn_prologue_stats does.
[[nodiscard]] bool conv2d_wgrad_bn_prologue(const Tensor& dy, const Tensor& x, const Tensor& scale, const Tensor& bias,
                                            const Conv2dParams& params, const Tensor& dw);

// What the batch norm before a convolution saved in its forward: per channel
// (C), contiguous f32.
struct BatchNormSaved {
  Tensor mean, invstd;  // the batch's mean and 1 / sqrt(var + eps)
  Tensor gamma, beta;   // its weight and bias
};

// What conv2d_dgrad_relu_bn_backward writes, in place.
struct BatchNormBackwardTerms {
  Tensor dz;           // (N, C, H, W) channels-last, x's dtype: the gradient at the batch norm's output
  Tensor dgamma, dbeta;  // (C) f32
  Tensor eq_scale_dy, eq_scale_x, eq_bias;  // (C) f32: dx = eq_scale_dy * dz + eq_scale_x * x + eq_bias
};

// What the graphs take of a batch norm's forward, made in one launch by
// graph_batch_norm.
struct GraphBatchNorm {
  Tensor scale, shift;   // (C) in the convolution's dtype: the prologue's weight * invstd and bias - mean * weight * invstd
  BatchNormSaved saved;  // (C) f32, for the data-gradient graph
};

// From a batch norm's mean and (biased) variance, (C) of a floating dtype;
// its weight and bias, (C) of a floating dtype or undefined (1 and 0); its
// eps; for a convolution of `dtype` (f16 or bf16). All on one CUDA device;
// invstd = 1 / sqrt(var + eps) in f64, as batch_norm_apply computes it.
GraphBatchNorm graph_batch_norm(const Tensor& mean, const Tensor& var, const Tensor& weight, const Tensor& bias,
                                double eps, DType dtype);

// The data gradient of such a convolution carried back through its input's
// ReLU and into the batch norm before it, as one cuDNN kernel. With x that
// batch norm's input, z = (x - mean) * invstd * gamma + beta its output and
// a = max(z, 0) the convolution's input:
//   da = the input gradient of conv2d(a, w) for the output gradient dy
//   dz = da where z > 0, else 0                          (the ReLU's mask)
//   dgamma[c] = Σ_{n,h,w} dz * (x - mean[c]) * invstd[c],  dbeta[c] = Σ dz
//   eq_scale_dy, eq_scale_x, eq_bias: the batch norm's input gradient in
//   training as dx = eq_scale_dy[c] * dz + eq_scale_x[c] * x + eq_bias[c]
//   (cuDNN's batch-norm backward-weights operation; batch_norm_relu_conv2d
//   takes dx from dgamma and dbeta through batch_norm_backward_apply instead)
//   dy (N, K, P, Q), w (K, C, R, S), x (N, C, H, W): channels-last, f16 or bf16
//   (one dtype), params.groups == 1; `saved` and `out` as their comments say.
// Returns false, writing nothing, when the graph is refused; throws as
// conv2d_bn_prologue_stats does.
[[nodiscard]] bool conv2d_dgrad_relu_bn_backward(const Tensor& dy, const Tensor& w, const Tensor& x,
                                                 const BatchNormSaved& saved, const Conv2dParams& params,
                                                 const BatchNormBackwardTerms& out);

}  // namespace loom::ops::cuda
