// CPU kernels of conv2d: the entry points, the choice of kernel (Winograd,
// the direct kernels, position classes, im2col + GEMM) and the passes that
// drive the CPU GEMM (ops/cpu/gemm.h) over im2col's column matrices. The
// batch is split into groups of images; each task unfolds its images into its
// own column buffer and runs single-threaded GEMMs (gemm does not split again
// inside a parallel region). The column matrices, the tap subsets and the
// position classes are in conv2d_gather.cpp, conv2d_taps.cpp and
// conv2d_classes.cpp (shared declarations: conv2d_internal.h).
#include <loom/ops/conv2d.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include <loom/core/parallel.h>
#include <loom/core/profiler.h>
#include <loom/ops/cpu/conv2d_direct.h>
#include <loom/ops/cpu/conv2d_internal.h>
#include <loom/ops/cpu/gemm.h>
#include <loom/ops/cpu/winograd.h>
#include <loom/ops/dispatch.h>

namespace loom::ops::cpu {
// The kernels' shared parts (conv2d_internal.h).
using namespace conv2d_detail;

BatchPlan conv2d_detail::plan_batch(const Geometry& g, int64_t target_columns) {
  const int64_t batch = std::max<int64_t>(1, g.batch), plane = std::max<int64_t>(1, g.output_plane());
  // Whole images up to the target: a 196-column plane (the MNIST ConvNet) stays alone.
  int64_t fold = std::clamp<int64_t>(target_columns / plane, 1, batch);
  fold = std::max<int64_t>(1, std::min(fold, kMaxColumnElements / std::max<int64_t>(1, g.col_rows() * plane)));
  int64_t groups = (batch + fold - 1) / fold;
  const int64_t threads = in_parallel_region() ? 1 : get_num_threads();
  if (groups < threads) return {fold, groups, 1};
  // Even out the groups per thread: 3 groups on 2 threads become 4 smaller ones.
  const int64_t per_thread = (groups + threads - 1) / threads;
  fold = (batch + per_thread * threads - 1) / (per_thread * threads);
  groups = (batch + fold - 1) / fold;
  return {fold, groups, threads};
}

namespace {

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

// FLOPs of the GEMMs over `rows` column-matrix rows (C x taps) for the whole
// batch; with every tap counted, the direct convolution's (what the profiler
// reports for Winograd too, so GFLOP/s compare).
double conv_flops(const Geometry& g, int64_t rows) {
  return 2.0 * static_cast<double>(g.batch * g.out_channels * rows * g.output_plane());
}

// The direct kernels' description of g (conv2d_direct.h).
direct::Problem direct_problem(const Geometry& g) {
  return {g.batch, g.channels, g.height, g.width, g.out_channels, g.kernel_h, g.kernel_w, g.params.padding[0],
          g.params.padding[1], g.out_h, g.out_w};
}

// The Winograd description of g; kernel 0 (never used) unless the kernel is
// square with unit stride and dilation.
winograd::Problem winograd_problem(const Geometry& g) {
  const bool fits = g.kernel_h == g.kernel_w && g.params.stride == Size2{1, 1} && g.params.dilation == Size2{1, 1};
  return {g.batch, g.channels, g.height, g.width, g.out_channels, fits ? g.kernel_h : 0,
          g.params.padding[0], g.params.padding[1], g.out_h, g.out_w};
}

// Whether an f32 problem runs on the direct kernels (conv2d_direct.h): unit
// stride and dilation, C * kh * kw <= 32.
template <class T>
bool uses_direct(const Geometry& g) {
  if constexpr (std::is_same_v<T, float>) {
    if (g.params.stride != Size2{1, 1} || g.params.dilation != Size2{1, 1}) return false;
    return direct::applies(direct_problem(g));
  } else {
    return false;
  }
}

// The Winograd tile for f32 problems where conv2d uses it, else 0.
template <class T>
int winograd_tile(const Geometry& g) {
  if constexpr (std::is_same_v<T, float>) {
    return winograd::tile_for(winograd_problem(g));
  } else {
    return 0;
  }
}

// (G, rows, plane) <-> (rows, G * plane): the layout of G images' planes side
// by side, so that one GEMM covers them all.
template <class T>
void gather_planes(const T* batched, int64_t images, int64_t rows, int64_t plane, T* side_by_side) {
  const int64_t ld = images * plane;
  for_each_image(images, rows * plane, [&](int64_t n) {
    for (int64_t r = 0; r < rows; ++r) {
      copy_plane(batched + (n * rows + r) * plane, plane, side_by_side + r * ld + n * plane);
    }
  });
}
// With `add`, side_by_side is added into `batched` instead of copied.
template <class T>
void scatter_planes(const T* side_by_side, int64_t images, int64_t rows, int64_t plane, T* batched, bool add = false) {
  const int64_t ld = images * plane;
  for_each_image(images, rows * plane, [&](int64_t n) {
    for (int64_t r = 0; r < rows; ++r) {
      const T* src = side_by_side + r * ld + n * plane;
      T* dst = batched + (n * rows + r) * plane;
      if (add) {
        for (int64_t i = 0; i < plane; ++i) dst[i] += src[i];
      } else {
        copy_plane(src, plane, dst);
      }
    }
  });
}

// The kernel indices of the active taps.
std::vector<int64_t> active_indices(const Taps& taps) {
  std::vector<int64_t> index;
  for (const Taps::Tap& tap : taps.taps) index.push_back(tap.index);
  return index;
}

// The weight's columns for the active taps: (O, C*kH*kW) -> (O, C*active).
template <class T>
const T* active_weight(const T* weight, const Geometry& g, const Taps& taps) {
  if (taps.all_active()) return weight;
  const std::vector<int64_t> index = active_indices(taps);
  const int64_t active = static_cast<int64_t>(index.size());
  T* compact = scratch<T>(Conv2dSlot::tap_weight, g.out_channels * g.channels * active);
  gather_taps(weight, g.out_channels * g.channels, taps.kernel, index.data(), active, compact);
  return compact;
}

// A column matrix and its row stride.
template <class T>
struct Columns {
  const T* data;
  int64_t ld;
};

// Storage for the weight (m x k as the GEMMs read it), packed once for the
// groups' GEMMs (PackedA) when the batch falls into several; none when one
// GEMM covers the whole batch. That GEMM packs the weight block by block as
// it goes, in its cache, where packing it beforehand would be one more pass
// through memory over the weight: ResNet-50's layer3-4 convolutions on 1x1 and
// 2x2 planes ran faster so. (Measured:
// benchmarks/results/2026-12-06-cpu-kernel-timings-from-comments.md.)
template <class T>
T* weight_packing(const Geometry& g, int64_t m, int64_t k) {
  if (plan_batch(g, kPackedTargetColumns).groups == 1) return nullptr;
  return scratch<T>(Conv2dSlot::packed_weight, PackedA<T>::storage_size(m, k));
}

// The im2col path's weight as its GEMMs read it: the active taps only,
// (O, C*active), as op(W) = W (forward) or Wᵀ (backward_input), packed when
// weight_packing says so; and the columns each batch group aims at. Counts
// the convolution's flops.
template <class T>
struct ColumnWeight {
  int64_t k;  // C*active, the rows of a column matrix
  PackedA<T> packed;
  int64_t target_columns;
};
template <class T>
ColumnWeight<T> column_weight(const T* weight, const Geometry& g, const Taps& taps, Transpose transpose) {
  const int64_t k = taps.col_rows(g);
  weight = active_weight(weight, g, taps);  // (O, C*active)
  profiler::add_flops(conv_flops(g, k));
  const bool transposed = transpose == Transpose::yes;  // op(W): (m, depth)
  const int64_t m = transposed ? k : g.out_channels, depth = transposed ? g.out_channels : k;
  const PackedA<T> packed(transpose, m, depth, weight, k, weight_packing<T>(g, m, depth));
  return {k, packed, packed.packed != nullptr ? kPackedTargetColumns : kTargetColumns};
}

// The column matrix of images n0 .. n0+images (C*active, images*Ho*Wo):
// im2col into the columns slot, or, for one image under a pointwise kernel, the
// image itself. Built here, its rows are gemm_b_stride apart, so that the
// forward GEMM reads it where it lies instead of packing a copy (faster on
// ResNet-50's stride-2 convolutions in one set of runs, within noise in a later
// one; measured in
// benchmarks/results/2026-12-06-cpu-kernel-timings-from-comments.md).
template <class T>
Columns<T> group_columns(const T* input, const Geometry& g, const Taps& taps, int64_t n0, int64_t images) {
  const int64_t image_size = g.channels * g.input_plane(), plane = g.output_plane(), columns = images * plane;
  if (images == 1 && g.pointwise()) return {input + n0 * image_size, plane};
  const int64_t ld = gemm_b_stride(columns);
  T* buffer = scratch<T>(Conv2dSlot::columns, taps.col_rows(g) * ld);
  for_each_image(images, taps.col_rows(g) * plane,
                 [&](int64_t i) { im2col(input + (n0 + i) * image_size, g, taps, buffer + i * plane, ld); });
  return {buffer, ld};
}

// dY of images n0 .. n0+images as (O, images*Ho*Wo): gathered into the planes
// slot, or in place for one image.
template <class T>
const T* group_grad_output(const T* grad_output, const Geometry& g, int64_t n0, int64_t images) {
  const int64_t plane = g.output_plane();
  const T* dy = grad_output + n0 * g.out_channels * plane;
  if (images == 1) return dy;
  T* buffer = scratch<T>(Conv2dSlot::planes, g.out_channels * images * plane);
  gather_planes(dy, images, g.out_channels, plane, buffer);
  return buffer;
}

template <class T>
void forward(const T* input, const T* weight, const T* bias, const Geometry& g, T* output) {
  const int64_t plane = g.output_plane(), output_size = g.out_channels * plane;
  if (const int m = winograd_tile<T>(g)) {
    profiler::add_flops(conv_flops(g, g.col_rows()));
    if constexpr (std::is_same_v<T, float>) winograd::forward(input, weight, bias, winograd_problem(g), m, output);
    return;
  }
  if (uses_direct<T>(g)) {
    profiler::add_flops(conv_flops(g, g.col_rows()));
    if constexpr (std::is_same_v<T, float>) direct::forward(input, weight, bias, direct_problem(g), output);
    return;
  }
  const Taps taps = make_taps(g);
  if (const std::vector<PositionClass> classes = position_classes(g, taps); !classes.empty()) {
    return forward_by_class(input, weight, bias, g, classes, output);
  }
  const ColumnWeight<T> w = column_weight(weight, g, taps, Transpose::no);
  for_each_group(g, plan_batch(g, w.target_columns), [&](int64_t, int64_t n0, int64_t images) {
    const int64_t columns = images * plane;
    const Columns<T> col = group_columns(input, g, taps, n0, images);
    // One image writes straight into the output; several go through (O, G*Ho*Wo).
    T* y = images == 1 ? output + n0 * output_size : scratch<T>(Conv2dSlot::planes, g.out_channels * columns);
    if (bias != nullptr) {
      for (int64_t o = 0; o < g.out_channels; ++o) std::fill(y + o * columns, y + (o + 1) * columns, bias[o]);
    }
    gemm(w.packed, Transpose::no, columns, T(1), col.data, col.ld, bias != nullptr ? T(1) : T(0), y, columns);
    if (images > 1) scatter_planes(y, images, g.out_channels, plane, output + n0 * output_size);
  });
}

// With `add`, grad_input holds a gradient that this one is added to (never
// under Winograd: the caller checks winograd_tile).
template <class T>
void backward_input(const T* grad_output, const T* weight, const Geometry& g, T* grad_input, bool add) {
  const int64_t plane = g.output_plane(), image_size = g.channels * g.input_plane();
  if (const int m = winograd_tile<T>(g)) {
    LOOM_CHECK(!add, "conv2d backward: Winograd does not add into an input gradient");
    profiler::add_flops(conv_flops(g, g.col_rows()));
    if constexpr (std::is_same_v<T, float>) winograd::backward_input(grad_output, weight, winograd_problem(g), m, grad_input);
    return;
  }
  const Taps taps = make_taps(g);
  if (const std::vector<PositionClass> classes = position_classes(g, taps); !classes.empty()) {
    return backward_input_by_class(grad_output, weight, g, classes, grad_input, add);
  }
  const ColumnWeight<T> w = column_weight(weight, g, taps, Transpose::yes);  // Wᵀ
  const int64_t k = w.k;
  for_each_group(g, plan_batch(g, w.target_columns), [&](int64_t, int64_t n0, int64_t images) {
    const int64_t columns = images * plane;
    const T* dy = group_grad_output(grad_output, g, n0, images);  // (O, G*Ho*Wo)
    T* dx = grad_input + n0 * image_size;
    // col = Wᵀ · dY: (C*active, G*Ho*Wo); one pointwise image is its own
    // gradient (added to dx by the GEMM's beta).
    const bool direct = images == 1 && g.pointwise();
    T* col = direct ? dx : scratch<T>(Conv2dSlot::columns, k * columns);
    gemm(w.packed, Transpose::no, columns, T(1), dy, columns, direct && add ? T(1) : T(0), col, columns);
    if (direct) return;
    if (g.pointwise()) return scatter_planes(col, images, g.channels, plane, dx, add);  // col2im is a copy
    if (!add) {
      for_each_image(images, image_size, [&](int64_t i) { std::fill_n(dx + i * image_size, image_size, T(0)); });
    }
    for_each_image(images, k * plane,
                   [&](int64_t i) { col2im_add(col + i * plane, columns, g, taps, dx + i * image_size); });
  });
}

template <class T>
void backward_weight(const T* grad_output, const T* input, const Geometry& g, T* full_grad_weight) {
  const int64_t plane = g.output_plane();
  if (const int m = winograd_tile<T>(g)) {
    profiler::add_flops(conv_flops(g, g.col_rows()));
    if constexpr (std::is_same_v<T, float>) {
      winograd::backward_weight(grad_output, input, winograd_problem(g), m, full_grad_weight);
    }
    return;
  }
  if (uses_direct<T>(g)) {
    profiler::add_flops(conv_flops(g, g.col_rows()));
    if constexpr (std::is_same_v<T, float>) {
      direct::backward_weight(grad_output, input, direct_problem(g), full_grad_weight);
    }
    return;
  }
  const Taps taps = make_taps(g);
  if (const std::vector<PositionClass> classes = position_classes(g, taps); !classes.empty()) {
    return backward_weight_by_class(grad_output, input, g, classes, full_grad_weight);
  }
  const BatchPlan plan = plan_batch(g);
  const int64_t k = taps.col_rows(g);
  // With taps left out, the GEMMs produce (O, C*active), spread out at the end.
  T* grad_weight = taps.all_active() ? full_grad_weight : scratch<T>(Conv2dSlot::weight_gradient, g.out_channels * k);
  profiler::add_flops(conv_flops(g, k));
  // Task 0 accumulates into grad_weight itself, the others into partials that
  // are added afterwards in task order (the same sum whatever the timing).
  const int64_t size = g.out_channels * k;
  T* partials = scratch<T>(Conv2dSlot::weight_gradient_partials, (plan.tasks - 1) * size);
  std::vector<char> started(static_cast<size_t>(plan.tasks), 0);
  for_each_group(g, plan, [&](int64_t task, int64_t n0, int64_t images) {
    T* accumulator = task == 0 ? grad_weight : partials + (task - 1) * size;
    const int64_t columns = images * plane;
    const Columns<T> col = group_columns(input, g, taps, n0, images);
    const T* dy = group_grad_output(grad_output, g, n0, images);
    // dW (+)= dY · colᵀ: (O, C*active)
    gemm(Transpose::no, Transpose::yes, g.out_channels, k, columns, T(1), dy, columns, col.data, col.ld,
         started[task] ? T(1) : T(0), accumulator, k);
    started[task] = 1;
  });
  sum_task_partials(grad_weight, partials, started, size);
  if (taps.all_active()) return;
  const std::vector<int64_t> index = active_indices(taps);
  spread_taps<T>({{grad_weight, &index}}, g.out_channels * g.channels, taps.kernel, full_grad_weight);
}

}  // namespace

Tensor conv2d_forward(const Tensor& input_in, const Tensor& weight_in, const Tensor& bias_in,
                      const Conv2dParams& params) {
  if (params.groups != 1) return conv2d_grouped_forward(input_in, weight_in, bias_in, params);
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
                             const Conv2dParams& params, const Tensor& grad_input_sum) {
  if (params.groups != 1) return conv2d_grouped_backward_input(grad_output_in, weight_in, input_sizes, params);
  const Tensor grad_output = cpu_compute_input(grad_output_in), weight = cpu_compute_input(weight_in);
  const Geometry g = make_geometry(input_sizes, weight.sizes(), params);
  // Added into the sum where it is in the compute dtype and conv2d is not
  // Winograd (whose planes are written, not added to).
  const DType dtype = grad_output.dtype();
  const bool add = grad_output_in.dtype() == dtype && fits_result(grad_input_sum, input_sizes, dtype, Device::cpu()) &&
                   !(dtype == DType::f32 && winograd_tile<float>(g) != 0);
  Tensor grad_input = add ? grad_input_sum : Tensor::empty(input_sizes, dtype);
  visit_compute_dtype(dtype, "conv2d backward", [&]<class T>() {
    backward_input(grad_output.data<T>(), weight.data<T>(), g, grad_input.data<T>(), add);
  });
  return grad_input.to(grad_output_in.dtype());
}

Tensor conv2d_backward_weight(const Tensor& grad_output_in, const Tensor& input_in, const Shape& weight_sizes,
                              const Conv2dParams& params, const Tensor& out) {
  if (params.groups != 1) return conv2d_grouped_backward_weight(grad_output_in, input_in, weight_sizes, params, out);
  const Tensor grad_output = cpu_compute_input(grad_output_in), input = cpu_compute_input(input_in);
  const Geometry g = make_geometry(input.sizes(), weight_sizes, params);
  const bool into_out = fits_result(out, weight_sizes, grad_output_in.dtype(), Device::cpu());
  Tensor grad_weight =
      into_out && out.dtype() == grad_output.dtype() ? out : Tensor::empty(weight_sizes, grad_output.dtype());
  visit_compute_dtype(grad_output.dtype(), "conv2d backward", [&]<class T>() {
    backward_weight(grad_output.data<T>(), input.data<T>(), g, grad_weight.data<T>());
  });
  if (into_out && !grad_weight.is_same(out)) {  // computed in f32 for an f16 / bf16 `out`
    Tensor written = out;
    return written.copy_(grad_weight);
  }
  return grad_weight.to(grad_output_in.dtype());
}

std::pair<Tensor, Tensor> conv2d_backward_input_weight(const Tensor& grad_output, const Tensor& input,
                                                       const Tensor& weight, const Conv2dParams& params,
                                                       const Tensor& weight_out, const Tensor& grad_input_sum) {
  if (params.groups != 1) {
    return {conv2d_grouped_backward_input(grad_output, weight, input.sizes(), params),
            conv2d_grouped_backward_weight(grad_output, input, weight.sizes(), params, weight_out)};
  }
  const Geometry g = make_geometry(input.sizes(), weight.sizes(), params);
  const bool f32 = grad_output.dtype() == DType::f32 && input.dtype() == DType::f32 && weight.dtype() == DType::f32;
  const int m = f32 ? winograd_tile<float>(g) : 0;
  if (m == 0) {
    return {conv2d_backward_input(grad_output, weight, input.sizes(), params, grad_input_sum),
            conv2d_backward_weight(grad_output, input, weight.sizes(), params, weight_out)};
  }
  const Tensor dy = cpu_compute_input(grad_output), x = cpu_compute_input(input), w = cpu_compute_input(weight);
  Tensor dx = Tensor::empty(input.sizes(), DType::f32);
  Tensor dw = fits_result(weight_out, weight.sizes(), DType::f32, Device::cpu()) ? weight_out
                                                                                 : Tensor::empty(weight.sizes(), DType::f32);
  // Counted as the two direct convolutions' FLOPs, as when they run apart.
  profiler::add_flops(2 * conv_flops(g, g.col_rows()));
  winograd::backward(dy.data<float>(), x.data<float>(), w.data<float>(), winograd_problem(g), m, dx.data<float>(),
                     dw.data<float>());
  return {dx, dw};
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

