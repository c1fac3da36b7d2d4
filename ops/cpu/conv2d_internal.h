// Internal declarations shared by conv2d's CPU files: conv2d.cpp (entry
// points and the GEMM-driving passes), conv2d_gather.cpp (im2col / col2im),
// conv2d_taps.cpp (the weight's tap subsets) and conv2d_classes.cpp (the
// small-plane position classes). Not part of loom's API.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include <loom/core/parallel.h>
#include <loom/ops/conv2d.h>
#include <loom/ops/cpu/scratch.h>

namespace loom::ops::cpu::conv2d_detail {

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

// For kernel offset `offset` (= k * dilation - padding) along an axis of
// `size` input elements: the output positions [first, last) whose input
// position o * stride + offset falls inside the input.
struct ValidRange {
  int64_t first, last;
};

// The kernel's taps (ki, kj) with the output ranges each one reads inside
// the image, computed once per call instead of once per channel. A tap that
// reads only padding for every output position is left out: its rows of the
// column matrix would be zeros, and its weights get a zero gradient. (ResNet's
// 3x3 convolutions on 1x1 planes keep only the centre tap: 1/9 of the work.)
// Where the output plane is small (ResNet's later stages: 1x1 to 4x4) the
// rows of the column matrix are a few elements long and a per-row loop costs
// more than the copy, so the taps also carry a table: for output position o,
// the input offset within the plane, or -1 in the padding.
struct Taps {
  struct Tap {
    int64_t index;  // ki * kW + kj
    int64_t offset_h, offset_w;
    ValidRange rows, cols;
    // For the masked-row im2col (rows up to 32 wide): -1 where column 0..31 of
    // an output row reads inside the image, else 0.
    int32_t columns_inside[32];
  };
  std::vector<Tap> taps;          // the taps that read the image, in kernel order
  int64_t kernel = 0;             // kH * kW
  std::vector<int32_t> sources;   // taps.size() * Ho * Wo when `tabled`
  bool tabled = false;
  int32_t columns_in_row[32];     // -1 for columns < Wo, else 0

  bool all_active() const { return static_cast<int64_t>(taps.size()) == kernel; }
  // Rows of the column matrix: C * active taps.
  int64_t col_rows(const Geometry& g) const { return g.channels * static_cast<int64_t>(taps.size()); }
};

constexpr int64_t kTabledPlane = 64;

Taps make_taps(const Geometry& g);

// Small planes under padding (ResNet-50's 3x3 convolutions on 2x2 and 4x4
// planes): a tap that reads the image at some output positions reads the
// padding at others, and the column matrix of the whole plane is mostly zeros
// (on a 2x2 plane, 36 (tap, position) pairs of which 16 read the image). The
// output positions are grouped by the set of taps that read inside the image
// there; each class is a GEMM over exactly its taps, so the arithmetic is the
// convolution's own multiply-adds. (A 2x2 plane has four classes of one
// position and four taps each: 2.25x fewer multiply-adds than one GEMM.)
struct PositionClass {
  std::vector<int64_t> taps;       // kernel indices ki * kW + kj of the taps that read the image, in kernel order
  std::vector<int32_t> positions;  // output positions oh * Wo + ow
  std::vector<int32_t> sources;    // (taps, positions): the input element read, an offset within the plane
  int64_t count() const { return static_cast<int64_t>(positions.size()); }
  int64_t col_rows(const Geometry& g) const { return g.channels * static_cast<int64_t>(taps.size()); }
};

// The position classes of g, or none when one GEMM over the plane is the
// better plan (larger planes, little padding, kernels of over 64 taps).
std::vector<PositionClass> position_classes(const Geometry& g, const Taps& taps);

// std::copy_n for the rows of one plane, which on ResNet-50's small planes
// are 1 to 16 elements: copy_n calls memmove for each, and with 1x1 planes
// (a batch's (N, C) transposed to (C, N) and back) those calls were a large
// part of a 1x1 convolution's time. The sizes of those planes are copied by
// moves of a size known at compile time instead. (Measured:
// benchmarks/results/2026-12-06-cpu-kernel-timings-from-comments.md.)
template <class T>
inline void copy_plane(const T* src, int64_t n, T* dst) {
  switch (n) {
    case 1: *dst = *src; return;
    case 4: std::memcpy(dst, src, 4 * sizeof(T)); return;
    case 16: std::memcpy(dst, src, 16 * sizeof(T)); return;
    default: std::copy_n(src, n, dst);
  }
}

// image (C, H, W) -> its block of columns in col (C*kH*kW rows, row stride
// `ld`, Ho*Wo columns), zeros where the window is in the padding.
template <class T>
void im2col(const T* image, const Geometry& g, const Taps& taps, T* col, int64_t ld);
// The adjoint of im2col: image (C, H, W) += fold of its block of col.
template <class T>
void col2im_add(const T* col, int64_t ld, const Geometry& g, const Taps& taps, T* image);

// Runs fn(i) for the images i of a group, `elements` elements copied for
// each, spread over the thread team outside a parallel region. A group that
// runs alone (BatchPlan::tasks == 1, the rule on ResNet-50's small planes at
// batch 32) splits its GEMM over the threads; the copies around the GEMM
// (im2col, zeroing the input gradient and col2im, gathering and scattering
// planes) would otherwise run on one thread while the others wait.
constexpr int64_t kImageGrainElements = int64_t{1} << 14;  // less is not worth a fork
template <class Fn>
void for_each_image(int64_t images, int64_t elements, Fn&& fn) {
  const int64_t grain = std::max<int64_t>(1, kImageGrainElements / std::max<int64_t>(elements, 1));
  parallel_for(0, images, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) fn(i);
  });
}

// How the batch is cut into GEMMs. A GEMM over one image has Ho*Wo columns:
// 196 for the MNIST ConvNet's second conv, but 1 to 64 in ResNet-50's later
// stages at 32x32 input, where the packing of the weight for every image and
// the ragged tiles cost more than the arithmetic. So `fold` images sit side by
// side in one column matrix (up to kTargetColumns columns). The groups of
// images are spread over the threads when there are enough of them; otherwise
// the groups run one after another and each GEMM splits its rows over the
// threads (the weight, the large operand there, is then packed once).
// With the weight packed once per call (PackedA), forward and the input
// gradient fold only up to kPackedTargetColumns: what a larger fold saves is
// then only ragged tiles, and the gathering of the images' planes and the
// scattering of the results cost more (1x1 convolutions on ResNet's 8x8 and
// 4x4 planes ran faster; measured in
// benchmarks/results/2026-12-06-cpu-kernel-timings-from-comments.md). The
// weight gradient keeps the larger fold: its GEMMs sum over the columns, and
// each GEMM reads and writes all of dW again.
struct BatchPlan {
  int64_t fold;    // images per GEMM
  int64_t groups;  // ceil(batch / fold)
  int64_t tasks;   // groups run on `tasks` threads; 1 = in the calling thread
};

constexpr int64_t kTargetColumns = 256;
constexpr int64_t kPackedTargetColumns = 64;
constexpr int64_t kMaxColumnElements = int64_t{1} << 22;  // 16 MiB of f32 per thread

BatchPlan plan_batch(const Geometry& g, int64_t target_columns = kTargetColumns);

// Runs fn(task, first_image, images) for every group, the groups of one task
// in order; tasks run in parallel when the plan says so.
template <class Fn>
void for_each_group(const Geometry& g, const BatchPlan& plan, Fn&& fn) {
  auto run_task = [&](int64_t task) {
    const int64_t first = plan.groups * task / plan.tasks, last = plan.groups * (task + 1) / plan.tasks;
    for (int64_t group = first; group < last; ++group) {
      const int64_t n0 = group * plan.fold;
      if (n0 < g.batch) fn(task, n0, std::min(plan.fold, g.batch - n0));
    }
  };
  if (plan.tasks == 1) {
    run_task(0);
    return;
  }
  parallel_for(0, plan.tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) run_task(task);
  });
}

// conv2d's per-thread scratch (ops/cpu/scratch.h), one buffer per slot.
// The weight-side slots are the calling thread's, filled before the groups
// run and read (or, for the per-task sums, written) by the whole team; the
// group slots are each task's own.
enum class Conv2dSlot {
  // Group slots.
  columns,  // a group's column matrix X (C*taps, G*Ho*Wo), or the input gradient's Wᵀ·dY before col2im
  planes,   // O planes of a group side by side (O, G*Ho*Wo): Y before the scatter, or dY gathered
  // Weight-side slots.
  tap_weight,                // the weight's columns of the active taps, or every position class's W_k
  weight_gradient,           // dW over the active taps before it is spread, or every task's class dW_k sums
  weight_gradient_partials,  // the other tasks' dW sums, added into task 0's in task order
  packed_weight,             // the weight packed once per call for every group's GEMM (PackedA)
  count
};
// What a pass holds at the same time: the forward and the input gradient
// (by classes too) tap_weight and packed_weight with each task's columns and
// planes; the weight gradient weight_gradient and weight_gradient_partials
// with each task's columns and planes.
static_assert(distinct_slots({Conv2dSlot::tap_weight, Conv2dSlot::packed_weight, Conv2dSlot::columns,
                              Conv2dSlot::planes}));
static_assert(distinct_slots({Conv2dSlot::weight_gradient, Conv2dSlot::weight_gradient_partials,
                              Conv2dSlot::columns, Conv2dSlot::planes}));
template <class T>
T* scratch(Conv2dSlot slot, int64_t elements) {
  return thread_scratch<T>(slot, elements);
}

#if defined(__x86_64__)
// Whether gather_tap_blocks and the blocked spread apply (conv2d_taps.cpp).
bool register_taps_apply(int64_t kernel, int64_t n, int64_t group);
// Several gathers of n taps each from the same weight, each block of rows
// loaded once for all of them (conv2d_taps.cpp).
__attribute__((target("avx512f"))) void gather_tap_blocks(const float* weight, int64_t begin, int64_t end,
                                                           int64_t kernel, const int64_t* const* indexes,
                                                           float* const* compacts, int64_t targets, int64_t n,
                                                           int64_t group, int64_t ld);
#endif

// The weight's columns of some taps, for `rows` rows of `kernel` taps
// (rows = O*C): compact[r * n + j] = weight[r * kernel + index[j]], j < n.
// With `group` > 0, each group of `group` rows (one output channel's C) is
// stored `ld` apart instead: compact[(r / group) * ld + (r % group) * n + j].
// Rows split over the threads (ResNet-50's layer4 weights are 9 MiB).
constexpr int64_t kTapRowGrain = 4096;
template <class T>
void gather_taps(const T* weight, int64_t rows, int64_t kernel, const int64_t* index, int64_t n, T* compact,
                 int64_t group = 0, int64_t ld = 0);

// A weight gradient over a subset of the taps: (rows, index->size()).
template <class T>
struct CompactGrad {
  const T* values;
  const std::vector<int64_t>* index;  // the taps, in kernel order
};

// The full weight gradient (O*C rows of `kernel` taps) from compact ones over
// tap subsets: zero where no subset has the tap, else the sum of theirs.
template <class T>
void spread_taps(const std::vector<CompactGrad<T>>& parts, int64_t rows, int64_t kernel, T* full);

// The position classes' passes (conv2d_classes.cpp).
template <class T>
void forward_by_class(const T* input, const T* weight, const T* bias, const Geometry& g,
                      const std::vector<PositionClass>& classes, T* output);
// With `add`, grad_input holds a gradient that this one is added to.
template <class T>
void backward_input_by_class(const T* grad_output, const T* weight, const Geometry& g,
                             const std::vector<PositionClass>& classes, T* grad_input, bool add);
template <class T>
void backward_weight_by_class(const T* grad_output, const T* input, const Geometry& g,
                              const std::vector<PositionClass>& classes, T* grad_weight);

}  // namespace loom::ops::cpu::conv2d_detail

namespace loom::ops::cpu {
// The grouped paths (params.groups > 1, ops/cpu/conv2d_grouped.cpp), with the
// entry points' contracts; they never add into a gradient sum and return fresh
// tensors, except the weight gradient, written into `out` when it fits.
Tensor conv2d_grouped_forward(const Tensor& input, const Tensor& weight, const Tensor& bias, const Conv2dParams& params);
Tensor conv2d_grouped_backward_input(const Tensor& grad_output, const Tensor& weight, const Shape& input_sizes,
                                     const Conv2dParams& params);
Tensor conv2d_grouped_backward_weight(const Tensor& grad_output, const Tensor& input, const Shape& weight_sizes,
                                      const Conv2dParams& params, const Tensor& out);
}  // namespace loom::ops::cpu
