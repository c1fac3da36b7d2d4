// conv2d(relu(batch_norm(input)), weight) as one op: a ResNet block's batch
// norm, its ReLU and the convolution after them (issue 47).
//
// With training-mode statistics and the running stats updated as batch_norm
// does, the op computes what the three ops apart compute, and its gradients
// are theirs: the input's and the batch norm's weight and bias through
// batch_norm's rules with the ReLU's mask, the convolution weight's through
// conv2d's. What differs is what runs and what is kept:
//   - on CUDA, for an f16 / bf16 channels-last input, a channels-last weight
//     and groups = 1, one cuDNN graph applies the normalisation and the ReLU
//     as it reads the input, convolves, and sums the output per channel for
//     the next batch norm (ops/cuda/conv2d_graph.h, conv2d_bn_prologue_stats);
//     backward runs the data gradient, the ReLU mask and the batch norm's
//     reductions as one more (conv2d_dgrad_relu_bn_backward), and the weight
//     gradient, recomputing the activation as it reads the input, as a third
//     (conv2d_wgrad_bn_prologue). What cuDNN refuses runs as below, counted
//     as a graph fallback;
//   - elsewhere the batch norm's kernels and the convolution's run in turn,
//     exactly as the ops apart (the same kernels in the same order: the same
//     values bit for bit);
//   - either way only the input is kept for backward, not the activation
//     relu(batch_norm(input)): backward recomputes it for the weight gradient
//     (inside the graph, or with batch_norm_apply).
//
// `output_stats` (asked by `want_output_stats`, in training) are the output's
// per-channel (sum, sum of squares) as batch_norm_stats returns them, an f64
// (2, K) tensor: the next batch norm takes them as its `input_stats`
// (batch_norm_add_relu, this op) instead of reading the output again. From
// the graph they are its f32 epilogue's sums; otherwise batch_norm_stats'.
//
// Not under autocast (amp O1): the ops apart run there (a user of this op
// passes tensors of one dtype; it throws otherwise).
#pragma once

#include <loom/core/device.h>
#include <loom/core/tensor.h>
#include <loom/ops/batch_norm.h>
#include <loom/ops/conv2d.h>

namespace loom {

struct BatchNormReluConv2d {
  Tensor output;        // (N, K, P, Q), the input's dtype; channels-last from the graph, else as conv2d lays it out
  Tensor output_stats;  // (2, K) f64, or undefined (see above)
};

// input (N, C, H, W); weight, bias, running_mean, running_var: batch_norm's
// (C); conv_weight (K, C / groups, R, S) of the input's dtype; `input_stats`:
// batch_norm_add_relu's.
BatchNormReluConv2d batch_norm_relu_conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias,
                                           const Tensor& running_mean, const Tensor& running_var, bool training,
                                           double momentum, double eps, const Tensor& conv_weight,
                                           const Conv2dParams& params, const Tensor& input_stats = Tensor(),
                                           bool want_output_stats = false);

namespace ops {
// Whether nn's ResNet blocks run batch_norm_relu_conv2d for tensors on
// `device`: on CUDA when LOOM_CUDNN_GRAPH=1 (ops::cuda::conv_graphs_enabled;
// the fused cuDNN graphs, not yet proven on a GPU); anywhere inside a
// FuseBatchNormConv scope. Elsewhere they run the ops apart.
bool batch_norm_conv_fusion(Device device);

// Within its scope, on this thread, batch_norm_conv_fusion is true on every
// device (on the CPU the fused op runs the ops apart, keeping one activation
// fewer per block for a recomputation in backward): how the tests compare a
// model's fused and unfused steps.
class FuseBatchNormConv {
 public:
  FuseBatchNormConv();
  ~FuseBatchNormConv();
  FuseBatchNormConv(const FuseBatchNormConv&) = delete;
  FuseBatchNormConv& operator=(const FuseBatchNormConv&) = delete;

 private:
  bool previous_;
};
}  // namespace ops

}  // namespace loom
