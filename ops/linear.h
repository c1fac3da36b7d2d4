// linear: y = x · Wᵀ + b for x (N, in), W (out, in), b (out) or undefined.
//
// Backward: dx = dy · W (N, in); dW = dyᵀ · x (out, in); db = Σ_n dy (out).
// Under autocast (ops/autocast.h) it computes in the autocast dtype.
#pragma once

#include <loom/core/tensor.h>

namespace loom {

Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor());

namespace ops::cpu {
Tensor linear_forward(const Tensor& input, const Tensor& weight, const Tensor& bias);
// Any of the outputs may be skipped (want_* false → undefined). A grad_weight
// or grad_bias defined on entry that fits (the weight's dtype, contiguous) is
// written into and returned (a gradient destination); otherwise allocated.
void linear_backward(const Tensor& grad_output, const Tensor& input, const Tensor& weight, bool want_input,
                     bool want_weight, bool want_bias, Tensor& grad_input, Tensor& grad_weight, Tensor& grad_bias);
}  // namespace ops::cpu

namespace ops::cuda {
Tensor linear_forward(const Tensor& input, const Tensor& weight, const Tensor& bias);
void linear_backward(const Tensor& grad_output, const Tensor& input, const Tensor& weight, bool want_input,
                     bool want_weight, bool want_bias, Tensor& grad_input, Tensor& grad_weight, Tensor& grad_bias);
}  // namespace ops::cuda

}  // namespace loom
