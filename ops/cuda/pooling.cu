// CUDA kernels of max_pool2d, avg_pool2d and adaptive_avg_pool2d (ops/pooling.h), for
// NCHW and channels-last (NHWC) tensors; outputs keep the input's memory
// order. One thread per output element forward. The average pools' backwards
// gather, one thread per input element (deterministic); max_pool2d's scatters
// each gradient to its argmax with atomicAdd, so where windows overlap the
// order of the additions, and the last bits of a sum, may vary.
#include <loom/ops/cuda/common.cuh>
#include <loom/ops/pooling.h>
#include <loom/ops/pooling_math.h>

namespace loom::ops::cuda {
using namespace cuda_detail;

namespace {

// Sizes of a pooling problem: input (N, C, H, W), output (N, C, Ho, Wo).
struct PoolShape {
  int64_t n, c, h, w, out_h, out_w;
};

// Max-pooling window geometry (kernel, stride, padding; height then width).
struct Window {
  int64_t kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w;
};

// The index along the innermost remaining dim, of `size`, of a flat index
// `i`; `i` becomes the index over the dims outside it.
__device__ __forceinline__ int64_t take_innermost(int64_t& i, int64_t size) {
  const int64_t index = i % size;
  i /= size;
  return index;
}

// Position (n, c, y, x) of element `i` of an (N, C, Y, X) tensor stored in
// memory order NCHW, or NHWC when ChannelsLast: dims peeled innermost first.
template <bool ChannelsLast>
__device__ __forceinline__ void position(int64_t i, int64_t c_size, int64_t y_size, int64_t x_size, int64_t& n,
                                         int64_t& c, int64_t& y, int64_t& x) {
  if constexpr (ChannelsLast) c = take_innermost(i, c_size);
  x = take_innermost(i, x_size);
  y = take_innermost(i, y_size);
  if constexpr (!ChannelsLast) c = take_innermost(i, c_size);
  n = i;
}

// Offset of (n, c, y, x) in an (N, C, Y, X) tensor of that memory order.
template <bool ChannelsLast>
__device__ __forceinline__ int64_t offset_of(int64_t n, int64_t c, int64_t y, int64_t x, int64_t c_size,
                                             int64_t y_size, int64_t x_size) {
  if constexpr (ChannelsLast) return ((n * y_size + y) * x_size + x) * c_size + c;
  return ((n * c_size + c) * y_size + y) * x_size + x;
}

// Max over the window; index h * W + w of the first maximum, or of the last NaN.
template <class T, bool ChannelsLast>
static __global__ void max_pool_forward_kernel(const T* x, T* y, int64_t* indices, PoolShape s, Window k) {
  const int64_t total = s.n * s.c * s.out_h * s.out_w;
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    int64_t n, c, oh, ow;
    position<ChannelsLast>(i, s.c, s.out_h, s.out_w, n, c, oh, ow);
    const int64_t top = oh * k.stride_h - k.pad_h, left = ow * k.stride_w - k.pad_w;
    const int64_t h0 = top > 0 ? top : 0, h1 = top + k.kernel_h < s.h ? top + k.kernel_h : s.h;
    const int64_t w0 = left > 0 ? left : 0, w1 = left + k.kernel_w < s.w ? left + k.kernel_w : s.w;
    acc_t<T> best = -INFINITY;
    int64_t best_index = h0 * s.w + w0;
    for (int64_t h = h0; h < h1; ++h) {
      for (int64_t w = w0; w < w1; ++w) {
        const acc_t<T> v = to_acc(x[offset_of<ChannelsLast>(n, c, h, w, s.c, s.h, s.w)]);
        if (v > best || isnan(v)) {
          best = v;
          best_index = h * s.w + w;
        }
      }
    }
    y[i] = from_acc<T>(best);
    indices[i] = best_index;
  }
}

// dx[indices[o]] += dy[o] for every output o. The window geometry is not
// passed to backward, so this scatters (atomics into a zeroed f32 / f64
// buffer); where windows do not overlap (stride >= kernel) every input gets at
// most one term and the result is deterministic.
template <class T, bool ChannelsLast>
static __global__ void max_pool_backward_kernel(const T* dy, const int64_t* indices, acc_t<T>* dx, PoolShape s) {
  const int64_t total = s.n * s.c * s.out_h * s.out_w;
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    int64_t n, c, oh, ow;
    position<ChannelsLast>(i, s.c, s.out_h, s.out_w, n, c, oh, ow);
    const int64_t index = indices[i];
    atomicAdd(dx + offset_of<ChannelsLast>(n, c, index / s.w, index % s.w, s.c, s.h, s.w), to_acc(dy[i]));
  }
}

// Adaptive windows: adaptive_pool_span (ops/pooling_math.h).
template <class T, bool ChannelsLast>
static __global__ void adaptive_avg_forward_kernel(const T* x, T* y, PoolShape s) {
  const int64_t total = s.n * s.c * s.out_h * s.out_w;
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    int64_t n, c, oh, ow;
    position<ChannelsLast>(i, s.c, s.out_h, s.out_w, n, c, oh, ow);
    const AvgPoolSpan rows = adaptive_pool_span(oh, s.h, s.out_h), cols = adaptive_pool_span(ow, s.w, s.out_w);
    acc_t<T> sum = 0;
    for (int64_t h = rows.begin; h < rows.end; ++h) {
      for (int64_t w = cols.begin; w < cols.end; ++w) {
        sum += to_acc(x[offset_of<ChannelsLast>(n, c, h, w, s.c, s.h, s.w)]);
      }
    }
    y[i] = from_acc<T>(sum / static_cast<acc_t<T>>(avg_pool_divisor(rows, cols, false)));
  }
}

// Output rows whose window holds input row h: [h * out / in, ceil((h + 1) * out / in)),
// the windows' bounds with inputs and outputs swapped.
template <class T, bool ChannelsLast>
static __global__ void adaptive_avg_backward_kernel(const T* dy, T* dx, PoolShape s) {
  const int64_t total = s.n * s.c * s.h * s.w;
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    int64_t n, c, h, w;
    position<ChannelsLast>(i, s.c, s.h, s.w, n, c, h, w);
    const AvgPoolSpan out_rows = adaptive_pool_span(h, s.out_h, s.h), out_cols = adaptive_pool_span(w, s.out_w, s.w);
    acc_t<T> sum = 0;
    for (int64_t oh = out_rows.begin; oh < out_rows.end; ++oh) {
      const AvgPoolSpan rows = adaptive_pool_span(oh, s.h, s.out_h);
      for (int64_t ow = out_cols.begin; ow < out_cols.end; ++ow) {
        const AvgPoolSpan cols = adaptive_pool_span(ow, s.w, s.out_w);
        sum += to_acc(dy[offset_of<ChannelsLast>(n, c, oh, ow, s.c, s.out_h, s.out_w)]) /
               static_cast<acc_t<T>>(avg_pool_divisor(rows, cols, false));
      }
    }
    dx[i] = from_acc<T>(sum);
  }
}

// avg_pool2d: the window's sum over the input, divided as ops/pooling_math.h says.
template <class T, bool ChannelsLast>
static __global__ void avg_pool_forward_kernel(const T* x, T* y, PoolShape s, Window k, bool count_include_pad) {
  const int64_t total = s.n * s.c * s.out_h * s.out_w;
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    int64_t n, c, oh, ow;
    position<ChannelsLast>(i, s.c, s.out_h, s.out_w, n, c, oh, ow);
    const AvgPoolSpan rows = avg_pool_span(oh, s.h, k.kernel_h, k.stride_h, k.pad_h);
    const AvgPoolSpan cols = avg_pool_span(ow, s.w, k.kernel_w, k.stride_w, k.pad_w);
    acc_t<T> sum = 0;
    for (int64_t h = rows.begin; h < rows.end; ++h) {
      for (int64_t w = cols.begin; w < cols.end; ++w) {
        sum += to_acc(x[offset_of<ChannelsLast>(n, c, h, w, s.c, s.h, s.w)]);
      }
    }
    y[i] = from_acc<T>(sum / static_cast<acc_t<T>>(avg_pool_divisor(rows, cols, count_include_pad)));
  }
}

// avg_pool2d backward, one thread per input element: the sum over the outputs
// whose window holds it of dy / divisor.
template <class T, bool ChannelsLast>
static __global__ void avg_pool_backward_kernel(const T* dy, T* dx, PoolShape s, Window k, bool count_include_pad) {
  const int64_t total = s.n * s.c * s.h * s.w;
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    int64_t n, c, h, w;
    position<ChannelsLast>(i, s.c, s.h, s.w, n, c, h, w);
    int64_t oh0, oh1, ow0, ow1;
    avg_pool_outputs_of(h, k.kernel_h, k.stride_h, k.pad_h, s.out_h, oh0, oh1);
    avg_pool_outputs_of(w, k.kernel_w, k.stride_w, k.pad_w, s.out_w, ow0, ow1);
    acc_t<T> sum = 0;
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      const AvgPoolSpan rows = avg_pool_span(oh, s.h, k.kernel_h, k.stride_h, k.pad_h);
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const AvgPoolSpan cols = avg_pool_span(ow, s.w, k.kernel_w, k.stride_w, k.pad_w);
        sum += to_acc(dy[offset_of<ChannelsLast>(n, c, oh, ow, s.c, s.out_h, s.out_w)]) /
               static_cast<acc_t<T>>(avg_pool_divisor(rows, cols, count_include_pad));
      }
    }
    dx[i] = from_acc<T>(sum);
  }
}

// Runs fn.template operator()<T, ChannelsLast>() for the tensor's dtype and format.
template <class Fn>
void visit_pooling(DType dtype, MemoryFormat format, const char* op, Fn&& fn) {
  visit_float(dtype, op, [&]<class T>() {
    if (format == MemoryFormat::nhwc) {
      fn.template operator()<T, true>();
    } else {
      fn.template operator()<T, false>();
    }
  });
}

// A pass with one thread per output element: `out`, a new tensor of `sizes`
// in `in`'s dtype and device stored in `format`, is written by
// launch.template operator()<T, ChannelsLast>(in, out, blocks, stream).
template <class Launch>
Tensor pooling_pass(const char* op, const Tensor& in, MemoryFormat format, const Shape& sizes, Launch&& launch) {
  Tensor out = empty_with_format(sizes, in.dtype(), in.device(), format);
  if (out.numel() == 0) return out;
  visit_pooling(in.dtype(), format, op, [&]<class T, bool ChannelsLast>() {
    launch.template operator()<T, ChannelsLast>(in.data<T>(), out.data<T>(), blocks_for(out.numel()), stream_of(in));
    LOOM_CHECK_LAUNCH();
  });
  return out;
}

int64_t pooled_size(int64_t input, int64_t kernel, int64_t stride, int64_t padding) {
  return (input + 2 * padding - kernel) / stride + 1;
}

}  // namespace

Tensor max_pool2d_forward(const Tensor& input_in, Size2 kernel, Size2 stride, Size2 padding, Tensor& indices) {
  const auto device_guard = on_device_of("max_pool2d", input_in);
  const MemoryFormat format = memory_format_of(input_in);
  const Tensor x = in_memory_format(input_in, format);
  const PoolShape s{x.size(0), x.size(1), x.size(2), x.size(3), pooled_size(x.size(2), kernel[0], stride[0], padding[0]),
                    pooled_size(x.size(3), kernel[1], stride[1], padding[1])};
  const Window window{kernel[0], kernel[1], stride[0], stride[1], padding[0], padding[1]};
  const Shape out_sizes{s.n, s.c, s.out_h, s.out_w};
  indices = empty_with_format(out_sizes, DType::i64, x.device(), format);
  int64_t* index = indices.data<int64_t>();
  return pooling_pass("max_pool2d", x, format, out_sizes,
                      [&]<class T, bool ChannelsLast>(const T* in, T* out, unsigned blocks, cudaStream_t stream) {
                        max_pool_forward_kernel<T, ChannelsLast><<<blocks, kThreads, 0, stream>>>(in, out, index, s,
                                                                                                   window);
                      });
}

Tensor max_pool2d_backward(const Tensor& grad_output, const Tensor& indices_in, const Shape& input_sizes) {
  const auto device_guard = on_device_of("max_pool2d backward", grad_output);
  const MemoryFormat format = memory_format_of(indices_in);
  const Tensor index = in_memory_format(indices_in, format);
  const Tensor dy = in_memory_format(grad_output, format);
  const PoolShape s{input_sizes[0], input_sizes[1], input_sizes[2], input_sizes[3], dy.size(2), dy.size(3)};
  const DType accumulate = dy.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor sums = empty_with_format(input_sizes, accumulate, dy.device(), format);
  sums.zero_();
  if (dy.numel() > 0) {
    visit_pooling(dy.dtype(), format, "max_pool2d backward", [&]<class T, bool ChannelsLast>() {
      max_pool_backward_kernel<T, ChannelsLast><<<blocks_for(dy.numel()), kThreads, 0, stream_of(dy)>>>(
          dy.data<T>(), index.data<int64_t>(), sums.data<acc_t<T>>(), s);
      LOOM_CHECK_LAUNCH();
    });
  }
  if (accumulate == dy.dtype()) return sums;
  Tensor dx = empty_with_format(input_sizes, dy.dtype(), dy.device(), format);
  dx.copy_(sums);
  return dx;
}

Tensor adaptive_avg_pool2d_forward(const Tensor& input_in, Size2 output_size) {
  const auto device_guard = on_device_of("adaptive_avg_pool2d", input_in);
  const MemoryFormat format = memory_format_of(input_in);
  const Tensor x = in_memory_format(input_in, format);
  const PoolShape s{x.size(0), x.size(1), x.size(2), x.size(3), output_size[0], output_size[1]};
  return pooling_pass("adaptive_avg_pool2d", x, format, {s.n, s.c, s.out_h, s.out_w},
                      [&]<class T, bool ChannelsLast>(const T* in, T* out, unsigned blocks, cudaStream_t stream) {
                        adaptive_avg_forward_kernel<T, ChannelsLast><<<blocks, kThreads, 0, stream>>>(in, out, s);
                      });
}

Tensor adaptive_avg_pool2d_backward(const Tensor& grad_output, const Shape& input_sizes) {
  const auto device_guard = on_device_of("adaptive_avg_pool2d backward", grad_output);
  const MemoryFormat format = memory_format_of(grad_output);
  const Tensor dy = in_memory_format(grad_output, format);
  const PoolShape s{input_sizes[0], input_sizes[1], input_sizes[2], input_sizes[3], dy.size(2), dy.size(3)};
  return pooling_pass("adaptive_avg_pool2d backward", dy, format, input_sizes,
                      [&]<class T, bool ChannelsLast>(const T* in, T* out, unsigned blocks, cudaStream_t stream) {
                        adaptive_avg_backward_kernel<T, ChannelsLast><<<blocks, kThreads, 0, stream>>>(in, out, s);
                      });
}

Tensor avg_pool2d_forward(const Tensor& input_in, const AvgPool2dParams& params) {
  const auto device_guard = on_device_of("avg_pool2d", input_in);
  const MemoryFormat format = memory_format_of(input_in);
  const Tensor x = in_memory_format(input_in, format);
  const PoolShape s{x.size(0), x.size(1), x.size(2), x.size(3),
                    pooled_size(x.size(2), params.kernel[0], params.stride[0], params.padding[0]),
                    pooled_size(x.size(3), params.kernel[1], params.stride[1], params.padding[1])};
  const Window window{params.kernel[0], params.kernel[1], params.stride[0], params.stride[1], params.padding[0],
                      params.padding[1]};
  const bool include_pad = params.count_include_pad;
  return pooling_pass("avg_pool2d", x, format, {s.n, s.c, s.out_h, s.out_w},
                      [&]<class T, bool ChannelsLast>(const T* in, T* out, unsigned blocks, cudaStream_t stream) {
                        avg_pool_forward_kernel<T, ChannelsLast><<<blocks, kThreads, 0, stream>>>(in, out, s, window,
                                                                                                   include_pad);
                      });
}

Tensor avg_pool2d_backward(const Tensor& grad_output, const Shape& input_sizes, const AvgPool2dParams& params) {
  const auto device_guard = on_device_of("avg_pool2d backward", grad_output);
  const MemoryFormat format = memory_format_of(grad_output);
  const Tensor dy = in_memory_format(grad_output, format);
  const PoolShape s{input_sizes[0], input_sizes[1], input_sizes[2], input_sizes[3], dy.size(2), dy.size(3)};
  const Window window{params.kernel[0], params.kernel[1], params.stride[0], params.stride[1], params.padding[0],
                      params.padding[1]};
  const bool include_pad = params.count_include_pad;
  return pooling_pass("avg_pool2d backward", dy, format, input_sizes,
                      [&]<class T, bool ChannelsLast>(const T* in, T* out, unsigned blocks, cudaStream_t stream) {
                        avg_pool_backward_kernel<T, ChannelsLast><<<blocks, kThreads, 0, stream>>>(in, out, s, window,
                                                                                                    include_pad);
                      });
}

}  // namespace loom::ops::cuda
