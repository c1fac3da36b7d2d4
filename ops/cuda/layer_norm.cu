// CUDA kernels of layer_norm (ops/layer_norm.h), the CPU kernel's steps on the
// device: one block per row for the statistics, the output and the input
// gradient (block sums in f64, fixed order); one thread per column for the
// weight and bias gradients, summing the rows in order. Deterministic.
#include <loom/ops/cuda/common.cuh>
#include <loom/ops/layer_norm.h>

namespace loom::ops::cuda {
using namespace cuda_detail;

namespace {

// A = acc_t<T>: the statistics' type (float for f32 / f16 / bf16, double for f64).
template <class T>
static __global__ void layer_norm_forward_kernel(const T* x, const T* weight, const T* bias, T* y, acc_t<T>* mean_out,
                                                 acc_t<T>* rstd_out, int64_t rows, int64_t features, double eps) {
  using A = acc_t<T>;
  __shared__ double scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = x + r * features;
    double total = 0;
    for (int64_t j = threadIdx.x; j < features; j += blockDim.x) total += static_cast<double>(to_acc(row[j]));
    const double mean = block_sum(total, scratch) / static_cast<double>(features);
    double squares = 0;
    for (int64_t j = threadIdx.x; j < features; j += blockDim.x) {
      const double d = static_cast<double>(to_acc(row[j])) - mean;
      squares += d * d;
    }
    const double rstd = 1.0 / sqrt(block_sum(squares, scratch) / static_cast<double>(features) + eps);
    if (threadIdx.x == 0) {
      mean_out[r] = static_cast<A>(mean);
      rstd_out[r] = static_cast<A>(rstd);
    }
    const A m = static_cast<A>(mean), s = static_cast<A>(rstd);
    for (int64_t j = threadIdx.x; j < features; j += blockDim.x) {
      A v = (to_acc(row[j]) - m) * s;
      if (weight != nullptr) v *= to_acc(weight[j]);
      if (bias != nullptr) v += to_acc(bias[j]);
      y[r * features + j] = from_acc<T>(v);
    }
  }
}

template <class T>
static __global__ void layer_norm_backward_input_kernel(const T* dy, const T* x, const T* weight,
                                                        const acc_t<T>* mean, const acc_t<T>* rstd, T* dx,
                                                        int64_t rows, int64_t features) {
  using A = acc_t<T>;
  __shared__ double scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = r * features;
    double sum_dxhat = 0, sum_dxhat_xhat = 0;
    for (int64_t j = threadIdx.x; j < features; j += blockDim.x) {
      const A dxhat = weight != nullptr ? to_acc(dy[base + j]) * to_acc(weight[j]) : to_acc(dy[base + j]);
      sum_dxhat += static_cast<double>(dxhat);
      sum_dxhat_xhat += static_cast<double>(dxhat * ((to_acc(x[base + j]) - mean[r]) * rstd[r]));
    }
    const A a = static_cast<A>(block_sum(sum_dxhat, scratch) / static_cast<double>(features));
    const A b = static_cast<A>(block_sum(sum_dxhat_xhat, scratch) / static_cast<double>(features));
    for (int64_t j = threadIdx.x; j < features; j += blockDim.x) {
      const A dxhat = weight != nullptr ? to_acc(dy[base + j]) * to_acc(weight[j]) : to_acc(dy[base + j]);
      const A xhat = (to_acc(x[base + j]) - mean[r]) * rstd[r];
      dx[base + j] = from_acc<T>(rstd[r] * (dxhat - a - xhat * b));
    }
  }
}

// d weight[j] = sum_r dy[r, j] * xhat[r, j], d bias[j] = sum_r dy[r, j]; either may be null.
template <class T>
static __global__ void layer_norm_backward_parameters_kernel(const T* dy, const T* x, const acc_t<T>* mean,
                                                             const acc_t<T>* rstd, T* dweight, T* dbias,
                                                             int64_t rows, int64_t features) {
  for (int64_t j = first_index(); j < features; j += grid_stride()) {
    double sum_dy_xhat = 0, sum_dy = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const double g = static_cast<double>(to_acc(dy[r * features + j]));
      sum_dy_xhat += g * static_cast<double>((to_acc(x[r * features + j]) - mean[r]) * rstd[r]);
      sum_dy += g;
    }
    if (dweight != nullptr) dweight[j] = from_acc<T>(static_cast<acc_t<T>>(sum_dy_xhat));
    if (dbias != nullptr) dbias[j] = from_acc<T>(static_cast<acc_t<T>>(sum_dy));
  }
}

DType accumulation_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

unsigned row_blocks(int64_t rows) { return static_cast<unsigned>(std::clamp<int64_t>(rows, 1, 1 << 16)); }

template <class T>
const T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

}  // namespace

Tensor layer_norm_forward(const Tensor& input_in, const Tensor& weight_in, const Tensor& bias_in, double eps,
                          LayerNormStatistics& statistics) {
  const auto device_guard = on_device_of("layer_norm", input_in);
  const Tensor input = contiguous_input(input_in);
  const Tensor weight = weight_in.defined() ? contiguous_input(weight_in) : Tensor();
  const Tensor bias = bias_in.defined() ? contiguous_input(bias_in) : Tensor();
  const int64_t features = input.size(input.dim() - 1), rows = input.numel() / features;
  Tensor out = Tensor::empty(input.sizes(), input.dtype(), input.device());
  statistics.mean = Tensor::empty({rows}, accumulation_dtype(input.dtype()), input.device());
  statistics.rstd = Tensor::empty({rows}, accumulation_dtype(input.dtype()), input.device());
  if (rows == 0) return out;
  visit_float(input.dtype(), "layer_norm", [&]<class T>() {
    layer_norm_forward_kernel<T><<<row_blocks(rows), kThreads, 0, stream_of(input)>>>(
        input.data<T>(), data_or_null<T>(weight), data_or_null<T>(bias), out.data<T>(),
        statistics.mean.data<acc_t<T>>(), statistics.rstd.data<acc_t<T>>(), rows, features, eps);
    LOOM_CHECK_LAUNCH();
  });
  return out;
}

LayerNormGradients layer_norm_backward(const Tensor& grad_in, const Tensor& input_in, const Tensor& weight_in,
                                       const LayerNormStatistics& statistics, std::array<bool, 3> needs) {
  const auto device_guard = on_device_of("layer_norm backward", grad_in);
  const Tensor dy = contiguous_input(grad_in), input = contiguous_input(input_in);
  const Tensor weight = weight_in.defined() ? contiguous_input(weight_in) : Tensor();
  const int64_t features = input.size(input.dim() - 1), rows = input.numel() / features;
  LayerNormGradients grads;
  if (needs[0]) grads.input = Tensor::empty(input.sizes(), input.dtype(), input.device());
  if (needs[1]) grads.weight = Tensor::empty({features}, input.dtype(), input.device());
  if (needs[2]) grads.bias = Tensor::empty({features}, input.dtype(), input.device());
  visit_float(input.dtype(), "layer_norm backward", [&]<class T>() {
    const acc_t<T>* mean = statistics.mean.data<acc_t<T>>();
    const acc_t<T>* rstd = statistics.rstd.data<acc_t<T>>();
    if (needs[0] && rows > 0) {
      layer_norm_backward_input_kernel<T><<<row_blocks(rows), kThreads, 0, stream_of(dy)>>>(
          dy.data<T>(), input.data<T>(), data_or_null<T>(weight), mean, rstd, grads.input.data<T>(), rows, features);
      LOOM_CHECK_LAUNCH();
    }
    if (needs[1] || needs[2]) {
      layer_norm_backward_parameters_kernel<T><<<blocks_for(features), kThreads, 0, stream_of(dy)>>>(
          dy.data<T>(), input.data<T>(), mean, rstd, needs[1] ? grads.weight.data<T>() : nullptr,
          needs[2] ? grads.bias.data<T>() : nullptr, rows, features);
      LOOM_CHECK_LAUNCH();
    }
  });
  return grads;
}

}  // namespace loom::ops::cuda
