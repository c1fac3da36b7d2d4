// Internal declarations shared by batch norm's CPU files: batch_norm.cpp
// (statistics and the forward passes, fused ones included) and
// batch_norm_backward.cpp (the backward reductions and input gradients).
// Not part of loom's API. Both files are built with -ffp-contract=off.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include <loom/core/parallel.h>
#include <loom/core/tensor.h>
#include <loom/ops/batch_norm.h>
#include <loom/ops/batch_norm_math.h>
#include <loom/ops/cpu/scratch.h>

// The intrinsics of both files' AVX2 row kernels.
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace loom::ops::cpu::batch_norm_detail {
namespace math = batch_norm_math;
using math::ChannelGeometry;
using math::channel_geometry;
constexpr int64_t kRowGrain = 1 << 14;  // elements per task in the elementwise passes
constexpr int kLanes = 8;               // independent accumulators in the reductions
constexpr int64_t kChannelBlock = 64;

// dy, or 0 where the fused ReLU's output x * a + b (computed exactly as the
// forward computed it) is not positive. `Masked` is a template argument so the
// unmasked loops stay free of the test.
// x is read only when Masked: without a fused ReLU the caller may pass no input.
template <bool Masked, class T>
T masked(T dy, const T* x, int64_t i, T a, T b) {
  if constexpr (Masked) {
    return math::relu_masked(dy, x[i], a, b);
  } else {
    return dy;
  }
}

// A (C) tensor as f64 host values; `fallback` everywhere when undefined.
inline std::vector<double> per_channel(const Tensor& t, int64_t channels, double fallback) {
  if (!t.defined()) return std::vector<double>(static_cast<size_t>(channels), fallback);
  return t.to_vector<double>();
}

// The elements per channel the kernels divide by, checked (a total on the
// device is in host memory here).
inline double element_count(const char* op, const StatisticsCount& count) {
  check_statistics_count(op, count, Device::cpu());
  return count.total.defined() ? count.total.data<double>()[0] : static_cast<double>(count.known);
}

inline std::vector<double> inverse_std(const std::vector<double>& var, double eps) {
  std::vector<double> out(var.size());
  for (size_t c = 0; c < var.size(); ++c) out[c] = math::inverse_std(var[c], eps);
  return out;
}

// The forward as y = x * scale + shift per channel (math::affine). Backward
// recomputes the fused ReLU's mask from these.
struct Affine {
  std::vector<double> scale, shift;
};
inline Affine affine_coefficients(const Tensor& mean, const Tensor& var, const Tensor& weight, const Tensor& bias,
                                  double eps, int64_t channels) {
  const std::vector<double> m = per_channel(mean, channels, 0.0);
  const std::vector<double> v = per_channel(var, channels, 1.0);
  const std::vector<double> w = per_channel(weight, channels, 1.0);
  const std::vector<double> b = per_channel(bias, channels, 0.0);
  Affine out{std::vector<double>(channels), std::vector<double>(channels)};
  for (int64_t c = 0; c < channels; ++c) {
    const math::Affine affine = math::affine(m[c], v[c], w[c], b[c], eps);
    out.scale[c] = affine.scale;
    out.shift[c] = affine.shift;
  }
  return out;
}

// Runs fn(c, offset) for every (n, c) row, where offset is the row's first
// element; rows are split across the thread team.
template <class Fn>
void for_each_row(const ChannelGeometry& l, Fn&& fn) {
  const int64_t grain = std::max<int64_t>(1, kRowGrain / std::max<int64_t>(1, l.inner));
  parallel_for(0, l.batch * l.channels, grain, [&](int64_t begin, int64_t end) {
    // The channel counts up and wraps: a division per row cost more than the
    // row itself where rows are one element long (ResNet's 1x1 planes).
    int64_t c = begin % l.channels;
    for (int64_t r = begin; r < end; ++r) {
      fn(c, r * l.inner);
      if (++c == l.channels) c = 0;
    }
  });
}

// Calls row_sums(c, offset, a, b) for every (n, c) row, accumulating into
// channel c's two f64 sums a and b, each channel's rows in batch order;
// returns them as a (2, C) f64 tensor. A task takes a block of channels and
// walks the batch through it, reading each image's block as one run. Channel
// by channel, consecutive rows lie a whole image apart: with ResNet-50's 8x8
// planes (rows of 256 bytes) a cache line per few elements, and its batch-norm
// passes took longer (measured in
// benchmarks/results/2026-12-06-cpu-kernel-timings-from-comments.md). Blocks
// narrow so that every thread has one.
template <class RowSums>
Tensor channel_sums(const ChannelGeometry& l, RowSums&& row_sums) {
  Tensor out = Tensor::empty({2, l.channels}, DType::f64);
  double* first = out.data<double>();
  double* second = first + l.channels;
  const int64_t threads = in_parallel_region() ? 1 : get_num_threads();
  const int64_t width = std::clamp<int64_t>((l.channels + threads - 1) / threads, 1, kChannelBlock);
  const int64_t blocks = (l.channels + width - 1) / width;
  const int64_t grain = std::max<int64_t>(1, kRowGrain / std::max<int64_t>(1, l.batch * l.inner * width));
  parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      const int64_t c0 = block * width, c1 = std::min(l.channels, c0 + width);
      std::fill(first + c0, first + c1, 0.0);
      std::fill(second + c0, second + c1, 0.0);
      for (int64_t n = 0; n < l.batch; ++n) {
        for (int64_t c = c0; c < c1; ++c) row_sums(c, (n * l.channels + c) * l.inner, first[c], second[c]);
      }
    }
  });
  return out;
}

// Planes of up to kFlatRow elements (ResNet-50's 1x1 to 4x4 at 32x32 input):
// a row is too short for a loop of its own (its setup and the per-channel
// coefficients cost more than its elements), so each image is one flat loop
// over its C * inner elements, with the coefficients spread to that length
// once per call: several times faster per element on 1x1 and 2x2 planes, while
// on 8x8 planes the rows' own loops were as fast or faster. (Measured:
// benchmarks/results/2026-12-06-cpu-kernel-timings-from-comments.md.) The
// reductions sum in f64 per (channel, position), then over positions.
constexpr int64_t kFlatRow = 16;
inline bool flat_rows(const ChannelGeometry& l) { return l.inner <= kFlatRow; }

// values[c] at every element of an image: (C) -> (C * inner), in T.
template <class T>
std::vector<T> spread_per_channel(const ChannelGeometry& l, const std::vector<double>& values) {
  std::vector<T> out(static_cast<size_t>(l.channels * l.inner));
  for (int64_t c = 0; c < l.channels; ++c) std::fill_n(out.begin() + c * l.inner, l.inner, static_cast<T>(values[c]));
  return out;
}

// Runs fn(offset) for the first element of every image, images split across
// the thread team.
template <class Fn>
void for_each_image(const ChannelGeometry& l, Fn&& fn) {
  const int64_t image = l.channels * l.inner;
  const int64_t grain = std::max<int64_t>(1, kRowGrain / std::max<int64_t>(1, image));
  parallel_for(0, l.batch, grain, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) fn(n * image);
  });
}

// channel_sums for flat_rows: a task takes a block of channels, adds image by
// image into f64 sums per (channel, position) with element_sums(offset,
// first, count, a, b) (a flat loop: a[j] and b[j] gain the terms of element
// offset + first + j), then sums each channel's positions.
template <class ElementSums>
Tensor channel_sums_flat(const ChannelGeometry& l, ElementSums&& element_sums) {
  Tensor out = Tensor::empty({2, l.channels}, DType::f64);
  double* first = out.data<double>();
  double* second = first + l.channels;
  const int64_t image = l.channels * l.inner;
  const int64_t blocks = (l.channels + kChannelBlock - 1) / kChannelBlock;
  const int64_t grain = std::max<int64_t>(1, kRowGrain / std::max<int64_t>(1, l.batch * l.inner * kChannelBlock));
  parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
    std::vector<double> a_sums(static_cast<size_t>(kChannelBlock * l.inner)), b_sums(a_sums.size());
    double* a = a_sums.data();
    double* b = b_sums.data();
    for (int64_t block = begin; block < end; ++block) {
      const int64_t c0 = block * kChannelBlock, c1 = std::min(l.channels, c0 + kChannelBlock);
      const int64_t count = (c1 - c0) * l.inner;
      std::fill_n(a, count, 0.0);
      std::fill_n(b, count, 0.0);
      for (int64_t n = 0; n < l.batch; ++n) element_sums(n * image, c0 * l.inner, count, a, b);
      for (int64_t c = c0; c < c1; ++c) {
        double sum_a = 0, sum_b = 0;
        for (int64_t s = 0; s < l.inner; ++s) {
          sum_a += a[(c - c0) * l.inner + s];
          sum_b += b[(c - c0) * l.inner + s];
        }
        first[c] = sum_a;
        second[c] = sum_b;
      }
    }
  });
  return out;
}

// ---- The ReLU's output pooled 2x2 (batch_norm_relu_max_pool2d) ----
// The forward computes each plane's relu(x * a + b) into a buffer that stays
// in cache and pools it there; nothing of full size is written. Backward
// gets the pooled gradient dp and rebuilds, plane by plane and again in a
// buffer, the gradient max_pool2d's backward and the fused ReLU's mask would
// make: each window's dp at the element the forward's pool chose (recomputed
// from x as the forward computed it), where that element was positive; 0 at
// every other element and at the row and column that odd sizes leave out of
// every window. The sums and the input gradient then run the unmasked loops
// on it, so the op's results are those of the three ops apart.
// The per-thread buffers of the fused pool (ops/cpu/scratch.h), held together.
enum class PoolBufferSlot {
  plane,         // a plane's ReLU output (forward) or its rebuilt gradient (backward)
  pool_indices,  // the pool's choice per window (forward)
  count
};
constexpr int64_t kGradientPadding = 16;  // floats past a rebuilt gradient plane

struct PooledPlane {
  int64_t height, width, out_h, out_w;
  int64_t out_plane() const { return out_h * out_w; }
};
inline PooledPlane pooled_plane(const Tensor& input) {
  return {input.size(2), input.size(3), input.size(2) / 2, input.size(3) / 2};
}

// The pooled gradient's plane for the (n, c) row at `offset` of the input.
inline int64_t pooled_offset(const ChannelGeometry& l, const PooledPlane& p, int64_t offset) {
  return offset / l.inner * p.out_plane();
}

}  // namespace loom::ops::cpu::batch_norm_detail
