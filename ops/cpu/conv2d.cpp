// CPU kernels of conv2d: im2col / col2im around the CPU GEMM (ops/cpu/gemm.h).
// The batch is split into one range of images per thread; each thread unfolds
// its images into its own column buffer and runs single-threaded GEMMs (gemm
// does not split again inside a parallel region).
#include "ops/conv2d.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/parallel.h"
#include "ops/cpu/gemm.h"
#include "ops/dispatch.h"

namespace loom::ops::cpu {
namespace {


struct Geometry {
  int64_t batch, channels, height, width;  // input (N, C, H, W)
  int64_t out_channels, kernel_h, kernel_w;
  int64_t out_h, out_w;
  Conv2dParams params;

  int64_t input_plane() const { return height * width; }
  int64_t output_plane() const { return out_h * out_w; }
  int64_t col_rows() const { return channels * kernel_h * kernel_w; }
  // A 1x1 kernel with unit stride and no padding: im2col is the identity, so
  // the image itself is the column matrix.
  bool pointwise() const {
    return kernel_h == 1 && kernel_w == 1 && params.stride == Size2{1, 1} && params.padding == Size2{0, 0};
  }
};

Geometry make_geometry(const Shape& input, const Shape& weight, const Conv2dParams& params) {
  Geometry g{};
  g.batch = input[0];
  g.channels = input[1];
  g.height = input[2];
  g.width = input[3];
  g.out_channels = weight[0];
  g.kernel_h = weight[2];
  g.kernel_w = weight[3];
  Size2 out = conv2d_output_size({g.height, g.width}, {g.kernel_h, g.kernel_w}, params);
  g.out_h = out[0];
  g.out_w = out[1];
  g.params = params;
  return g;
}

// For kernel offset `offset` (= k * dilation - padding) along an axis of
// `size` input elements: the output positions [first, last) whose input
// position o * stride + offset falls inside the input.
struct ValidRange {
  int64_t first, last;
};
ValidRange valid_outputs(int64_t offset, int64_t stride, int64_t size, int64_t outputs) {
  const int64_t first = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  const int64_t last = size - 1 - offset < 0 ? 0 : (size - 1 - offset) / stride + 1;
  const int64_t clamped_first = std::min(first, outputs);
  return {clamped_first, std::max(clamped_first, std::min(last, outputs))};
}

// image (C, H, W) -> col (C*kH*kW, Ho*Wo), zeros where the window is in the padding.
template <class T>
void im2col(const T* image, const Geometry& g, T* col) {
  const auto& p = g.params;
  for (int64_t c = 0; c < g.channels; ++c) {
    const T* plane = image + c * g.input_plane();
    for (int64_t ki = 0; ki < g.kernel_h; ++ki) {
      const int64_t offset_h = ki * p.dilation[0] - p.padding[0];
      const ValidRange rows = valid_outputs(offset_h, p.stride[0], g.height, g.out_h);
      for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
        const int64_t offset_w = kj * p.dilation[1] - p.padding[1];
        const ValidRange cols = valid_outputs(offset_w, p.stride[1], g.width, g.out_w);
        T* out = col + ((c * g.kernel_h + ki) * g.kernel_w + kj) * g.output_plane();
        // Rows are short (a 14-wide output row is 56 bytes): plain loops, which
        // the compiler vectorises, beat a memset / memmove call per row.
        for (int64_t i = 0; i < rows.first * g.out_w; ++i) out[i] = T(0);
        for (int64_t oh = rows.first; oh < rows.last; ++oh) {
          T* dst = out + oh * g.out_w;
          const T* src = plane + (oh * p.stride[0] + offset_h) * g.width + offset_w;
          for (int64_t ow = 0; ow < cols.first; ++ow) dst[ow] = T(0);
          if (p.stride[1] == 1) {
            for (int64_t ow = cols.first; ow < cols.last; ++ow) dst[ow] = src[ow];
          } else {
            for (int64_t ow = cols.first; ow < cols.last; ++ow) dst[ow] = src[ow * p.stride[1]];
          }
          for (int64_t ow = cols.last; ow < g.out_w; ++ow) dst[ow] = T(0);
        }
        for (int64_t i = rows.last * g.out_w; i < g.output_plane(); ++i) out[i] = T(0);
      }
    }
  }
}

// The adjoint of im2col: image (C, H, W) += fold of col (C*kH*kW, Ho*Wo).
template <class T>
void col2im_add(const T* col, const Geometry& g, T* image) {
  const auto& p = g.params;
  for (int64_t c = 0; c < g.channels; ++c) {
    T* plane = image + c * g.input_plane();
    for (int64_t ki = 0; ki < g.kernel_h; ++ki) {
      const int64_t offset_h = ki * p.dilation[0] - p.padding[0];
      const ValidRange rows = valid_outputs(offset_h, p.stride[0], g.height, g.out_h);
      for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
        const int64_t offset_w = kj * p.dilation[1] - p.padding[1];
        const ValidRange cols = valid_outputs(offset_w, p.stride[1], g.width, g.out_w);
        const T* in = col + ((c * g.kernel_h + ki) * g.kernel_w + kj) * g.output_plane();
        for (int64_t oh = rows.first; oh < rows.last; ++oh) {
          const T* src = in + oh * g.out_w;
          T* dst = plane + (oh * p.stride[0] + offset_h) * g.width + offset_w;
          if (p.stride[1] == 1) {
            for (int64_t ow = cols.first; ow < cols.last; ++ow) dst[ow] += src[ow];
          } else {
            for (int64_t ow = cols.first; ow < cols.last; ++ow) dst[ow * p.stride[1]] += src[ow];
          }
        }
      }
    }
  }
}

// Splits [0, batch) into one contiguous range per thread and runs
// fn(task, begin, end) for each; `tasks` is fixed before the run so that
// per-task partial results can be reduced in a deterministic order.
int64_t batch_tasks(int64_t batch) {
  return in_parallel_region() ? 1 : std::max<int64_t>(1, std::min<int64_t>(batch, get_num_threads()));
}
template <class Fn>
void for_each_batch_range(int64_t batch, int64_t tasks, Fn&& fn) {
  parallel_for(0, tasks, 1, [&](int64_t task_begin, int64_t task_end) {
    for (int64_t t = task_begin; t < task_end; ++t) fn(t, batch * t / tasks, batch * (t + 1) / tasks);
  });
}

template <class T>
void forward(const T* input, const T* weight, const T* bias, const Geometry& g, T* output) {
  const int64_t k = g.col_rows(), plane = g.output_plane();
  // weight: (O, C*kH*kW)
  for_each_batch_range(g.batch, batch_tasks(g.batch), [&](int64_t, int64_t begin, int64_t end) {
    std::vector<T> col_buffer(g.pointwise() ? 0 : k * plane);
    for (int64_t n = begin; n < end; ++n) {
      const T* image = input + n * g.channels * g.input_plane();
      const T* col = image;
      if (!g.pointwise()) {
        im2col(image, g, col_buffer.data());
        col = col_buffer.data();
      }
      T* y = output + n * g.out_channels * plane;  // (O, Ho*Wo)
      if (bias != nullptr) {
        for (int64_t o = 0; o < g.out_channels; ++o) std::fill(y + o * plane, y + (o + 1) * plane, bias[o]);
      }
      gemm(Transpose::no, Transpose::no, g.out_channels, plane, k, T(1), weight, k, col, plane,
           bias != nullptr ? T(1) : T(0), y, plane);
    }
  });
}

template <class T>
void backward_input(const T* grad_output, const T* weight, const Geometry& g, T* grad_input) {
  const int64_t k = g.col_rows(), plane = g.output_plane();
  for_each_batch_range(g.batch, batch_tasks(g.batch), [&](int64_t, int64_t begin, int64_t end) {
    std::vector<T> col_buffer(g.pointwise() ? 0 : k * plane);
    for (int64_t n = begin; n < end; ++n) {
      const T* dy = grad_output + n * g.out_channels * plane;  // (O, Ho*Wo)
      T* dx = grad_input + n * g.channels * g.input_plane();
      // col = Wᵀ · dY: (C*kH*kW, Ho*Wo)
      T* col = g.pointwise() ? dx : col_buffer.data();
      gemm(Transpose::yes, Transpose::no, k, plane, g.out_channels, T(1), weight, k, dy, plane, T(0), col, plane);
      if (g.pointwise()) continue;
      std::fill(dx, dx + g.channels * g.input_plane(), T(0));
      col2im_add(col_buffer.data(), g, dx);
    }
  });
}

template <class T>
void backward_weight(const T* grad_output, const T* input, const Geometry& g, T* grad_weight) {
  const int64_t k = g.col_rows(), plane = g.output_plane();
  const int64_t tasks = batch_tasks(g.batch);
  // Task 0 accumulates into grad_weight itself, the others into partials that
  // are added afterwards in task order.
  std::vector<T> partials(static_cast<size_t>((tasks - 1) * g.out_channels * k));
  for_each_batch_range(g.batch, tasks, [&](int64_t task, int64_t begin, int64_t end) {
    T* accumulator = task == 0 ? grad_weight : partials.data() + (task - 1) * g.out_channels * k;
    if (begin == end) std::fill(accumulator, accumulator + g.out_channels * k, T(0));
    std::vector<T> col_buffer(g.pointwise() ? 0 : k * plane);
    for (int64_t n = begin; n < end; ++n) {
      const T* image = input + n * g.channels * g.input_plane();
      const T* col = image;
      if (!g.pointwise()) {
        im2col(image, g, col_buffer.data());
        col = col_buffer.data();
      }
      // dW (+)= dY · colᵀ: (O, C*kH*kW)
      gemm(Transpose::no, Transpose::yes, g.out_channels, k, plane, T(1), grad_output + n * g.out_channels * plane,
           plane, col, plane, n == begin ? T(0) : T(1), accumulator, k);
    }
  });
  const int64_t size = g.out_channels * k;
  for (int64_t t = 1; t < tasks; ++t) {
    const T* partial = partials.data() + (t - 1) * size;
    for (int64_t i = 0; i < size; ++i) grad_weight[i] += partial[i];
  }
}

}  // namespace

Tensor conv2d_forward(const Tensor& input_in, const Tensor& weight_in, const Tensor& bias_in,
                      const Conv2dParams& params) {
  const Tensor input = cpu_compute_input(input_in), weight = cpu_compute_input(weight_in);
  const Tensor bias = bias_in.defined() ? cpu_compute_input(bias_in) : Tensor();
  const Geometry g = make_geometry(input.sizes(), weight.sizes(), params);
  Tensor out = Tensor::empty({g.batch, g.out_channels, g.out_h, g.out_w}, input.dtype());
  visit_compute_dtype(input.dtype(), "conv2d", [&]<class T>() {
    forward(input.data<T>(), weight.data<T>(), bias.defined() ? bias.data<T>() : nullptr, g, out.data<T>());
  });
  return out.to(input_in.dtype());
}

Tensor conv2d_backward_input(const Tensor& grad_output_in, const Tensor& weight_in, const Shape& input_sizes,
                             const Conv2dParams& params) {
  const Tensor grad_output = cpu_compute_input(grad_output_in), weight = cpu_compute_input(weight_in);
  const Geometry g = make_geometry(input_sizes, weight.sizes(), params);
  Tensor grad_input = Tensor::empty(input_sizes, grad_output.dtype());
  visit_compute_dtype(grad_output.dtype(), "conv2d backward", [&]<class T>() {
    backward_input(grad_output.data<T>(), weight.data<T>(), g, grad_input.data<T>());
  });
  return grad_input.to(grad_output_in.dtype());
}

Tensor conv2d_backward_weight(const Tensor& grad_output_in, const Tensor& input_in, const Shape& weight_sizes,
                              const Conv2dParams& params) {
  const Tensor grad_output = cpu_compute_input(grad_output_in), input = cpu_compute_input(input_in);
  const Geometry g = make_geometry(input.sizes(), weight_sizes, params);
  Tensor grad_weight = Tensor::empty(weight_sizes, grad_output.dtype());
  visit_compute_dtype(grad_output.dtype(), "conv2d backward", [&]<class T>() {
    backward_weight(grad_output.data<T>(), input.data<T>(), g, grad_weight.data<T>());
  });
  return grad_weight.to(grad_output_in.dtype());
}

Tensor conv2d_backward_bias(const Tensor& grad_output_in) {
  const Tensor grad_output = cpu_compute_input(grad_output_in);
  const int64_t batch = grad_output.size(0), channels = grad_output.size(1);
  const int64_t plane = grad_output.numel() / std::max<int64_t>(1, batch * channels);
  Tensor grad_bias = Tensor::empty({channels}, grad_output.dtype());
  visit_compute_dtype(grad_output.dtype(), "conv2d backward", [&]<class T>() {
    const T* dy = grad_output.data<T>();
    T* db = grad_bias.data<T>();
    parallel_for(0, channels, 4, [&](int64_t begin, int64_t end) {
      for (int64_t o = begin; o < end; ++o) {
        double total = 0;
        for (int64_t n = 0; n < batch; ++n) {
          // Eigen's sum is vectorised (a plain loop is not, without -ffast-math).
          total += static_cast<double>(Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(dy + (n * channels + o) * plane, plane).sum());
        }
        db[o] = static_cast<T>(total);
      }
    });
  });
  return grad_bias.to(grad_output_in.dtype());
}

}  // namespace loom::ops::cpu
