// CPU kernels of grouped convolution (ops/conv2d.h, params.groups > 1): a
// direct depthwise kernel when every group holds one input channel
// (groups == C: MobileNet's and EfficientNet's 3x3 and 5x5 convolutions),
// else the dense kernels of conv2d.cpp once per group on that group's channel
// slices. Depthwise work is split by (image, channel) planes forward and for
// the input gradient, and by output channels for the weight gradient (each
// sums its images in order), so results do not depend on the thread count.
#include <loom/ops/conv2d.h>

#include <algorithm>
#include <memory>
#include <vector>

#include <loom/core/autograd.h>
#include <loom/core/parallel.h>
#include <loom/ops/cpu/conv2d_internal.h>
#include <loom/ops/dispatch.h>

namespace loom::ops::cpu {
namespace {
constexpr int64_t kGrain = 1 << 14;  // output elements per task

// Sizes of a depthwise problem: input (N, C, H, W), weight (C * M, 1, kH, kW),
// output (N, C * M, Ho, Wo), M the channel multiplier.
struct Depthwise {
  int64_t batch, channels, height, width, multiplier, kernel_h, kernel_w, out_h, out_w;
  Conv2dParams params;
  int64_t out_channels() const { return channels * multiplier; }
};

Depthwise depthwise_problem(const Shape& input, const Shape& weight, const Conv2dParams& params) {
  const Size2 out = conv2d_output_size({input[2], input[3]}, {weight[2], weight[3]}, params);
  return {input[0], input[1], input[2], input[3], weight[0] / input[1], weight[2], weight[3], out[0], out[1], params};
}

bool is_depthwise(const Shape& input, const Conv2dParams& params) { return params.groups == input[1]; }

// Outputs [first, last) along an axis of `size` inputs whose position
// o * stride + offset falls inside the input (offset = k * dilation - padding).
void valid_outputs(int64_t offset, int64_t size, int64_t stride, int64_t outputs, int64_t& first, int64_t& last) {
  first = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  last = size - offset <= 0 ? 0 : std::min<int64_t>(outputs, (size - offset + stride - 1) / stride);
  first = std::min(first, last);
}

// One tap of the kernel with the output rectangle [oh0, oh1) x [ow0, ow1)
// whose input position (o * stride + offset) falls inside the image.
struct Tap {
  int64_t index;  // kh * kernel_w + kw
  int64_t oh0, oh1, ow0, ow1, row_offset, col_offset;
  // Calls fn(output, input) for each output position (oh * out_w + ow) the
  // tap reaches and the input position (h * width + w) it reads there, oh then ow.
  template <class Fn>
  void for_each_read(const Depthwise& d, Fn&& fn) const {
    const int64_t sh = d.params.stride[0], sw = d.params.stride[1];
    for (int64_t oh = oh0; oh < oh1; ++oh)
      for (int64_t ow = ow0; ow < ow1; ++ow)
        fn(oh * d.out_w + ow, (oh * sh + row_offset) * d.width + ow * sw + col_offset);
  }
};

// The taps that read inside the image, in (kh, kw) order: computed once per
// call, not per plane, and without the taps that only read padding (a 7x7
// kernel over ConvNeXt's 2x2 and 1x1 planes reads 9 and 1 of its 49 taps).
std::vector<Tap> taps_inside(const Depthwise& d) {
  const Conv2dParams& p = d.params;
  std::vector<Tap> taps;
  for (int64_t kh = 0; kh < d.kernel_h; ++kh) {
    const int64_t row_offset = kh * p.dilation[0] - p.padding[0];
    int64_t oh0, oh1;
    valid_outputs(row_offset, d.height, p.stride[0], d.out_h, oh0, oh1);
    for (int64_t kw = 0; kw < d.kernel_w; ++kw) {
      const int64_t col_offset = kw * p.dilation[1] - p.padding[1];
      int64_t ow0, ow1;
      valid_outputs(col_offset, d.width, p.stride[1], d.out_w, ow0, ow1);
      if (oh0 < oh1 && ow0 < ow1) taps.push_back({kh * d.kernel_w + kw, oh0, oh1, ow0, ow1, row_offset, col_offset});
    }
  }
  return taps;
}

// Stride 1 and dilation 1 with rows of at least 8 outputs (ConvNeXt's 7x7
// over 8x8 planes, MobileNet's 3x3 over 16x16): each plane goes through a
// zero-bordered copy (padded_h x padded_w), so that every tap reads or writes
// a whole contiguous row and the row loop vectorizes. Each output (or input
// gradient) sums the same products in the same order as the general path,
// the padding's zeros aside.
bool padded_plane_path(const Depthwise& d) {
  const Conv2dParams& p = d.params;
  return p.stride[0] == 1 && p.stride[1] == 1 && p.dilation[0] == 1 && p.dilation[1] == 1 && d.out_w >= 8;
}

// The zero-bordered plane of padded_plane_path: (out_h + kernel_h - 1) x
// (out_w + kernel_w - 1), the image at (padding[0], padding[1]).
template <class T>
struct PaddedPlane {
  explicit PaddedPlane(const Depthwise& d)
      : rows(d.out_h + d.kernel_h - 1), cols(d.out_w + d.kernel_w - 1), top(d.params.padding[0]),
        left(d.params.padding[1]), values(static_cast<size_t>(rows * cols), T(0)) {}
  // Copies an (height, width) image into the interior; the border stays zero.
  void load(const T* image, const Depthwise& d) {
    for (int64_t h = 0; h < d.height; ++h)
      std::copy(image + h * d.width, image + (h + 1) * d.width, values.data() + (h + top) * cols + left);
  }
  // Copies the interior out into an (height, width) image.
  void store(T* image, const Depthwise& d) const {
    for (int64_t h = 0; h < d.height; ++h) {
      const T* row = values.data() + (h + top) * cols + left;
      std::copy(row, row + d.width, image + h * d.width);
    }
  }
  int64_t rows, cols, top, left;
  std::vector<T> values;
};

// One plane's taps in (kh, kw) order, row by row: forward (ToOutputs) the
// output plane += tap * the padded input's rows; for the input gradient the
// padded plane's rows += tap * the output gradient's.
template <bool ToOutputs, class T>
void accumulate_padded_taps(const Depthwise& d, const T* taps, PaddedPlane<T>& padded, const T* grad_output,
                            T* output) {
  for (int64_t kh = 0; kh < d.kernel_h; ++kh) {
    for (int64_t kw = 0; kw < d.kernel_w; ++kw) {
      const T tap = taps[kh * d.kernel_w + kw];
      for (int64_t oh = 0; oh < d.out_h; ++oh) {
        T* padded_row = padded.values.data() + (oh + kh) * padded.cols + kw;
        if constexpr (ToOutputs) {
          T* out_row = output + oh * d.out_w;
          for (int64_t ow = 0; ow < d.out_w; ++ow) out_row[ow] += tap * padded_row[ow];
        } else {
          const T* grad_row = grad_output + oh * d.out_w;
          for (int64_t ow = 0; ow < d.out_w; ++ow) padded_row[ow] += tap * grad_row[ow];
        }
      }
    }
  }
}

template <class T>
void depthwise_forward_padded(const T* x, const T* w, const T* b, const Depthwise& d, T* y) {
  const int64_t out_plane = d.out_h * d.out_w, planes = d.batch * d.out_channels();
  parallel_for(0, planes, std::max<int64_t>(1, kGrain / std::max<int64_t>(out_plane, 1)), [&](int64_t begin,
                                                                                              int64_t end) {
    PaddedPlane<T> padded(d);
    for (int64_t plane = begin; plane < end; ++plane) {
      const int64_t n = plane / d.out_channels(), o = plane % d.out_channels();
      padded.load(x + (n * d.channels + o / d.multiplier) * d.height * d.width, d);
      const T* taps = w + o * d.kernel_h * d.kernel_w;
      T* out = y + plane * out_plane;
      std::fill(out, out + out_plane, b != nullptr ? b[o] : T(0));
      accumulate_padded_taps<true, T>(d, taps, padded, nullptr, out);
    }
  });
}

template <class T>
void depthwise_backward_input_padded(const T* dy, const T* w, const Depthwise& d, T* dx) {
  const int64_t in_plane = d.height * d.width, out_plane = d.out_h * d.out_w, planes = d.batch * d.channels;
  parallel_for(0, planes, std::max<int64_t>(1, kGrain / std::max<int64_t>(out_plane * d.multiplier, 1)),
               [&](int64_t begin, int64_t end) {
                 PaddedPlane<T> padded(d);
                 for (int64_t plane = begin; plane < end; ++plane) {
                   const int64_t n = plane / d.channels, c = plane % d.channels;
                   std::fill(padded.values.begin(), padded.values.end(), T(0));
                   for (int64_t m = 0; m < d.multiplier; ++m) {
                     const int64_t o = c * d.multiplier + m;
                     const T* grad_out = dy + (n * d.out_channels() + o) * out_plane;
                     const T* taps = w + o * d.kernel_h * d.kernel_w;
                     accumulate_padded_taps<false, T>(d, taps, padded, grad_out, nullptr);
                   }
                   padded.store(dx + plane * in_plane, d);
                 }
               });
}

// Small planes (at most 16 outputs: ConvNeXt's 4x4, 2x2 and 1x1, MobileNet's
// and EfficientNet's last stages) with one input channel per output channel:
// per plane the general path's loops are a few elements long, so the tensors
// go through (N, H, W, C) copies and each tap's products run along the
// channels, which vectorizes. Each channel sums the same products in the same
// order as the general path.
bool channels_last_path(const Depthwise& d) {
  return d.multiplier == 1 && d.out_h * d.out_w <= 16 && d.channels >= 8;
}

// (rows, columns) -> (columns, rows) for each of `count` matrices, in parallel over them.
template <class T>
void transpose_each(const T* in, int64_t count, int64_t rows, int64_t columns, T* out) {
  parallel_for(0, count, std::max<int64_t>(1, kGrain / std::max<int64_t>(rows * columns, 1)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t i = begin; i < end; ++i) {
                   const T* from = in + i * rows * columns;
                   T* to = out + i * rows * columns;
                   for (int64_t r = 0; r < rows; ++r)
                     for (int64_t c = 0; c < columns; ++c) to[c * rows + r] = from[r * columns + c];
                 }
               });
}

// Uninitialised scratch of n values.
template <class T>
std::unique_ptr<T[]> scratch(int64_t n) {
  return std::unique_ptr<T[]>(new T[static_cast<size_t>(std::max<int64_t>(n, 1))]);
}

// Forward (ToOutputs: output = bias + taps * input) or the input gradient
// (taps * output gradient) through (N, *, C) copies: image by image, each
// tap in (kh, kw) order adds its products along the channels at every
// (output, input) pair it reads.
template <bool ToOutputs, class T>
void depthwise_channels_last(const T* source, const T* w, const T* bias, const Depthwise& d, T* target) {
  const int64_t channels = d.channels, in_plane = d.height * d.width, out_plane = d.out_h * d.out_w;
  const int64_t source_plane = ToOutputs ? in_plane : out_plane, target_plane = ToOutputs ? out_plane : in_plane;
  const int64_t taps_per_channel = d.kernel_h * d.kernel_w;
  auto source_last = scratch<T>(d.batch * source_plane * channels);  // (N, *, C)
  auto target_last = scratch<T>(d.batch * target_plane * channels);  // (N, *, C)
  auto w_last = scratch<T>(taps_per_channel * channels);             // (kH * kW, C)
  transpose_each(source, d.batch, channels, source_plane, source_last.get());
  transpose_each(w, 1, channels, taps_per_channel, w_last.get());
  const std::vector<Tap> inside = taps_inside(d);
  parallel_for(0, d.batch, 1, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const T* from = source_last.get() + n * source_plane * channels;
      T* to = target_last.get() + n * target_plane * channels;
      for (int64_t p = 0; p < target_plane; ++p)  // the bias first, as the general path
        for (int64_t c = 0; c < channels; ++c) to[p * channels + c] = bias != nullptr ? bias[c] : T(0);
      for (const Tap& t : inside) {
        const T* taps = w_last.get() + t.index * channels;
        t.for_each_read(d, [&](int64_t output, int64_t input) {
          T* values = to + (ToOutputs ? output : input) * channels;
          const T* in = from + (ToOutputs ? input : output) * channels;
          for (int64_t c = 0; c < channels; ++c) values[c] += taps[c] * in[c];
        });
      }
    }
  });
  transpose_each(target_last.get(), d.batch, target_plane, channels, target);
}

// Each block of channels sums its taps' products over the images and outputs
// in the general path's order (n, then oh, then ow).
template <class T>
void depthwise_backward_weight_channels_last(const T* dy, const T* x, const Depthwise& d, T* dw) {
  const int64_t channels = d.channels, in_plane = d.height * d.width, out_plane = d.out_h * d.out_w;
  const int64_t taps_per_channel = d.kernel_h * d.kernel_w;
  auto dy_last = scratch<T>(d.batch * out_plane * channels);  // (N, Ho, Wo, C)
  auto x_last = scratch<T>(d.batch * in_plane * channels);    // (N, H, W, C)
  auto dw_last = scratch<T>(taps_per_channel * channels);     // (kH * kW, C)
  transpose_each(dy, d.batch, channels, out_plane, dy_last.get());
  transpose_each(x, d.batch, channels, in_plane, x_last.get());
  std::fill(dw_last.get(), dw_last.get() + taps_per_channel * channels, T(0));  // the taps that only read padding
  const std::vector<Tap> inside = taps_inside(d);
  constexpr int64_t kBlock = 64;  // channels per task
  parallel_for(0, (channels + kBlock - 1) / kBlock, 1, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      const int64_t c0 = block * kBlock, width = std::min(kBlock, channels - c0);
      for (const Tap& t : inside) {
        T* total = dw_last.get() + t.index * channels + c0;
        for (int64_t n = 0; n < d.batch; ++n) {
          const T* image = x_last.get() + n * in_plane * channels + c0;
          const T* grad_image = dy_last.get() + n * out_plane * channels + c0;
          t.for_each_read(d, [&](int64_t output, int64_t input) {
            const T* in = image + input * channels;
            const T* grad_out = grad_image + output * channels;
            for (int64_t c = 0; c < width; ++c) total[c] += grad_out[c] * in[c];
          });
        }
      }
    }
  });
  transpose_each(dw_last.get(), 1, taps_per_channel, channels, dw);
}

template <class T>
void depthwise_forward(const T* x, const T* w, const T* b, const Depthwise& d, T* y) {
  if (channels_last_path(d)) return depthwise_channels_last<true>(x, w, b, d, y);
  if (padded_plane_path(d)) return depthwise_forward_padded(x, w, b, d, y);
  const int64_t out_plane = d.out_h * d.out_w, planes = d.batch * d.out_channels();
  const int64_t sh = d.params.stride[0], sw = d.params.stride[1];
  const std::vector<Tap> inside = taps_inside(d);
  parallel_for(0, planes, std::max<int64_t>(1, kGrain / std::max<int64_t>(out_plane, 1)), [&](int64_t begin,
                                                                                              int64_t end) {
    for (int64_t plane = begin; plane < end; ++plane) {
      const int64_t n = plane / d.out_channels(), o = plane % d.out_channels();
      const T* in = x + (n * d.channels + o / d.multiplier) * d.height * d.width;
      const T* taps = w + o * d.kernel_h * d.kernel_w;
      T* out = y + plane * out_plane;
      std::fill(out, out + out_plane, b != nullptr ? b[o] : T(0));
      for (const Tap& t : inside) {
        const T tap = taps[t.index];
        for (int64_t oh = t.oh0; oh < t.oh1; ++oh) {
          const T* in_row = in + (oh * sh + t.row_offset) * d.width + t.col_offset;
          T* out_row = out + oh * d.out_w;
          for (int64_t ow = t.ow0; ow < t.ow1; ++ow) out_row[ow] += tap * in_row[ow * sw];
        }
      }
    }
  });
}

// d input plane (n, c) = sum over its M output channels and the taps of dy * w,
// spread back to the input positions each output read.
template <class T>
void depthwise_backward_input(const T* dy, const T* w, const Depthwise& d, T* dx) {
  if (channels_last_path(d)) return depthwise_channels_last<false, T>(dy, w, nullptr, d, dx);
  if (padded_plane_path(d)) return depthwise_backward_input_padded(dy, w, d, dx);
  const int64_t in_plane = d.height * d.width, out_plane = d.out_h * d.out_w, planes = d.batch * d.channels;
  const int64_t sh = d.params.stride[0], sw = d.params.stride[1];
  const std::vector<Tap> inside = taps_inside(d);
  parallel_for(0, planes, std::max<int64_t>(1, kGrain / std::max<int64_t>(out_plane * d.multiplier, 1)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t plane = begin; plane < end; ++plane) {
                   const int64_t n = plane / d.channels, c = plane % d.channels;
                   T* grad_in = dx + plane * in_plane;
                   std::fill(grad_in, grad_in + in_plane, T(0));
                   for (int64_t m = 0; m < d.multiplier; ++m) {
                     const int64_t o = c * d.multiplier + m;
                     const T* grad_out = dy + (n * d.out_channels() + o) * out_plane;
                     const T* taps = w + o * d.kernel_h * d.kernel_w;
                     for (const Tap& t : inside) {
                       const T tap = taps[t.index];
                       for (int64_t oh = t.oh0; oh < t.oh1; ++oh) {
                         T* in_row = grad_in + (oh * sh + t.row_offset) * d.width + t.col_offset;
                         const T* out_row = grad_out + oh * d.out_w;
                         for (int64_t ow = t.ow0; ow < t.ow1; ++ow) in_row[ow * sw] += tap * out_row[ow];
                       }
                     }
                   }
                 }
               });
}

// d w[o, 0, kh, kw] = sum over images and outputs of dy[n, o] * x[n, o / M] at the tap's position.
template <class T>
void depthwise_backward_weight(const T* dy, const T* x, const Depthwise& d, T* dw) {
  if (channels_last_path(d)) return depthwise_backward_weight_channels_last(dy, x, d, dw);
  const int64_t in_plane = d.height * d.width, out_plane = d.out_h * d.out_w, taps_per_channel = d.kernel_h * d.kernel_w;
  const int64_t sh = d.params.stride[0], sw = d.params.stride[1];
  const std::vector<Tap> inside = taps_inside(d);
  parallel_for(0, d.out_channels(), std::max<int64_t>(1, kGrain / std::max<int64_t>(d.batch * out_plane, 1)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t o = begin; o < end; ++o) {
                   T* grad_taps = dw + o * taps_per_channel;
                   std::fill(grad_taps, grad_taps + taps_per_channel, T(0));  // the taps that only read padding
                   for (const Tap& t : inside) {
                     T total = 0;
                     for (int64_t n = 0; n < d.batch; ++n) {
                       const T* in = x + (n * d.channels + o / d.multiplier) * in_plane;
                       const T* grad_out = dy + (n * d.out_channels() + o) * out_plane;
                       for (int64_t oh = t.oh0; oh < t.oh1; ++oh) {
                         const T* in_row = in + (oh * sh + t.row_offset) * d.width + t.col_offset;
                         const T* out_row = grad_out + oh * d.out_w;
                         for (int64_t ow = t.ow0; ow < t.ow1; ++ow) total += out_row[ow] * in_row[ow * sw];
                       }
                     }
                     grad_taps[t.index] = total;
                   }
                 }
               });
}

// Channels [g * size, (g + 1) * size) of dim `dim`, contiguous.
Tensor channel_run(const Tensor& t, int64_t dim, int64_t g, int64_t size) {
  NoGradGuard no_grad;
  return t.slice(dim, g * size, (g + 1) * size).contiguous();
}

Conv2dParams dense(Conv2dParams params) {
  params.groups = 1;
  return params;
}

// `sizes` with dim `dim` cut to one group's `size` channels.
Shape channel_run_sizes(Shape sizes, int64_t dim, int64_t size) {
  sizes[dim] = size;
  return sizes;
}

// Writes `part` into channels [g * size, (g + 1) * size) of dim `dim` of `whole`.
void put_channel_run(const Tensor& whole, int64_t dim, int64_t g, int64_t size, const Tensor& part) {
  NoGradGuard no_grad;
  whole.slice(dim, g * size, (g + 1) * size).copy_(part);
}

// A grouped convolution as `groups` dense ones: group g's result,
// dense_part(g), goes into run g of `size` channels of dim `dim` of `whole`.
template <class DensePart>
void per_group(const Tensor& whole, int64_t dim, int64_t groups, int64_t size, DensePart&& dense_part) {
  for (int64_t g = 0; g < groups; ++g) put_channel_run(whole, dim, g, size, dense_part(g));
}
}  // namespace

Tensor conv2d_grouped_forward(const Tensor& input_in, const Tensor& weight_in, const Tensor& bias_in,
                              const Conv2dParams& params) {
  const Tensor input = cpu_compute_input(input_in), weight = cpu_compute_input(weight_in);
  const Tensor bias = bias_in.defined() ? cpu_compute_input(bias_in) : Tensor();
  const int64_t groups = params.groups;
  const Size2 out_hw = conv2d_output_size({input.size(2), input.size(3)}, {weight.size(2), weight.size(3)}, params);
  Tensor out = Tensor::empty({input.size(0), weight.size(0), out_hw[0], out_hw[1]}, input.dtype());
  if (is_depthwise(input.sizes(), params)) {
    const Depthwise d = depthwise_problem(input.sizes(), weight.sizes(), params);
    visit_compute_dtype(input.dtype(), "conv2d", [&]<class T>() {
      depthwise_forward(input.data<T>(), weight.data<T>(), bias.defined() ? bias.data<T>() : nullptr, d, out.data<T>());
    });
  } else {
    const int64_t in_run = input.size(1) / groups, out_run = weight.size(0) / groups;
    per_group(out, 1, groups, out_run, [&](int64_t g) {
      return conv2d_forward(channel_run(input, 1, g, in_run), channel_run(weight, 0, g, out_run),
                            bias.defined() ? channel_run(bias, 0, g, out_run) : Tensor(), dense(params));
    });
  }
  return out.to(input_in.dtype());
}

Tensor conv2d_grouped_backward_input(const Tensor& grad_output_in, const Tensor& weight_in, const Shape& input_sizes,
                                     const Conv2dParams& params) {
  const Tensor grad_output = cpu_compute_input(grad_output_in), weight = cpu_compute_input(weight_in);
  Tensor grad_input = Tensor::empty(input_sizes, grad_output.dtype());
  if (is_depthwise(input_sizes, params)) {
    const Depthwise d = depthwise_problem(input_sizes, weight.sizes(), params);
    visit_compute_dtype(grad_output.dtype(), "conv2d backward", [&]<class T>() {
      depthwise_backward_input(grad_output.data<T>(), weight.data<T>(), d, grad_input.data<T>());
    });
  } else {
    const int64_t groups = params.groups, in_run = input_sizes[1] / groups, out_run = weight.size(0) / groups;
    const Shape run_sizes = channel_run_sizes(input_sizes, 1, in_run);
    per_group(grad_input, 1, groups, in_run, [&](int64_t g) {
      return conv2d_backward_input(channel_run(grad_output, 1, g, out_run), channel_run(weight, 0, g, out_run),
                                   run_sizes, dense(params));
    });
  }
  return grad_input.to(grad_output_in.dtype());
}

Tensor conv2d_grouped_backward_weight(const Tensor& grad_output_in, const Tensor& input_in, const Shape& weight_sizes,
                                      const Conv2dParams& params, const Tensor& out) {
  const Tensor grad_output = cpu_compute_input(grad_output_in), input = cpu_compute_input(input_in);
  Tensor grad_weight = Tensor::empty(weight_sizes, grad_output.dtype());
  if (is_depthwise(input.sizes(), params)) {
    const Depthwise d = depthwise_problem(input.sizes(), weight_sizes, params);
    visit_compute_dtype(grad_output.dtype(), "conv2d backward", [&]<class T>() {
      depthwise_backward_weight(grad_output.data<T>(), input.data<T>(), d, grad_weight.data<T>());
    });
  } else {
    const int64_t groups = params.groups, in_run = input.size(1) / groups, out_run = weight_sizes[0] / groups;
    const Shape run_sizes = channel_run_sizes(weight_sizes, 0, out_run);
    per_group(grad_weight, 0, groups, out_run, [&](int64_t g) {
      return conv2d_backward_weight(channel_run(grad_output, 1, g, out_run), channel_run(input, 1, g, in_run),
                                    run_sizes, dense(params));
    });
  }
  if (fits_result(out, weight_sizes, grad_output_in.dtype(), Device::cpu())) {
    Tensor written = out;
    return written.copy_(grad_weight);
  }
  return grad_weight.to(grad_output_in.dtype());
}

}  // namespace loom::ops::cpu
