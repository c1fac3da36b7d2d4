#include <loom/core/profiler.h>
#include <loom/ops/pooling.h>

#include <loom/ops/dispatch.h>

namespace loom {

namespace {
void check_nchw(const char* op, const Tensor& input) {
  LOOM_CHECK(input.defined() && input.dim() == 4, op, ": expected an input of shape (N, C, H, W), got ",
             input.defined() ? shape_str(input.sizes()) : "an undefined tensor");
  LOOM_CHECK(is_floating(input.dtype()), op, ": expected a floating-point input, got ", dtype_name(input.dtype()));
}

// A pooling window that fits: positive kernel and stride, padding at most half
// the kernel, a kernel no larger than the padded input.
void check_window(const char* op, const Tensor& input, Size2 kernel, Size2 stride, Size2 padding) {
  check_nchw(op, input);
  for (int i = 0; i < 2; ++i) {
    const char* axis = i == 0 ? "height" : "width";
    LOOM_CHECK(kernel[i] > 0 && stride[i] > 0, op, ": kernel (", kernel[i], ") and stride (", stride[i],
               ") must be positive along the ", axis);
    LOOM_CHECK(padding[i] >= 0 && 2 * padding[i] <= kernel[i], op, ": padding ", padding[i], " along the ", axis,
               " must be between 0 and half the kernel size ", kernel[i]);
    LOOM_CHECK(input.size(2 + i) + 2 * padding[i] >= kernel[i], op, ": the kernel ", kernel[i],
               " is larger than the padded input ", axis, " ", input.size(2 + i) + 2 * padding[i]);
  }
}
}  // namespace

Tensor max_pool2d(const Tensor& input, Size2 kernel) { return max_pool2d_with_indices(input, kernel, kernel).output; }

MaxPool2dResult max_pool2d_with_indices(const Tensor& input, Size2 kernel) {
  return max_pool2d_with_indices(input, kernel, kernel);
}

Tensor max_pool2d(const Tensor& input, Size2 kernel, Size2 stride, Size2 padding) {
  return max_pool2d_with_indices(input, kernel, stride, padding).output;
}

MaxPool2dResult max_pool2d_with_indices(const Tensor& input, Size2 kernel, Size2 stride, Size2 padding) {
  profiler::Scope profile("max_pool2d", input);
  check_window("max_pool2d", input, kernel, stride, padding);
  MaxPool2dResult result;
  {
    NoGradGuard no_grad;
    result.output = LOOM_DISPATCH(input, max_pool2d_forward, input, kernel, stride, padding, result.indices);
  }
  record("max_pool2d", {input}, {&result.output},
         [indices = result.indices, input_sizes = input.sizes(), dtype = input.dtype()](const TensorList& g,
                                                                                          const Node&) {
           const Tensor dy = g[0].to(dtype);
           return TensorList{LOOM_DISPATCH(dy, max_pool2d_backward, dy, indices, input_sizes)};
         });
  return result;
}

Tensor avg_pool2d(const Tensor& input, const AvgPool2dParams& params) {
  profiler::Scope profile("avg_pool2d", input);
  check_window("avg_pool2d", input, params.kernel, params.stride, params.padding);
  Tensor out;
  {
    NoGradGuard no_grad;
    out = LOOM_DISPATCH(input, avg_pool2d_forward, input, params);
  }
  record("avg_pool2d", {input}, {&out},
         [input_sizes = input.sizes(), dtype = input.dtype(), params](const TensorList& g, const Node&) {
           const Tensor dy = g[0].to(dtype);
           return TensorList{LOOM_DISPATCH(dy, avg_pool2d_backward, dy, input_sizes, params)};
         });
  return out;
}

Tensor adaptive_avg_pool2d(const Tensor& input, Size2 output_size) {
  profiler::Scope profile("adaptive_avg_pool2d", input);
  check_nchw("adaptive_avg_pool2d", input);
  LOOM_CHECK(output_size[0] > 0 && output_size[1] > 0, "adaptive_avg_pool2d: the output size (", output_size[0], ", ",
             output_size[1], ") must be positive");
  LOOM_CHECK(input.size(2) > 0 && input.size(3) > 0, "adaptive_avg_pool2d: empty input plane in ",
             shape_str(input.sizes()));
  Tensor out;
  {
    NoGradGuard no_grad;
    out = LOOM_DISPATCH(input, adaptive_avg_pool2d_forward, input, output_size);
  }
  record("adaptive_avg_pool2d", {input}, {&out},
         [input_sizes = input.sizes(), dtype = input.dtype()](const TensorList& g, const Node&) {
           const Tensor dy = g[0].to(dtype);
           return TensorList{LOOM_DISPATCH(dy, adaptive_avg_pool2d_backward, dy, input_sizes)};
         });
  return out;
}

}  // namespace loom
