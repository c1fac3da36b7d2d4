// Batch norm's per-channel math, written once for both backends
// (ops/cpu/batch_norm*.cpp on the host, ops/cuda/batch_norm.cu on the device):
// the statistics from the sums, the running-statistics update, the forward's
// affine coefficients, the backward's coefficients, and the fused ReLU's mask.
// Coefficients are computed in f64 from (C) values of any floating dtype; the
// element passes apply them in the compute type A (float, or double for f64).
#pragma once

#include <math.h>

#include <cstdint>
#include <type_traits>

#include <loom/core/host_device.h>
#include <loom/core/memory_format.h>
#include <loom/core/tensor.h>

namespace loom::ops::batch_norm_math {

// The input viewed as (N, C, S), S the product of the trailing dims (1 for an
// (N, C) input), stored either so (channels_first) or as (N, S, C)
// (channels-last 4-d tensors on CUDA).
struct ChannelGeometry {
  int64_t batch = 0, channels = 0, inner = 0;
  bool channels_last = false;
  LOOM_HOST_DEVICE int64_t per_channel() const { return batch * inner; }  // elements of one channel
  LOOM_HOST_DEVICE int64_t numel() const { return batch * channels * inner; }
  // The channel of the element at memory offset i.
  LOOM_HOST_DEVICE int64_t channel_of(int64_t i) const {
    return channels_last ? i % channels : (i / inner) % channels;
  }
};

// The geometry of an (N, C, ...) tensor stored in `format` (nhwc: 4-d channels-last).
inline ChannelGeometry channel_geometry(const Tensor& x, MemoryFormat format = MemoryFormat::nchw) {
  ChannelGeometry g;
  g.batch = x.size(0);
  g.channels = x.size(1);
  g.inner = g.batch * g.channels == 0 ? 0 : x.numel() / (g.batch * g.channels);
  g.channels_last = format == MemoryFormat::nhwc;
  return g;
}

LOOM_HOST_DEVICE inline double inverse_std(double var, double eps) { return 1.0 / sqrt(var + eps); }

// Mean and biased variance from a channel's (sum, sum of squares) over
// `count` elements: E[x^2] - mean^2 in f64, clamped because rounding can make
// it slightly negative.
struct Statistics {
  double mean, var;
};
LOOM_HOST_DEVICE inline Statistics statistics(double sum, double sum_of_squares, double count) {
  const double mean = sum / count;
  const double var = sum_of_squares / count - mean * mean;
  return {mean, var > 0.0 ? var : 0.0};
}

// running = (1 - momentum) * running + momentum * value; the variance's value
// is unbiased (var * count / (count - 1)), as PyTorch's.
LOOM_HOST_DEVICE inline double running_mean_update(double running, double mean, double momentum) {
  return (1 - momentum) * running + momentum * mean;
}
LOOM_HOST_DEVICE inline double running_var_update(double running, double var, double count, double momentum) {
  const double unbiased = count > 1 ? count / (count - 1) : 1.0;
  return (1 - momentum) * running + momentum * var * unbiased;
}

// The forward as y = x * scale + shift: scale = weight * invstd,
// shift = bias - mean * scale. The fused ReLU's backward recomputes its mask
// from these, so forward and backward take them from this one function.
struct Affine {
  double scale, shift;
};
LOOM_HOST_DEVICE inline Affine affine(double mean, double var, double weight, double bias, double eps) {
  const double scale = weight * inverse_std(var, eps);
  return {scale, bias - mean * scale};
}

// dx = k * (dy - mean_dy) - p * (x - mean) in training, dx = k * dy in eval:
// k = weight * invstd, mean_dy = sum dy / count,
// p = k * invstd * (sum dy * xhat) / count.
LOOM_HOST_DEVICE inline double eval_backward_scale(double var, double weight, double eps) {
  return weight * inverse_std(var, eps);  // k
}
struct Backward {
  double k, mean_dy, p;
};
LOOM_HOST_DEVICE inline Backward backward(double var, double weight, double eps, double sum_dy, double sum_dy_xhat,
                                          double count) {
  const double invstd = inverse_std(var, eps);
  const double k = weight * invstd;
  return {k, sum_dy / count, k * invstd * sum_dy_xhat / count};
}

// x * scale + shift in A, rounded as a multiply then an add (never a fused
// multiply-add), so that the forward's output and the backward's recomputed
// mask agree exactly on either backend. (The CPU file is also built with
// -ffp-contract=off for its vectorised loops.)
template <class A>
LOOM_HOST_DEVICE inline A apply(A x, A scale, A shift) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<A, float>) {
    return __fadd_rn(__fmul_rn(x, scale), shift);
  } else {
    return __dadd_rn(__dmul_rn(x, scale), shift);
  }
#else
  return x * scale + shift;
#endif
}

// The forward's output for one element: x * scale + shift, plus the residual
// (batch_norm_add_relu), then max(., 0) as std::max computes it (a NaN stays
// NaN) under the fused ReLU. The residual is added after the affine step's
// rounding, the same on both backends.
template <bool Relu, bool Residual, class A>
LOOM_HOST_DEVICE inline A epilogue(A x, A residual, A scale, A shift) {
  A y = apply(x, scale, shift);
  if constexpr (Residual) y = y + residual;
  if constexpr (Relu) y = y < A(0) ? A(0) : y;
  return y;
}

// dy where the fused ReLU's output x * scale + shift was positive, else 0.
template <class A>
LOOM_HOST_DEVICE inline A relu_masked(A dy, A x, A scale, A shift) {
  return apply(x, scale, shift) > A(0) ? dy : A(0);
}

// Calls fn.template operator()<Flag>() with Flag = value: a run-time choice
// made once, outside the element loops, as a template argument.
template <class Fn>
auto with_flag(bool value, Fn&& fn) {
  return value ? fn.template operator()<true>() : fn.template operator()<false>();
}

}  // namespace loom::ops::batch_norm_math
