// What the two sets of CUDA batch-norm kernels share (ops/batch_norm_cuda_kernels.h):
// per-channel (C) tensors as kernels read them, and the launchers of
// ops/cuda/batch_norm_v2.cu, which the entry points of ops/cuda/batch_norm.cu
// call, once their arguments are checked and laid out, when v2 is chosen.
#pragma once

#include <utility>

#include <loom/ops/batch_norm.h>
#include <loom/ops/batch_norm_math.h>
#include <loom/ops/cuda/common.cuh>

namespace loom::ops::cuda_detail {

// A per-channel (C) tensor's pointer and dtype, for kernels; null when undefined.
struct ChannelArray {
  const void* data = nullptr;
  DType dtype = DType::f32;
};
inline ChannelArray channel_array(const Tensor& t) {
  if (!t.defined()) return {};
  LOOM_CHECK(t.device().is_cuda() && t.dim() == 1 && t.strides()[0] == 1, "batch_norm: per-channel tensor ", t.str(),
             " must be a contiguous CUDA vector");
  return {t.raw_data(), t.dtype()};
}

// One value of a per-channel (C) tensor of any floating dtype; `fallback` when absent.
__device__ __forceinline__ double channel_value(const void* p, DType t, int64_t c, double fallback) {
  return p == nullptr ? fallback : load_as_double(p, t, c);
}

// The elements per channel kernels divide by (StatisticsCount): `known`, or
// the total at `total` in device memory, read by the kernel where it runs.
struct ElementCount {
  double known = 0;
  const double* total = nullptr;
  __device__ __forceinline__ double value() const { return total != nullptr ? *total : known; }
};
inline ElementCount element_count(const char* op, const StatisticsCount& count, Device device) {
  check_statistics_count(op, count, device);
  return {static_cast<double>(count.known), count.total.defined() ? count.total.data<double>() : nullptr};
}

}  // namespace loom::ops::cuda_detail

// v2's steps for inputs already in one memory format (x, dy, residual, output
// and the result alike; l their geometry), with the contracts of
// ops/batch_norm_kernels.def. f32, f16 and bf16 only: f64 keeps v1's kernels.
namespace loom::ops::cuda::batch_norm_v2 {

using batch_norm_math::ChannelGeometry;

// Whether v2 runs for an input of `dtype`: chosen, and not f64.
bool runs(DType dtype);

// (2, C) f64 (sum, sum of squares).
Tensor stats(const Tensor& x, const ChannelGeometry& l);
// Writes batch_norm_apply's result into y.
void apply(const Tensor& x, const Tensor& residual, const Tensor& y, const ChannelGeometry& l, const Tensor& mean,
           const Tensor& var, const Tensor& weight, const Tensor& bias, double eps, Activation activation);
// (2, C) f64 (sum dy, sum dy * xhat), dy masked by `relu`.
Tensor backward_reduce(const Tensor& dy, const Tensor& x, const ChannelGeometry& l, const Tensor& mean,
                       const Tensor& var, double eps, const FusedRelu& relu);
// batch_norm_backward_reduce_relu_output in one pass: {sums, masked gradient}.
std::pair<Tensor, Tensor> backward_reduce_relu_output(const Tensor& dy, const Tensor& output, const Tensor& x,
                                                      const ChannelGeometry& l, const Tensor& mean, const Tensor& var,
                                                      double eps);
// Writes batch_norm_backward_apply's result into dx; x undefined when not read
// (eval without a fused ReLU), grad_sums (f64) undefined in eval.
void backward_apply(const Tensor& dy, const Tensor& x, const Tensor& dx, const ChannelGeometry& l, const Tensor& mean,
                    const Tensor& var, const Tensor& weight, const Tensor& grad_sums, cuda_detail::ElementCount count,
                    double eps, const FusedRelu& relu);

}  // namespace loom::ops::cuda::batch_norm_v2
