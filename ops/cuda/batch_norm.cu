// CUDA kernels of batch norm's steps (ops/batch_norm.h), for inputs viewed as
// (N, C, S) -- contiguous (N, C, ...) -- or as (M, C) -- channels-last
// (N, C, H, W), M = N*H*W. Per-channel sums accumulate in f64 in a fixed order
// (per-block partials, then one pass per channel), so results are
// deterministic. The elementwise passes use per-channel coefficients computed
// once in f64 and applied in the accumulation type (f32, or f64 for f64), as
// the CPU does.
#include <cmath>

#include <loom/ops/batch_norm.h>
#include <loom/ops/cuda/common.cuh>

namespace loom::ops::cuda {
using namespace cuda_detail;

namespace {

// How the input's elements map to channels.
struct ChannelLayout {
  int64_t batch = 0, channels = 0, inner = 0;  // (N, C, S); for channels-last S = H*W
  bool channels_last = false;                  // memory (N, S, C) rather than (N, C, S)
  __host__ __device__ int64_t per_channel() const { return batch * inner; }
  __host__ __device__ int64_t numel() const { return batch * channels * inner; }
};

ChannelLayout channel_layout(const Tensor& x, Layout layout) {
  ChannelLayout l;
  l.batch = x.size(0);
  l.channels = x.size(1);
  l.inner = l.batch * l.channels == 0 ? 0 : x.numel() / (l.batch * l.channels);
  l.channels_last = layout == Layout::nhwc;
  return l;
}

// The input as the kernels read it: channels-last 4-d tensors stay so, anything
// else becomes contiguous.
Layout layout_for(const Tensor& x) { return x.dim() == 4 ? layout_of(x) : Layout::nchw; }

__device__ __forceinline__ int64_t channel_of(int64_t i, const ChannelLayout& l) {
  return l.channels_last ? i % l.channels : (i / l.inner) % l.channels;
}

// One value of a per-channel (C) tensor of any floating dtype; `fallback` when absent.
__device__ __forceinline__ double channel_value(const void* p, DType t, int64_t c, double fallback) {
  return p == nullptr ? fallback : load_as_double(p, t, c);
}

// A per-channel (C) tensor's pointer and dtype, for kernels; null when undefined.
struct ChannelArray {
  const void* data = nullptr;
  DType dtype = DType::f32;
};
ChannelArray channel_array(const Tensor& t) {
  if (!t.defined()) return {};
  LOOM_CHECK(t.device().is_cuda() && t.dim() == 1 && t.strides()[0] == 1, "batch_norm: per-channel tensor ", t.str(),
             " must be a contiguous CUDA vector");
  return {t.raw_data(), t.dtype()};
}

// ---- per-channel sums ----

// The two sums of one element: (x, x^2) for the statistics, or
// (dy, dy * (x - mean_c)) for backward.
template <class T, bool Backward>
__device__ __forceinline__ void add_pair(const T* x, const T* dy, int64_t offset, double mean_c, double& a, double& b) {
  const double v = static_cast<double>(to_acc(x[offset]));
  if constexpr (Backward) {
    const double g = static_cast<double>(to_acc(dy[offset]));
    a += g;
    b += g * (v - mean_c);
  } else {
    a += v;
    b += v * v;
  }
}

// (N, C, S) layout: block (c, split) sums channel c's elements j = split*256 + t,
// stepping by 256 * splits; partials[split][c].
template <class T, bool Backward>
static __global__ void channel_sums_nchw_kernel(const T* x, const T* dy, ChannelArray mean, ChannelLayout l,
                                                double* partial_a, double* partial_b) {
  __shared__ double scratch[32];
  const int64_t c = blockIdx.x;
  const double mean_c = Backward ? load_as_double(mean.data, mean.dtype, c) : 0.0;
  double a = 0, b = 0;
  const int64_t count = l.per_channel();
  for (int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; j < count;
       j += static_cast<int64_t>(gridDim.y) * blockDim.x) {
    const int64_t n = j / l.inner, s = j - n * l.inner;
    add_pair<T, Backward>(x, dy, (n * l.channels + c) * l.inner + s, mean_c, a, b);
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
template <class T, bool Backward>
static __global__ void channel_sums_nhwc_kernel(const T* x, const T* dy, ChannelArray mean, ChannelLayout l,
                                                double* partial_a, double* partial_b) {
  __shared__ double rows_a[kNhwcRows][kNhwcChannels];
  __shared__ double rows_b[kNhwcRows][kNhwcChannels];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kNhwcChannels + threadIdx.x;
  double a = 0, b = 0;
  if (c < l.channels) {
    const double mean_c = Backward ? load_as_double(mean.data, mean.dtype, c) : 0.0;
    const int64_t rows = l.per_channel();
    for (int64_t m = static_cast<int64_t>(blockIdx.y) * kNhwcRows + threadIdx.y; m < rows;
         m += static_cast<int64_t>(gridDim.y) * kNhwcRows) {
      add_pair<T, Backward>(x, dy, m * l.channels + c, mean_c, a, b);
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
    if (var.data != nullptr) b /= sqrt(load_as_double(var.data, var.dtype, c) + eps);
    out[c] = a;
    out[channels + c] = b;
  }
}

// The per-channel sums of `x` (and `dy` for backward) as an f64 (2, C) tensor.
template <bool Backward>
Tensor channel_sums(const Tensor& x, const Tensor& dy, const ChannelLayout& l, ChannelArray mean, ChannelArray var,
                    double eps) {
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
    const T* dy_data = Backward ? dy.data<T>() : nullptr;
    if (l.channels_last) {
      const dim3 grid(static_cast<unsigned>(channel_blocks), static_cast<unsigned>(splits));
      channel_sums_nhwc_kernel<T, Backward><<<grid, dim3(kNhwcChannels, kNhwcRows), 0, stream>>>(
          x.data<T>(), dy_data, mean, l, partial_a, partial_b);
    } else {
      const dim3 grid(static_cast<unsigned>(l.channels), static_cast<unsigned>(splits));
      channel_sums_nchw_kernel<T, Backward><<<grid, kThreads, 0, stream>>>(x.data<T>(), dy_data, mean, l, partial_a,
                                                                           partial_b);
    }
    LOOM_CHECK_LAUNCH();
  });
  finish_sums_kernel<<<blocks_for(l.channels), kThreads, 0, stream>>>(partial_a, partial_b, l.channels, splits, var, eps,
                                                                      out.data<double>());
  LOOM_CHECK_LAUNCH();
  return out;
}

// ---- statistics ----

// mean_var (2, C) f64 from sums over `count` elements; running stats updated
// in place (unbiased variance), as PyTorch does.
static __global__ void gather_stats_kernel(const double* stats, int64_t channels, double count, void* running_mean,
                                           void* running_var, DType running_dtype, double momentum, double* mean_var) {
  for (int64_t c = first_index(); c < channels; c += grid_stride()) {
    const double mean = stats[c] / count;
    // E[x^2] - mean^2 in f64; clamped because rounding can make it slightly negative.
    const double var = fmax(0.0, stats[channels + c] / count - mean * mean);
    mean_var[c] = mean;
    mean_var[channels + c] = var;
    if (running_mean != nullptr) {
      const double unbiased = count > 1 ? count / (count - 1) : 1.0;
      const double old_mean = load_as_double(running_mean, running_dtype, c);
      const double old_var = load_as_double(running_var, running_dtype, c);
      store_from_double(running_mean, running_dtype, c, (1 - momentum) * old_mean + momentum * mean);
      store_from_double(running_var, running_dtype, c, (1 - momentum) * old_var + momentum * var * unbiased);
    }
  }
}

// ---- elementwise passes ----

// scale_c = weight_c / sqrt(var_c + eps), shift_c = bias_c - mean_c * scale_c.
template <class A>
static __global__ void apply_coefficients_kernel(ChannelArray mean, ChannelArray var, ChannelArray weight,
                                                 ChannelArray bias, int64_t channels, double eps, A* scale, A* shift) {
  for (int64_t c = first_index(); c < channels; c += grid_stride()) {
    const double invstd = 1.0 / sqrt(channel_value(var.data, var.dtype, c, 1.0) + eps);
    const double s = channel_value(weight.data, weight.dtype, c, 1.0) * invstd;
    scale[c] = static_cast<A>(s);
    shift[c] = static_cast<A>(channel_value(bias.data, bias.dtype, c, 0.0) - channel_value(mean.data, mean.dtype, c, 0.0) * s);
  }
}

template <class T>
static __global__ void apply_kernel(const T* x, T* y, const acc_t<T>* scale, const acc_t<T>* shift, ChannelLayout l) {
  const int64_t n = l.numel();
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t c = channel_of(i, l);
    y[i] = from_acc<T>(to_acc(x[i]) * scale[c] + shift[c]);
  }
}

// Training: dx = k (dy - mean_dy) - p (x - mean), k = weight * invstd,
// p = k * invstd * mean(dy * xhat). Eval (no sums): dx = k dy.
struct BackwardCoefficients {
  double* k;
  double* mean_dy;
  double* mean;
  double* p;
};

static __global__ void backward_coefficients_kernel(ChannelArray mean, ChannelArray var, ChannelArray weight,
                                                    const double* sums, int64_t channels, double count, double eps,
                                                    BackwardCoefficients out) {
  for (int64_t c = first_index(); c < channels; c += grid_stride()) {
    const double invstd = 1.0 / sqrt(channel_value(var.data, var.dtype, c, 1.0) + eps);
    const double k = channel_value(weight.data, weight.dtype, c, 1.0) * invstd;
    out.k[c] = k;
    if (sums != nullptr) {
      out.mean_dy[c] = sums[c] / count;
      out.mean[c] = channel_value(mean.data, mean.dtype, c, 0.0);
      out.p[c] = k * invstd * sums[channels + c] / count;
    }
  }
}

template <class T>
static __global__ void backward_apply_kernel(const T* dy, const T* x, T* dx, BackwardCoefficients coefficients,
                                             bool training, ChannelLayout l) {
  using A = acc_t<T>;
  const int64_t n = l.numel();
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t c = channel_of(i, l);
    const A k = static_cast<A>(coefficients.k[c]);
    if (training) {
      const A mean_dy = static_cast<A>(coefficients.mean_dy[c]), mean = static_cast<A>(coefficients.mean[c]);
      const A p = static_cast<A>(coefficients.p[c]);
      dx[i] = from_acc<T>(k * (to_acc(dy[i]) - mean_dy) - p * (to_acc(x[i]) - mean));
    } else {
      dx[i] = from_acc<T>(to_acc(dy[i]) * k);
    }
  }
}

}  // namespace

Tensor batch_norm_stats(const Tensor& input_in) {
  const auto device_guard = on_device_of("batch_norm", input_in);
  const Layout layout = layout_for(input_in);
  const Tensor x = in_layout(input_in, layout);
  return channel_sums<false>(x, Tensor(), channel_layout(x, layout), {}, {}, 0.0);
}

Tensor batch_norm_gather_stats(const Tensor& stats_in, int64_t count, const Tensor& running_mean,
                               const Tensor& running_var, double momentum) {
  const auto device_guard = on_device_of("batch_norm", stats_in);
  LOOM_CHECK(count > 0, "batch_norm: statistics over ", count, " elements per channel");
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
      stats.data<double>(), channels, static_cast<double>(count), rm, rv,
      running_mean.defined() ? running_mean.dtype() : DType::f32, momentum, mean_var.data<double>());
  LOOM_CHECK_LAUNCH();
  return mean_var;
}

Tensor batch_norm_apply(const Tensor& input_in, const Tensor& mean, const Tensor& var, const Tensor& weight,
                        const Tensor& bias, double eps) {
  const auto device_guard = on_device_of("batch_norm", input_in);
  const Layout layout = layout_for(input_in);
  const Tensor x = in_layout(input_in, layout);
  const ChannelLayout l = channel_layout(x, layout);
  Tensor y = layout == Layout::nhwc ? empty_4d(x.sizes(), x.dtype(), x.device(), layout)
                                    : Tensor::empty(x.sizes(), x.dtype(), x.device());
  if (l.numel() == 0) return y;
  const cudaStream_t stream = stream_of(x);
  visit_float(x.dtype(), "batch_norm", [&]<class T>() {
    using A = acc_t<T>;
    Tensor coefficients = Tensor::empty({2, l.channels}, dtype_of<A>(), x.device());
    A* scale = coefficients.data<A>();
    apply_coefficients_kernel<A><<<blocks_for(l.channels), kThreads, 0, stream>>>(
        channel_array(mean), channel_array(var), channel_array(weight), channel_array(bias), l.channels, eps, scale,
        scale + l.channels);
    LOOM_CHECK_LAUNCH();
    apply_kernel<T><<<blocks_for(l.numel()), kThreads, 0, stream>>>(x.data<T>(), y.data<T>(), scale,
                                                                     scale + l.channels, l);
    LOOM_CHECK_LAUNCH();
  });
  return y;
}

Tensor batch_norm_backward_reduce(const Tensor& grad_output, const Tensor& input_in, const Tensor& mean,
                                  const Tensor& var, double eps) {
  const auto device_guard = on_device_of("batch_norm backward", input_in);
  const Layout layout = layout_for(input_in);
  const Tensor x = in_layout(input_in, layout);
  const Tensor dy = in_layout(grad_output.dtype() == x.dtype() ? grad_output : grad_output.to(x.dtype()), layout);
  return channel_sums<true>(x, dy, channel_layout(x, layout), channel_array(mean), channel_array(var), eps);
}

Tensor batch_norm_backward_apply(const Tensor& grad_output, const Tensor& input_in, const Tensor& mean,
                                 const Tensor& var, const Tensor& weight, const Tensor& grad_sums, int64_t count,
                                 double eps) {
  const auto device_guard = on_device_of("batch_norm backward", grad_output);
  const bool training = grad_sums.defined();
  LOOM_CHECK(!training || count > 0, "batch_norm backward: sums over ", count, " elements per channel");
  // dx follows the input's memory order; in eval mode the input is not read.
  const Layout layout = layout_for(training ? input_in : grad_output);
  const Tensor dy = in_layout(grad_output, layout);
  const Tensor x = training ? in_layout(input_in.dtype() == dy.dtype() ? input_in : input_in.to(dy.dtype()), layout)
                            : Tensor();
  const ChannelLayout l = channel_layout(dy, layout);
  Tensor dx = layout == Layout::nhwc ? empty_4d(dy.sizes(), dy.dtype(), dy.device(), layout)
                                     : Tensor::empty(dy.sizes(), dy.dtype(), dy.device());
  if (l.numel() == 0) return dx;
  const cudaStream_t stream = stream_of(dy);
  Tensor sums = training ? contiguous_input(grad_sums.dtype() == DType::f64 ? grad_sums : grad_sums.to(DType::f64))
                         : Tensor();
  Tensor buffer = Tensor::empty({4, l.channels}, DType::f64, dy.device());
  double* base = buffer.data<double>();
  const BackwardCoefficients coefficients{base, base + l.channels, base + 2 * l.channels, base + 3 * l.channels};
  backward_coefficients_kernel<<<blocks_for(l.channels), kThreads, 0, stream>>>(
      channel_array(mean), channel_array(var), channel_array(weight), training ? sums.data<double>() : nullptr,
      l.channels, static_cast<double>(count), eps, coefficients);
  LOOM_CHECK_LAUNCH();
  visit_float(dy.dtype(), "batch_norm backward", [&]<class T>() {
    backward_apply_kernel<T><<<blocks_for(l.numel()), kThreads, 0, stream>>>(
        dy.data<T>(), training ? x.data<T>() : nullptr, dx.data<T>(), coefficients, training, l);
    LOOM_CHECK_LAUNCH();
  });
  return dx;
}

}  // namespace loom::ops::cuda
