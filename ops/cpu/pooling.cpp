// CPU kernels of max_pool2d, avg_pool2d and adaptive_avg_pool2d: one (n, c)
// plane per task.
#include <loom/ops/pooling.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include <loom/core/parallel.h>
#include <loom/ops/cpu/max_pool_2x2.h>
#include <loom/ops/cpu/simd.h>
#include <loom/ops/dispatch.h>
#include <loom/ops/pooling_math.h>

namespace loom::ops::cpu {
namespace {
constexpr int64_t kGrain = 1 << 14;  // elements per task

// Runs fn(plane) over the N*C planes of an (N, C, H, W) tensor, in parallel.
template <class Fn>
void for_each_plane(const Shape& sizes, Fn&& fn) {
  const int64_t planes = sizes[0] * sizes[1];
  const int64_t plane_size = std::max<int64_t>(1, sizes[2] * sizes[3]);
  parallel_for(0, planes, std::max<int64_t>(1, kGrain / plane_size), [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) fn(p);
  });
}

int64_t pooled_size(int64_t input, int64_t kernel, int64_t stride, int64_t padding) {
  return (input + 2 * padding - kernel) / stride + 1;
}

// Adaptive pooling window of output i of `outputs` over `inputs`: [start, end).
// The mean of every output's window of each (N, C) plane, the window's rows
// rows_of(oh) and columns cols_of(ow) (AvgPoolSpan, ops/pooling_math.h):
// adaptive_avg_pool2d and avg_pool2d.
template <class RowsOf, class ColsOf>
Tensor average_windows(const char* op, const Tensor& input_in, int64_t out_h, int64_t out_w, RowsOf rows_of,
                       ColsOf cols_of, bool count_include_pad) {
  const Tensor input = cpu_compute_input(input_in);
  const int64_t height = input.size(2), width = input.size(3);
  Tensor out = Tensor::empty({input.size(0), input.size(1), out_h, out_w}, input.dtype());
  visit_compute_dtype(input.dtype(), op, [&]<class T>() {
    const T* x = input.data<T>();
    T* y = out.data<T>();
    for_each_plane(input.sizes(), [&](int64_t p) {
      const T* plane = x + p * height * width;
      for (int64_t oh = 0; oh < out_h; ++oh) {
        const AvgPoolSpan rows = rows_of(oh);
        for (int64_t ow = 0; ow < out_w; ++ow) {
          const AvgPoolSpan cols = cols_of(ow);
          T total = 0;
          for (int64_t h = rows.begin; h < rows.end; ++h) {
            for (int64_t w = cols.begin; w < cols.end; ++w) total += plane[h * width + w];
          }
          y[(p * out_h + oh) * out_w + ow] = total / static_cast<T>(avg_pool_divisor(rows, cols, count_include_pad));
        }
      }
    });
  });
  return out.to(input_in.dtype());
}

// average_windows' backward: each output's gradient shared evenly over its window.
template <class RowsOf, class ColsOf>
Tensor spread_over_windows(const char* op, const Tensor& grad_output_in, const Shape& input_sizes, RowsOf rows_of,
                           ColsOf cols_of, bool count_include_pad) {
  const Tensor grad_output = cpu_compute_input(grad_output_in);
  const int64_t height = input_sizes[2], width = input_sizes[3];
  const int64_t out_h = grad_output.size(2), out_w = grad_output.size(3);
  Tensor grad_input = Tensor::empty(input_sizes, grad_output.dtype());
  visit_compute_dtype(grad_output.dtype(), op, [&]<class T>() {
    const T* dy = grad_output.data<T>();
    T* dx = grad_input.data<T>();
    for_each_plane(input_sizes, [&](int64_t p) {
      T* plane = dx + p * height * width;
      std::fill(plane, plane + height * width, T(0));
      for (int64_t oh = 0; oh < out_h; ++oh) {
        const AvgPoolSpan rows = rows_of(oh);
        for (int64_t ow = 0; ow < out_w; ++ow) {
          const AvgPoolSpan cols = cols_of(ow);
          const T share =
              dy[(p * out_h + oh) * out_w + ow] / static_cast<T>(avg_pool_divisor(rows, cols, count_include_pad));
          for (int64_t h = rows.begin; h < rows.end; ++h) {
            for (int64_t w = cols.begin; w < cols.end; ++w) plane[h * width + w] += share;
          }
        }
      }
    });
  });
  return grad_input.to(grad_output_in.dtype());
}
}  // namespace

Tensor max_pool2d_forward(const Tensor& input_in, Size2 kernel, Size2 stride, Size2 padding, Tensor& indices) {
  const Tensor input = cpu_compute_input(input_in);
  const int64_t height = input.size(2), width = input.size(3);
  const int64_t out_h = pooled_size(height, kernel[0], stride[0], padding[0]);
  const int64_t out_w = pooled_size(width, kernel[1], stride[1], padding[1]);
  const Shape out_sizes{input.size(0), input.size(1), out_h, out_w};
  Tensor out = Tensor::empty(out_sizes, input.dtype());
  indices = Tensor::empty(out_sizes, DType::i64);
  visit_compute_dtype(input.dtype(), "max_pool2d", [&]<class T>() {
    const T* x = input.data<T>();
    T* y = out.data<T>();
    int64_t* arg = indices.data<int64_t>();
    const bool two_by_two = kernel == Size2{2, 2} && stride == Size2{2, 2} && padding == Size2{0, 0};
    for_each_plane(input.sizes(), [&](int64_t p) {
      const T* plane = x + p * height * width;
      T* y_plane = y + p * out_h * out_w;
      int64_t* arg_plane = arg + p * out_h * out_w;
      if (two_by_two) {
#if defined(__x86_64__)
        if constexpr (std::is_same_v<T, float>) {
          if (cpu_has_avx2() && height * width < (int64_t{1} << 31)) {
            pool_2x2_avx2(plane, width, out_h, out_w, y_plane, arg_plane);
            return;
          }
        }
#endif
        pool_2x2(plane, width, out_h, out_w, y_plane, arg_plane);
        return;
      }
      for (int64_t oh = 0; oh < out_h; ++oh) {
        const int64_t h0 = std::max<int64_t>(oh * stride[0] - padding[0], 0);
        const int64_t h1 = std::min<int64_t>(oh * stride[0] - padding[0] + kernel[0], height);
        for (int64_t ow = 0; ow < out_w; ++ow) {
          const int64_t w0 = std::max<int64_t>(ow * stride[1] - padding[1], 0);
          const int64_t w1 = std::min<int64_t>(ow * stride[1] - padding[1] + kernel[1], width);
          // The index moves by a mask and the value by max, not by a branch: on
          // real data "v > best" is unpredictable, and mispredictions
          // dominated the run time. NaNs are rare and handled after the scan.
          T best = -std::numeric_limits<T>::infinity();
          int64_t best_index = h0 * width + w0;
          bool saw_nan = false;
          for (int64_t h = h0; h < h1; ++h) {
            for (int64_t w = w0; w < w1; ++w) {
              const T v = plane[h * width + w];
              const int64_t take = -static_cast<int64_t>(v > best);  // all ones or zero
              best_index = ((h * width + w) & take) | (best_index & ~take);
              best = std::max(best, v);
              saw_nan |= std::isnan(v);
            }
          }
          if (saw_nan) {  // as in PyTorch: the last NaN of the window wins
            for (int64_t h = h0; h < h1; ++h) {
              for (int64_t w = w0; w < w1; ++w) {
                if (std::isnan(plane[h * width + w])) best_index = h * width + w;
              }
            }
            best = plane[best_index];
          }
          y_plane[oh * out_w + ow] = best;
          arg_plane[oh * out_w + ow] = best_index;
        }
      }
    });
  });
  return out.to(input_in.dtype());
}

Tensor max_pool2d_backward(const Tensor& grad_output_in, const Tensor& indices, const Shape& input_sizes) {
  const Tensor grad_output = cpu_compute_input(grad_output_in);
  const Tensor index = indices.contiguous();
  const int64_t in_plane = input_sizes[2] * input_sizes[3];
  const int64_t out_plane = grad_output.size(2) * grad_output.size(3);
  Tensor grad_input = Tensor::empty(input_sizes, grad_output.dtype());
  visit_compute_dtype(grad_output.dtype(), "max_pool2d backward", [&]<class T>() {
    const T* dy = grad_output.data<T>();
    const int64_t* arg = index.data<int64_t>();
    T* dx = grad_input.data<T>();
    for_each_plane(input_sizes, [&](int64_t p) {
      T* dx_plane = dx + p * in_plane;
      std::fill(dx_plane, dx_plane + in_plane, T(0));
      for (int64_t i = 0; i < out_plane; ++i) dx_plane[arg[p * out_plane + i]] += dy[p * out_plane + i];
    });
  });
  return grad_input.to(grad_output_in.dtype());
}

Tensor adaptive_avg_pool2d_forward(const Tensor& input, Size2 output_size) {
  const int64_t height = input.size(2), width = input.size(3);
  // Not a structured binding: clang before 16 (the fuzz build's) cannot capture one in a lambda.
  const int64_t out_h = output_size[0], out_w = output_size[1];
  return average_windows(
      "adaptive_avg_pool2d", input, out_h, out_w, [&](int64_t oh) { return adaptive_pool_span(oh, height, out_h); },
      [&](int64_t ow) { return adaptive_pool_span(ow, width, out_w); }, false);
}

Tensor adaptive_avg_pool2d_backward(const Tensor& grad_output, const Shape& input_sizes) {
  const int64_t height = input_sizes[2], width = input_sizes[3];
  const int64_t out_h = grad_output.size(2), out_w = grad_output.size(3);
  return spread_over_windows(
      "adaptive_avg_pool2d backward", grad_output, input_sizes,
      [&](int64_t oh) { return adaptive_pool_span(oh, height, out_h); },
      [&](int64_t ow) { return adaptive_pool_span(ow, width, out_w); }, false);
}

Tensor avg_pool2d_forward(const Tensor& input, const AvgPool2dParams& params) {
  const int64_t height = input.size(2), width = input.size(3);
  const Size2 kernel = params.kernel, stride = params.stride, padding = params.padding;
  return average_windows(
      "avg_pool2d", input, pooled_size(height, kernel[0], stride[0], padding[0]),
      pooled_size(width, kernel[1], stride[1], padding[1]),
      [&](int64_t oh) { return avg_pool_span(oh, height, kernel[0], stride[0], padding[0]); },
      [&](int64_t ow) { return avg_pool_span(ow, width, kernel[1], stride[1], padding[1]); }, params.count_include_pad);
}

Tensor avg_pool2d_backward(const Tensor& grad_output, const Shape& input_sizes, const AvgPool2dParams& params) {
  const int64_t height = input_sizes[2], width = input_sizes[3];
  const Size2 kernel = params.kernel, stride = params.stride, padding = params.padding;
  return spread_over_windows(
      "avg_pool2d backward", grad_output, input_sizes,
      [&](int64_t oh) { return avg_pool_span(oh, height, kernel[0], stride[0], padding[0]); },
      [&](int64_t ow) { return avg_pool_span(ow, width, kernel[1], stride[1], padding[1]); }, params.count_include_pad);
}

}  // namespace loom::ops::cpu
