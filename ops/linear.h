// linear: y = x · Wᵀ + b for x (N, in), W (out, in), b (out) or undefined.
//
// Backward: dx = dy · W (N, in); dW = dyᵀ · x (out, in); db = Σ_n dy (out).
// Under autocast (ops/autocast.h) it computes in the autocast dtype.
#pragma once

#include <loom/core/tensor.h>

namespace loom {

Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor());

// The kernels, CPU and CUDA twins declared once (ops/linear_kernels.def).
namespace ops::cpu {
#include <loom/ops/linear_kernels.def>
}  // namespace ops::cpu

namespace ops::cuda {
#include <loom/ops/linear_kernels.def>
}  // namespace ops::cuda

}  // namespace loom
