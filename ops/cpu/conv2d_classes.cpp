// conv2d on small padded planes: output positions grouped by the taps that
// read the image there (position classes), one GEMM per class.
#include <loom/ops/cpu/conv2d_internal.h>

#include <loom/core/profiler.h>
#include <loom/ops/cpu/gemm.h>

namespace loom::ops::cpu::conv2d_detail {
namespace {

// Split when one GEMM over the plane would do this many times the true
// multiply-adds: 2x2 planes (2.25) under a 3x3 kernel with padding 1, not 4x4
// (1.44) or 8x8 (1.19), where the smaller GEMMs (a 4x4 plane's nine classes
// have 1 to 4 positions per image) cost more than the zeros they save:
// ResNet-50 at 32x32 ran faster with 4x4 planes in one GEMM and with 2x2 planes
// split. (Measured:
// benchmarks/results/2026-12-06-cpu-kernel-timings-from-comments.md.)
constexpr double kClassSplitWaste = 1.6;

}  // namespace

// The position classes of g, or none when one GEMM over the plane is the
// better plan (larger planes, little padding, kernels of over 64 taps).
std::vector<PositionClass> position_classes(const Geometry& g, const Taps& taps) {
  const int64_t plane = g.output_plane(), active = static_cast<int64_t>(taps.taps.size());
  if (!taps.tabled || taps.kernel > 64 || active == 0) return {};
  std::vector<uint64_t> masks(static_cast<size_t>(plane), 0);
  int64_t reads = 0;  // (tap, position) pairs inside the image
  for (int64_t t = 0; t < active; ++t) {
    for (int64_t o = 0; o < plane; ++o) {
      if (taps.sources[t * plane + o] < 0) continue;
      masks[o] |= uint64_t{1} << taps.taps[t].index;
      ++reads;
    }
  }
  if (static_cast<double>(active * plane) < kClassSplitWaste * static_cast<double>(reads)) return {};
  std::vector<PositionClass> classes;
  std::vector<uint64_t> class_masks;
  for (int64_t o = 0; o < plane; ++o) {
    const size_t k = static_cast<size_t>(std::find(class_masks.begin(), class_masks.end(), masks[o]) - class_masks.begin());
    if (k == class_masks.size()) {
      class_masks.push_back(masks[o]);
      classes.emplace_back();
    }
    classes[k].positions.push_back(static_cast<int32_t>(o));
  }
  for (size_t k = 0; k < classes.size(); ++k) {
    PositionClass& pc = classes[k];
    for (int64_t t = 0; t < active; ++t) {
      if ((class_masks[k] >> taps.taps[t].index & 1) == 0) continue;
      pc.taps.push_back(taps.taps[t].index);
      for (int32_t o : pc.positions) pc.sources.push_back(taps.sources[t * plane + o]);
    }
  }
  return classes;
}

namespace {

// The position classes' GEMMs. Class k of images n0 .. n0+images has
// columns (image, position) = images * count, rows (channel, tap) = C * taps:
//   forward      Y_k (O, cols)   = W_k (O, C*taps) · X_k (C*taps, cols)
//   input grad   D_k (C*taps, cols) = W_kᵀ · dY_k,  folded back into dX
//   weight grad  dW_k (O, C*taps) += dY_k · X_kᵀ,  spread into dW at the end
// where W_k is the weight's columns of class k's taps.

// W_k for every class, one after another in the tap_weight slot, its rows
// `ld` apart (the weight itself, rows C*kernel apart, for a class with every
// tap of the kernel). The rows are padded as gemm_b_stride pads B's: the
// input gradient reads W_kᵀ eight floats from each of its O rows in turn
// (packing it, or in place), and rows a large power of two apart (C*taps =
// 1024 for ResNet-50's layer3) fall into a few sets of L1 and evict each
// other.
template <class T>
struct ClassWeight {
  const T* data;
  int64_t ld;
};

template <class T>
std::vector<ClassWeight<T>> class_weights(const T* weight, const Geometry& g,
                                          const std::vector<PositionClass>& classes) {
  const int64_t kernel = g.kernel_h * g.kernel_w;
  int64_t total = 0;
  for (const PositionClass& pc : classes) total += g.out_channels * gemm_b_stride(pc.col_rows(g));
  T* compact = scratch<T>(Conv2dSlot::tap_weight, total);
  std::vector<ClassWeight<T>> out;
  std::vector<const PositionClass*> gathered;
  std::vector<T*> targets;
  for (const PositionClass& pc : classes) {
    if (static_cast<int64_t>(pc.taps.size()) == kernel) {
      out.push_back({weight, pc.col_rows(g)});
      continue;
    }
    const int64_t ld = gemm_b_stride(pc.col_rows(g));
    out.push_back({compact, ld});
    gathered.push_back(&pc);
    targets.push_back(compact);
    compact += g.out_channels * ld;
  }
  const int64_t rows = g.out_channels * g.channels;
#if defined(__x86_64__)
  // Classes with as many taps each (the four corners of a 2x2 plane): one pass over the weight for all.
  if constexpr (std::is_same_v<T, float>) {
    const int64_t n = gathered.empty() ? 0 : static_cast<int64_t>(gathered[0]->taps.size());
    const bool same_n = std::all_of(gathered.begin(), gathered.end(), [&](const PositionClass* pc) {
      return static_cast<int64_t>(pc->taps.size()) == n;
    });
    if (gathered.size() > 1 && gathered.size() <= 16 && same_n && register_taps_apply(kernel, n, g.channels)) {
      std::vector<const int64_t*> indexes;
      for (const PositionClass* pc : gathered) indexes.push_back(pc->taps.data());
      const int64_t ld = gemm_b_stride(gathered[0]->col_rows(g));
      parallel_for(0, rows, kTapRowGrain, [&](int64_t begin, int64_t end) {
        gather_tap_blocks(weight, begin, end, kernel, indexes.data(), targets.data(),
                          static_cast<int64_t>(targets.size()), n, g.channels, ld);
      });
      return out;
    }
  }
#endif
  for (size_t k = 0; k < gathered.size(); ++k) {
    const PositionClass& pc = *gathered[k];
    gather_taps(weight, rows, kernel, pc.taps.data(), static_cast<int64_t>(pc.taps.size()), targets[k], g.channels,
                gemm_b_stride(pc.col_rows(g)));
  }
  return out;
}

// X_k of `images` images from `input` (their first): (C*taps, images*count).
template <class T>
void class_im2col(const T* input, int64_t images, const Geometry& g, const PositionClass& pc, T* col) {
  const int64_t count = pc.count(), taps = static_cast<int64_t>(pc.taps.size()), columns = images * count;
  for_each_image(images, pc.col_rows(g) * count, [&](int64_t i) {
    for (int64_t c = 0; c < g.channels; ++c) {
      const T* plane = input + (i * g.channels + c) * g.input_plane();
      for (int64_t j = 0; j < taps; ++j) {
        const int32_t* source = pc.sources.data() + j * count;
        T* out = col + (c * taps + j) * columns + i * count;
        for (int64_t p = 0; p < count; ++p) out[p] = plane[source[p]];
      }
    }
  });
}

// The adjoint of class_im2col: dx (images, C, H, W) += fold of col.
template <class T>
void class_col2im_add(const T* col, int64_t images, const Geometry& g, const PositionClass& pc, T* dx) {
  const int64_t count = pc.count(), taps = static_cast<int64_t>(pc.taps.size()), columns = images * count;
  for_each_image(images, pc.col_rows(g) * count, [&](int64_t i) {
    for (int64_t c = 0; c < g.channels; ++c) {
      T* plane = dx + (i * g.channels + c) * g.input_plane();
      for (int64_t j = 0; j < taps; ++j) {
        const int32_t* source = pc.sources.data() + j * count;
        const T* in = col + (c * taps + j) * columns + i * count;
        for (int64_t p = 0; p < count; ++p) plane[source[p]] += in[p];
      }
    }
  });
}

// dY_k: the class's positions of `images` output images, (O, images*count).
template <class T>
void class_gather(const T* images_out, int64_t images, const Geometry& g, const PositionClass& pc, T* out) {
  const int64_t count = pc.count(), columns = images * count, plane = g.output_plane();
  for_each_image(images, g.out_channels * count, [&](int64_t i) {
    for (int64_t o = 0; o < g.out_channels; ++o) {
      const T* src = images_out + (i * g.out_channels + o) * plane;
      T* dst = out + o * columns + i * count;
      for (int64_t p = 0; p < count; ++p) dst[p] = src[pc.positions[p]];
    }
  });
}

// The GEMMs' FLOPs over the batch: the convolution's true multiply-adds.
double class_flops(const Geometry& g, const std::vector<PositionClass>& classes) {
  int64_t reads = 0;
  for (const PositionClass& pc : classes) reads += pc.col_rows(g) * pc.count();
  return 2.0 * static_cast<double>(g.batch * g.out_channels * reads);
}

}  // namespace

template <class T>
void forward_by_class(const T* input, const T* weight, const T* bias, const Geometry& g,
                      const std::vector<PositionClass>& classes, T* output) {
  const int64_t plane = g.output_plane(), image_in = g.channels * g.input_plane(), image_out = g.out_channels * plane;
  const std::vector<ClassWeight<T>> weights = class_weights(weight, g, classes);
  profiler::add_flops(class_flops(g, classes));
  for_each_group(g, plan_batch(g), [&](int64_t, int64_t n0, int64_t images) {
    T* out = output + n0 * image_out;
    for (size_t k = 0; k < classes.size(); ++k) {
      const PositionClass& pc = classes[k];
      const int64_t count = pc.count(), columns = images * count, rows = pc.col_rows(g);
      T* y = scratch<T>(Conv2dSlot::planes, g.out_channels * columns);
      if (rows > 0) {
        T* col = scratch<T>(Conv2dSlot::columns, rows * columns);
        class_im2col(input + n0 * image_in, images, g, pc, col);
        gemm(Transpose::no, Transpose::no, g.out_channels, columns, rows, T(1), weights[k].data, weights[k].ld, col,
             columns, T(0), y, columns);
      } else {
        std::fill(y, y + g.out_channels * columns, T(0));  // every tap in the padding
      }
      for_each_image(images, g.out_channels * count, [&](int64_t i) {
        for (int64_t o = 0; o < g.out_channels; ++o) {
          const T b = bias != nullptr ? bias[o] : T(0);
          const T* src = y + o * columns + i * count;
          T* dst = out + i * image_out + o * plane;
          for (int64_t p = 0; p < count; ++p) dst[pc.positions[p]] = src[p] + b;
        }
      });
    }
  });
}

// With `add`, grad_input holds a gradient that this one is added to.
template <class T>
void backward_input_by_class(const T* grad_output, const T* weight, const Geometry& g,
                             const std::vector<PositionClass>& classes, T* grad_input, bool add) {
  const int64_t image_in = g.channels * g.input_plane(), image_out = g.out_channels * g.output_plane();
  const std::vector<ClassWeight<T>> weights = class_weights(weight, g, classes);
  profiler::add_flops(class_flops(g, classes));
  for_each_group(g, plan_batch(g), [&](int64_t, int64_t n0, int64_t images) {
    T* dx = grad_input + n0 * image_in;
    if (!add) for_each_image(images, image_in, [&](int64_t i) { std::fill_n(dx + i * image_in, image_in, T(0)); });
    for (size_t k = 0; k < classes.size(); ++k) {
      const PositionClass& pc = classes[k];
      const int64_t columns = images * pc.count(), rows = pc.col_rows(g);
      if (rows == 0) continue;
      T* dy = scratch<T>(Conv2dSlot::planes, g.out_channels * columns);
      class_gather(grad_output + n0 * image_out, images, g, pc, dy);
      T* col = scratch<T>(Conv2dSlot::columns, rows * columns);
      gemm(Transpose::yes, Transpose::no, rows, columns, g.out_channels, T(1), weights[k].data, weights[k].ld, dy,
           columns, T(0), col, columns);
      class_col2im_add(col, images, g, pc, dx);
    }
  });
}

template <class T>
void backward_weight_by_class(const T* grad_output, const T* input, const Geometry& g,
                              const std::vector<PositionClass>& classes, T* grad_weight) {
  const int64_t image_in = g.channels * g.input_plane(), image_out = g.out_channels * g.output_plane();
  const int64_t kernel = g.kernel_h * g.kernel_w;
  const BatchPlan plan = plan_batch(g);
  // Each task accumulates every class's dW_k, one after another; task 0's are
  // then the sum of all (added in task order: the same sum whatever the timing).
  std::vector<int64_t> offsets;
  int64_t size = 0;
  for (const PositionClass& pc : classes) {
    offsets.push_back(size);
    size += g.out_channels * pc.col_rows(g);
  }
  T* accumulators = scratch<T>(Conv2dSlot::weight_gradient, plan.tasks * size);
  // A task's first GEMM of a class overwrites its accumulator (beta 0); the
  // accumulators of a task without images are zeroed afterwards.
  std::vector<char> started(static_cast<size_t>(plan.tasks), 0);
  profiler::add_flops(class_flops(g, classes));
  for_each_group(g, plan, [&](int64_t task, int64_t n0, int64_t images) {
    for (size_t k = 0; k < classes.size(); ++k) {
      const PositionClass& pc = classes[k];
      const int64_t columns = images * pc.count(), rows = pc.col_rows(g);
      if (rows == 0) continue;
      T* col = scratch<T>(Conv2dSlot::columns, rows * columns);
      class_im2col(input + n0 * image_in, images, g, pc, col);
      T* dy = scratch<T>(Conv2dSlot::planes, g.out_channels * columns);
      class_gather(grad_output + n0 * image_out, images, g, pc, dy);
      gemm(Transpose::no, Transpose::yes, g.out_channels, rows, columns, T(1), dy, columns, col, columns,
           started[task] ? T(1) : T(0), accumulators + task * size + offsets[k], rows);
    }
    started[task] = 1;
  });
  sum_task_partials(accumulators, accumulators + size, started, size);
  std::vector<CompactGrad<T>> parts;
  for (size_t k = 0; k < classes.size(); ++k) parts.push_back({accumulators + offsets[k], &classes[k].taps});
  spread_taps(parts, g.out_channels * g.channels, kernel, grad_weight);
}

template void forward_by_class<float>(const float*, const float*, const float*, const Geometry&,
                                      const std::vector<PositionClass>&, float*);
template void forward_by_class<double>(const double*, const double*, const double*, const Geometry&,
                                       const std::vector<PositionClass>&, double*);
template void backward_input_by_class<float>(const float*, const float*, const Geometry&,
                                             const std::vector<PositionClass>&, float*, bool);
template void backward_input_by_class<double>(const double*, const double*, const Geometry&,
                                              const std::vector<PositionClass>&, double*, bool);
template void backward_weight_by_class<float>(const float*, const float*, const Geometry&,
                                              const std::vector<PositionClass>&, float*);
template void backward_weight_by_class<double>(const double*, const double*, const Geometry&,
                                               const std::vector<PositionClass>&, double*);

}  // namespace loom::ops::cpu::conv2d_detail
