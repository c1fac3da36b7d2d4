// CUDA kernels of batch norm's steps (ops/batch_norm.h), for inputs viewed as
// (N, C, S) -- contiguous (N, C, ...) -- or as (M, C) -- channels-last
// (N, C, H, W), M = N*H*W. Per-channel sums accumulate in f64 in a fixed order
// (per-block partials, then one pass per channel), so results are
// deterministic. The elementwise passes use per-channel coefficients computed
// once in f64 and applied in the accumulation type (f32, or f64 for f64), as
// the CPU does; the per-channel math is the CPU's (ops/batch_norm_math.h). A
// fused ReLU (Activation::relu) is applied in the forward's pass and its mask
// recomputed from the input in the backward passes, as on the CPU.
// LOOM_CUDA_BATCH_NORM=v2 sends the f32 / f16 / bf16 element passes of each
// entry point to ops/cuda/batch_norm_v2.cu once the arguments are checked.
#include <cmath>

#include <loom/ops/batch_norm.h>
#include <loom/ops/batch_norm_math.h>
#include <loom/ops/elementwise.h>
#include <loom/ops/cuda/batch_norm_internal.cuh>
#include <loom/ops/cuda/common.cuh>

namespace loom::ops::cuda {
using namespace cuda_detail;

namespace {
namespace math = batch_norm_math;
using math::ChannelGeometry;
using math::with_flag;

// The fused ReLU's per-channel (scale, shift) in the accumulation type, for
// kernels: dy counts only where x * scale + shift > 0. Null when there is no
// fused ReLU.
template <class A>
struct Mask {
  const A* scale = nullptr;
  const A* shift = nullptr;
};

// ---- per-channel sums ----

// The two sums of one element: (x, x^2) for the statistics, or
// (g, g * (x - mean_c)) for backward, g = dy masked by the fused ReLU when
// Masked (scale_c, shift_c its coefficients).
template <class T, bool Backward, bool Masked>
__device__ __forceinline__ void add_pair(const T* x, const T* dy, int64_t offset, double mean_c, acc_t<T> scale_c,
                                         acc_t<T> shift_c, double& a, double& b) {
  const acc_t<T> xa = to_acc(x[offset]);
  const double v = static_cast<double>(xa);
  if constexpr (Backward) {
    acc_t<T> ga = to_acc(dy[offset]);
    if constexpr (Masked) ga = math::relu_masked(ga, xa, scale_c, shift_c);
    const double g = static_cast<double>(ga);
    a += g;
    b += g * (v - mean_c);
  } else {
    a += v;
    b += v * v;
  }
}

// Channel c's mask coefficients (zeros when unmasked: add_pair ignores them).
template <class A, bool Masked>
__device__ __forceinline__ void mask_of(const Mask<A>& mask, int64_t c, A& scale, A& shift) {
  if constexpr (Masked) {
    scale = mask.scale[c];
    shift = mask.shift[c];
  } else {
    scale = A(0);
    shift = A(0);
  }
}

// (N, C, S) layout: block (c, split) sums channel c's elements j = split*256 + t,
// stepping by 256 * splits; partials[split][c].
template <class T, bool Backward, bool Masked>
static __global__ void channel_sums_nchw_kernel(const T* x, const T* dy, ChannelArray mean, Mask<acc_t<T>> mask,
                                                ChannelGeometry l, double* partial_a, double* partial_b) {
  __shared__ double scratch[32];
  const int64_t c = blockIdx.x;
  const double mean_c = Backward ? load_as_double(mean.data, mean.dtype, c) : 0.0;
  acc_t<T> scale_c, shift_c;
  mask_of<acc_t<T>, Masked>(mask, c, scale_c, shift_c);
  double a = 0, b = 0;
  const int64_t count = l.per_channel();
  for (int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; j < count;
       j += static_cast<int64_t>(gridDim.y) * blockDim.x) {
    const int64_t n = j / l.inner, s = j - n * l.inner;
    add_pair<T, Backward, Masked>(x, dy, (n * l.channels + c) * l.inner + s, mean_c, scale_c, shift_c, a, b);
  }
  a = block_sum(a, scratch);
  b = block_sum(b, scratch);
  if (threadIdx.x == 0) {
    partial_a[blockIdx.y * l.channels + c] = a;
    partial_b[blockIdx.y * l.channels + c] = b;
  }
}

// (M, C) layout: block (channel group, split) of 32 channels x 8 rows; each
// thread sums rows m = split*8 + y stepping 8 * splits; the 8 row sums of a
// channel are then added in order.
constexpr int kNhwcChannels = 32, kNhwcRows = 8;
template <class T, bool Backward, bool Masked>
static __global__ void channel_sums_nhwc_kernel(const T* x, const T* dy, ChannelArray mean, Mask<acc_t<T>> mask,
                                                ChannelGeometry l, double* partial_a, double* partial_b) {
  __shared__ double rows_a[kNhwcRows][kNhwcChannels];
  __shared__ double rows_b[kNhwcRows][kNhwcChannels];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kNhwcChannels + threadIdx.x;
  double a = 0, b = 0;
  if (c < l.channels) {
    const double mean_c = Backward ? load_as_double(mean.data, mean.dtype, c) : 0.0;
    acc_t<T> scale_c, shift_c;
    mask_of<acc_t<T>, Masked>(mask, c, scale_c, shift_c);
    const int64_t rows = l.per_channel();
    for (int64_t m = static_cast<int64_t>(blockIdx.y) * kNhwcRows + threadIdx.y; m < rows;
         m += static_cast<int64_t>(gridDim.y) * kNhwcRows) {
      add_pair<T, Backward, Masked>(x, dy, m * l.channels + c, mean_c, scale_c, shift_c, a, b);
    }
  }
  rows_a[threadIdx.y][threadIdx.x] = a;
  rows_b[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && c < l.channels) {
    double sum_a = 0, sum_b = 0;
    for (int r = 0; r < kNhwcRows; ++r) {
      sum_a += rows_a[r][threadIdx.x];
      sum_b += rows_b[r][threadIdx.x];
    }
    partial_a[blockIdx.y * l.channels + c] = sum_a;
    partial_b[blockIdx.y * l.channels + c] = sum_b;
  }
}

// out (2, C) f64 = the partials summed over splits; the second row is scaled
// by 1 / sqrt(var_c + eps) when `var` is given (backward's sum dy * xhat).
static __global__ void finish_sums_kernel(const double* partial_a, const double* partial_b, int64_t channels,
                                          int splits, ChannelArray var, double eps, double* out) {
  for (int64_t c = first_index(); c < channels; c += grid_stride()) {
    double a = 0, b = 0;
    for (int s = 0; s < splits; ++s) {
      a += partial_a[s * channels + c];
      b += partial_b[s * channels + c];
    }
    if (var.data != nullptr) b *= math::inverse_std(load_as_double(var.data, var.dtype, c), eps);
    out[c] = a;
    out[channels + c] = b;
  }
}

// The per-channel sums of `x` (and `dy` for backward, masked when `mask`
// holds coefficients) as an f64 (2, C) tensor.
template <bool Backward>
Tensor channel_sums(const Tensor& x, const Tensor& dy, const ChannelGeometry& l, ChannelArray mean, ChannelArray var,
                    double eps, const Tensor& mask_coefficients = Tensor()) {
  Tensor out = Tensor::empty({2, l.channels}, DType::f64, x.device());
  if (l.channels == 0) return out;
  const cudaStream_t stream = stream_of(x);
  // Enough blocks to fill the device, each with at least ~2K elements.
  const int64_t per_channel = l.per_channel();
  const int64_t channel_blocks = l.channels_last ? (l.channels + kNhwcChannels - 1) / kNhwcChannels : l.channels;
  const int splits = static_cast<int>(
      std::clamp<int64_t>(std::min<int64_t>((per_channel + 2047) / 2048, (1024 + channel_blocks - 1) / channel_blocks), 1,
                          65535));
  ::loom::cuda::DeviceBuffer partials(2 * static_cast<size_t>(splits) * l.channels * sizeof(double), x.device().index);
  double* partial_a = static_cast<double*>(partials.data());
  double* partial_b = partial_a + static_cast<int64_t>(splits) * l.channels;
  visit_float(x.dtype(), "batch_norm", [&]<class T>() {
    using A = acc_t<T>;
    const T* dy_data = Backward ? dy.data<T>() : nullptr;
    Mask<A> mask;
    if (mask_coefficients.defined()) mask = {mask_coefficients.data<A>(), mask_coefficients.data<A>() + l.channels};
    with_flag(mask_coefficients.defined(), [&]<bool Masked>() {
      if (l.channels_last) {
        const dim3 grid(static_cast<unsigned>(channel_blocks), static_cast<unsigned>(splits));
        channel_sums_nhwc_kernel<T, Backward, Masked><<<grid, dim3(kNhwcChannels, kNhwcRows), 0, stream>>>(
            x.data<T>(), dy_data, mean, mask, l, partial_a, partial_b);
      } else {
        const dim3 grid(static_cast<unsigned>(l.channels), static_cast<unsigned>(splits));
        channel_sums_nchw_kernel<T, Backward, Masked><<<grid, kThreads, 0, stream>>>(x.data<T>(), dy_data, mean, mask,
                                                                                     l, partial_a, partial_b);
      }
      LOOM_CHECK_LAUNCH();
    });
  });
  finish_sums_kernel<<<blocks_for(l.channels), kThreads, 0, stream>>>(partial_a, partial_b, l.channels, splits, var, eps,
                                                                      out.data<double>());
  LOOM_CHECK_LAUNCH();
  return out;
}

// ---- statistics ----

// mean_var (2, C) f64 from sums over `count` elements; running stats updated
// in place (unbiased variance), as PyTorch does.
static __global__ void gather_stats_kernel(const double* stats, int64_t channels, ElementCount elements,
                                           void* running_mean, void* running_var, DType running_dtype, double momentum,
                                           double* mean_var) {
  const double count = elements.value();
  for (int64_t c = first_index(); c < channels; c += grid_stride()) {
    const math::Statistics s = math::statistics(stats[c], stats[channels + c], count);
    mean_var[c] = s.mean;
    mean_var[channels + c] = s.var;
    if (running_mean != nullptr) {
      const double old_mean = load_as_double(running_mean, running_dtype, c);
      const double old_var = load_as_double(running_var, running_dtype, c);
      store_from_double(running_mean, running_dtype, c, math::running_mean_update(old_mean, s.mean, momentum));
      store_from_double(running_var, running_dtype, c, math::running_var_update(old_var, s.var, count, momentum));
    }
  }
}

// ---- elementwise passes ----

// The forward's (scale, shift) per channel (math::affine), in A.
template <class A>
static __global__ void apply_coefficients_kernel(ChannelArray mean, ChannelArray var, ChannelArray weight,
                                                 ChannelArray bias, int64_t channels, double eps, A* scale, A* shift) {
  for (int64_t c = first_index(); c < channels; c += grid_stride()) {
    const math::Affine affine =
        math::affine(channel_value(mean.data, mean.dtype, c, 0.0), channel_value(var.data, var.dtype, c, 1.0),
                     channel_value(weight.data, weight.dtype, c, 1.0), channel_value(bias.data, bias.dtype, c, 0.0), eps);
    scale[c] = static_cast<A>(affine.scale);
    shift[c] = static_cast<A>(affine.shift);
  }
}

// A (2, C) tensor of the forward's (scale, shift) in the accumulation type of `dtype`.
Tensor apply_coefficients(const Tensor& mean, const Tensor& var, const Tensor& weight, const Tensor& bias,
                          int64_t channels, double eps, DType dtype, Device device, cudaStream_t stream) {
  return visit_float(dtype, "batch_norm", [&]<class T>() {
    using A = acc_t<T>;
    Tensor coefficients = Tensor::empty({2, channels}, dtype_of<A>(), device);
    A* scale = coefficients.data<A>();
    apply_coefficients_kernel<A><<<blocks_for(channels), kThreads, 0, stream>>>(
        channel_array(mean), channel_array(var), channel_array(weight), channel_array(bias), channels, eps, scale,
        scale + channels);
    LOOM_CHECK_LAUNCH();
    return coefficients;
  });
}

// y = x * scale + shift (+ residual) (then ReLU), math::epilogue; residual is
// read only when Residual.
template <class T, bool Relu, bool Residual>
static __global__ void apply_kernel(const T* x, const T* residual, T* y, const acc_t<T>* scale, const acc_t<T>* shift,
                                    ChannelGeometry l) {
  using A = acc_t<T>;
  const int64_t n = l.numel();
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t c = l.channel_of(i);
    const A r = Residual ? to_acc(residual[i]) : A(0);
    y[i] = from_acc<T>(math::epilogue<Relu, Residual>(to_acc(x[i]), r, scale[c], shift[c]));
  }
}

// Training: dx = k (dy - mean_dy) - p (x - mean) (math::backward). Eval (no
// sums): dx = k dy. dy is masked by the fused ReLU when Masked.
struct BackwardCoefficients {
  double* k;
  double* mean_dy;
  double* mean;
  double* p;
};

static __global__ void backward_coefficients_kernel(ChannelArray mean, ChannelArray var, ChannelArray weight,
                                                    const double* sums, int64_t channels, ElementCount elements,
                                                    double eps, BackwardCoefficients out) {
  const double count = elements.value();
  for (int64_t c = first_index(); c < channels; c += grid_stride()) {
    const double var_c = channel_value(var.data, var.dtype, c, 1.0);
    const double weight_c = channel_value(weight.data, weight.dtype, c, 1.0);
    if (sums != nullptr) {
      const math::Backward b = math::backward(var_c, weight_c, eps, sums[c], sums[channels + c], count);
      out.k[c] = b.k;
      out.mean_dy[c] = b.mean_dy;
      out.mean[c] = channel_value(mean.data, mean.dtype, c, 0.0);
      out.p[c] = b.p;
    } else {
      out.k[c] = math::eval_backward_scale(var_c, weight_c, eps);
    }
  }
}

template <class T, bool Masked>
static __global__ void backward_apply_kernel(const T* dy, const T* x, T* dx, BackwardCoefficients coefficients,
                                             Mask<acc_t<T>> mask, bool training, ChannelGeometry l) {
  using A = acc_t<T>;
  const int64_t n = l.numel();
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t c = l.channel_of(i);
    const A k = static_cast<A>(coefficients.k[c]);
    A g = to_acc(dy[i]);
    if constexpr (Masked) g = math::relu_masked(g, to_acc(x[i]), mask.scale[c], mask.shift[c]);
    if (training) {
      const A mean_dy = static_cast<A>(coefficients.mean_dy[c]), mean = static_cast<A>(coefficients.mean[c]);
      const A p = static_cast<A>(coefficients.p[c]);
      dx[i] = from_acc<T>(k * (g - mean_dy) - p * (to_acc(x[i]) - mean));
    } else {
      dx[i] = from_acc<T>(g * k);
    }
  }
}

}  // namespace

Tensor batch_norm_stats(const Tensor& input_in) {
  const auto device_guard = on_device_of("batch_norm", input_in);
  const MemoryFormat format = memory_format_of(input_in);
  const Tensor x = in_memory_format(input_in, format);
  if (batch_norm_v2::runs(x.dtype())) return batch_norm_v2::stats(x, math::channel_geometry(x, format));
  return channel_sums<false>(x, Tensor(), math::channel_geometry(x, format), {}, {}, 0.0);
}

Tensor batch_norm_gather_stats(const Tensor& stats_in, const StatisticsCount& count, const Tensor& running_mean,
                               const Tensor& running_var, double momentum) {
  const auto device_guard = on_device_of("batch_norm", stats_in);
  const ElementCount elements = element_count("batch_norm", count, stats_in.device());
  const Tensor stats = contiguous_input(stats_in.dtype() == DType::f64 ? stats_in : stats_in.to(DType::f64));
  const int64_t channels = stats.size(1);
  Tensor mean_var = Tensor::empty({2, channels}, DType::f64, stats.device());
  if (channels == 0) return mean_var;
  void* rm = nullptr;
  void* rv = nullptr;
  if (running_mean.defined()) {
    LOOM_CHECK(running_mean.dtype() == running_var.dtype(), "batch_norm: running_mean is ",
               dtype_name(running_mean.dtype()), " but running_var is ", dtype_name(running_var.dtype()));
    rm = const_cast<void*>(channel_array(running_mean).data);
    rv = const_cast<void*>(channel_array(running_var).data);
  }
  gather_stats_kernel<<<blocks_for(channels), kThreads, 0, stream_of(stats)>>>(
      stats.data<double>(), channels, elements, rm, rv,
      running_mean.defined() ? running_mean.dtype() : DType::f32, momentum, mean_var.data<double>());
  LOOM_CHECK_LAUNCH();
  return mean_var;
}

Tensor batch_norm_apply(const Tensor& input_in, const Tensor& mean, const Tensor& var, const Tensor& weight,
                        const Tensor& bias, double eps, Activation activation, const Tensor& residual_in) {
  const auto device_guard = on_device_of("batch_norm", input_in);
  const MemoryFormat format = memory_format_of(input_in);
  const Tensor x = in_memory_format(input_in, format);
  LOOM_CHECK(!residual_in.defined() || (residual_in.sizes() == x.sizes() && residual_in.dtype() == x.dtype() &&
                                        residual_in.device() == x.device()),
             "batch_norm: the residual ", residual_in.defined() ? residual_in.str() : "", " must match the input ",
             x.str());
  // The residual in the input's memory order, so that one offset indexes both.
  const Tensor residual = residual_in.defined() ? in_memory_format(residual_in, format) : Tensor();
  const ChannelGeometry l = math::channel_geometry(x, format);
  Tensor y = empty_with_format(x.sizes(), x.dtype(), x.device(), format);
  if (l.numel() == 0) return y;
  if (batch_norm_v2::runs(x.dtype())) {
    batch_norm_v2::apply(x, residual, y, l, mean, var, weight, bias, eps, activation);
    return y;
  }
  const cudaStream_t stream = stream_of(x);
  const Tensor coefficients = apply_coefficients(mean, var, weight, bias, l.channels, eps, x.dtype(), x.device(), stream);
  visit_float(x.dtype(), "batch_norm", [&]<class T>() {
    using A = acc_t<T>;
    const A* scale = coefficients.data<A>();
    const T* r = residual.defined() ? residual.data<T>() : nullptr;
    with_flag(activation == Activation::relu, [&]<bool Relu>() {
      with_flag(r != nullptr, [&]<bool Residual>() {
        apply_kernel<T, Relu, Residual><<<blocks_for(l.numel()), kThreads, 0, stream>>>(x.data<T>(), r, y.data<T>(),
                                                                                        scale, scale + l.channels, l);
        LOOM_CHECK_LAUNCH();
      });
    });
  });
  return y;
}

Tensor batch_norm_backward_reduce(const Tensor& grad_output, const Tensor& input_in, const Tensor& mean,
                                  const Tensor& var, double eps, const FusedRelu& relu) {
  LOOM_CHECK(!relu.pooled, "batch_norm backward: a pooled gradient (batch_norm_relu_max_pool2d) has CPU kernels only");
  const auto device_guard = on_device_of("batch_norm backward", input_in);
  const MemoryFormat format = memory_format_of(input_in);
  const Tensor x = in_memory_format(input_in, format);
  const Tensor dy =
      in_memory_format(grad_output.dtype() == x.dtype() ? grad_output : grad_output.to(x.dtype()), format);
  const ChannelGeometry l = math::channel_geometry(x, format);
  if (batch_norm_v2::runs(x.dtype())) return batch_norm_v2::backward_reduce(dy, x, l, mean, var, eps, relu);
  const Tensor mask = relu.enabled ? apply_coefficients(mean, var, relu.weight, relu.bias, l.channels, eps, x.dtype(),
                                                        x.device(), stream_of(x))
                                   : Tensor();
  return channel_sums<true>(x, dy, l, channel_array(mean), channel_array(var), eps, mask);
}

// Two launches: the masked gradient is written by relu's backward and the
// sums read it back (the CPU twin fuses them; v2 does too).
std::pair<Tensor, Tensor> batch_norm_backward_reduce_relu_output(const Tensor& grad_output, const Tensor& output,
                                                                 const Tensor& input, const Tensor& mean,
                                                                 const Tensor& var, double eps) {
  if (batch_norm_v2::runs(input.dtype()) && grad_output.dtype() == input.dtype() && output.dtype() == input.dtype() &&
      grad_output.sizes() == input.sizes() && output.sizes() == input.sizes()) {
    const auto device_guard = on_device_of("batch_norm backward", input);
    const MemoryFormat format = memory_format_of(input);
    const Tensor x = in_memory_format(input, format);
    return batch_norm_v2::backward_reduce_relu_output(in_memory_format(grad_output, format),
                                                      in_memory_format(output, format), x,
                                                      math::channel_geometry(x, format), mean, var, eps);
  }
  Tensor g = unary_backward(Unary::relu, grad_output, output);
  Tensor sums = batch_norm_backward_reduce(g, input, mean, var, eps);
  return {sums, g};
}

Tensor batch_norm_backward_apply(const Tensor& grad_output, const Tensor& input_in, const Tensor& mean,
                                 const Tensor& var, const Tensor& weight, const Tensor& grad_sums,
                                 const StatisticsCount& count, double eps, const FusedRelu& relu) {
  LOOM_CHECK(!relu.pooled, "batch_norm backward: a pooled gradient (batch_norm_relu_max_pool2d) has CPU kernels only");
  const auto device_guard = on_device_of("batch_norm backward", grad_output);
  const bool training = grad_sums.defined();
  const ElementCount elements =
      training ? element_count("batch_norm backward", count, grad_output.device()) : ElementCount{};
  // dx follows the input's memory order; in eval mode without a fused ReLU the input is not read.
  const bool reads_input = training || relu.enabled;
  const MemoryFormat format = memory_format_of(reads_input ? input_in : grad_output);
  const Tensor dy = in_memory_format(grad_output, format);
  const Tensor x =
      reads_input ? in_memory_format(input_in.dtype() == dy.dtype() ? input_in : input_in.to(dy.dtype()), format)
                  : Tensor();
  const ChannelGeometry l = math::channel_geometry(dy, format);
  Tensor dx = empty_with_format(dy.sizes(), dy.dtype(), dy.device(), format);
  if (l.numel() == 0) return dx;
  const cudaStream_t stream = stream_of(dy);
  Tensor sums = training ? contiguous_input(grad_sums.dtype() == DType::f64 ? grad_sums : grad_sums.to(DType::f64))
                         : Tensor();
  if (batch_norm_v2::runs(dy.dtype())) {
    batch_norm_v2::backward_apply(dy, x, dx, l, mean, var, weight, sums, elements, eps, relu);
    return dx;
  }
  Tensor buffer = Tensor::empty({4, l.channels}, DType::f64, dy.device());
  double* base = buffer.data<double>();
  const BackwardCoefficients coefficients{base, base + l.channels, base + 2 * l.channels, base + 3 * l.channels};
  backward_coefficients_kernel<<<blocks_for(l.channels), kThreads, 0, stream>>>(
      channel_array(mean), channel_array(var), channel_array(weight), training ? sums.data<double>() : nullptr,
      l.channels, elements, eps, coefficients);
  LOOM_CHECK_LAUNCH();
  const Tensor mask_coefficients =
      relu.enabled ? apply_coefficients(mean, var, relu.weight, relu.bias, l.channels, eps, dy.dtype(), dy.device(), stream)
                   : Tensor();
  visit_float(dy.dtype(), "batch_norm backward", [&]<class T>() {
    using A = acc_t<T>;
    Mask<A> mask;
    if (relu.enabled) mask = {mask_coefficients.data<A>(), mask_coefficients.data<A>() + l.channels};
    with_flag(relu.enabled, [&]<bool Masked>() {
      backward_apply_kernel<T, Masked><<<blocks_for(l.numel()), kThreads, 0, stream>>>(
          dy.data<T>(), reads_input ? x.data<T>() : nullptr, dx.data<T>(), coefficients, mask, training, l);
      LOOM_CHECK_LAUNCH();
    });
  });
  return dx;
}

}  // namespace loom::ops::cuda
