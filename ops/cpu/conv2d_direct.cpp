// Direct f32 convolution for thin column matrices (conv2d_direct.h). Each
// image is first copied into a zero-padded buffer whose rows are long enough
// for whole 16-float loads at every output chunk and kernel column, so the
// inner loops are unmasked loads and FMAs; only the output (forward) and the
// output gradient (weight gradient) are masked, at the ragged end of a row.
#include <loom/ops/cpu/conv2d_direct.h>

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include <loom/core/parallel.h>
#include <loom/ops/cpu/gemm.h>
#include <loom/ops/cpu/scratch.h>

namespace loom::ops::cpu::direct {
namespace {

constexpr int64_t kLanes = 16;

// The padded copy of one image: (C, Hp, Wp), Hp = Ho + kh - 1 rows and
// Wp = 16 * (chunks rounded up to even) + kw - 1 columns (forward_row
// computes two chunks at a time), image pixel (r, s) at (r + pad_h,
// s + pad_w), zeros elsewhere.
struct Padded {
  int64_t rows, cols, chunks;
  int64_t plane() const { return rows * cols; }
};

Padded padded_shape(const Problem& p) {
  const int64_t chunks = (p.out_w + kLanes - 1) / kLanes, even = (chunks + 1) / 2 * 2;
  return {p.out_h + p.kernel_h - 1, even * kLanes + p.kernel_w - 1, chunks};
}

void pad_image(const float* image, const Problem& p, const Padded& s, float* out) {
  std::fill(out, out + p.channels * s.plane(), 0.0f);
  // Hp = H + 2 pad_h and Wp >= W + 2 pad_w: every image row lands whole.
  for (int64_t c = 0; c < p.channels; ++c) {
    for (int64_t r = 0; r < p.height; ++r) {
      std::memcpy(out + c * s.plane() + (r + p.pad_h) * s.cols + p.pad_w, image + (c * p.height + r) * p.width,
                  static_cast<size_t>(p.width) * sizeof(float));
    }
  }
}

// Lanes of output chunk `chunk` that fall inside a row of `width`.
__mmask16 chunk_mask(int64_t chunk, int64_t width) {
  const int64_t n = std::clamp<int64_t>(width - chunk * kLanes, 0, kLanes);
  return static_cast<__mmask16>(n == kLanes ? 0xFFFF : (1u << n) - 1);
}

// How many tasks split a batch: one per thread, at least one (an empty
// batch runs one task of no images).
int64_t task_count(int64_t batch) {
  return std::max<int64_t>(1, std::min<int64_t>(batch, in_parallel_region() ? 1 : get_num_threads()));
}

// Images [first, last) of the batch for task t of task_count(batch): a fixed
// split, so that per-task sums add up in the same order on every run.
template <class Fn>
void for_each_task(int64_t batch, Fn&& fn) {
  const int64_t tasks = task_count(batch);
  auto run = [&](int64_t t) { fn(t, batch * t / tasks, batch * (t + 1) / tasks); };
  if (tasks <= 1) return run(0);
  parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) run(t);
  });
}

// The direct kernels' per-thread scratch (ops/cpu/scratch.h): the padded
// image, one buffer for each pass (each task holds one of them at a time).
enum class DirectSlot {
  forward_image,          // the forward's padded input image
  weight_gradient_image,  // the weight gradient's padded input image
  count
};

// acc_b += broadcast(w[b]) * x for the eight output channels' accumulators
// of one chunk (named variables, not an array: GCC stores an array of
// vectors back to the stack on every iteration).
__attribute__((target("avx512f"), always_inline)) inline void fma_taps(const float* const (&w)[8], int64_t tap,
                                                                      __m512 x, __m512& a0, __m512& a1, __m512& a2,
                                                                      __m512& a3, __m512& a4, __m512& a5, __m512& a6,
                                                                      __m512& a7) {
  a0 = _mm512_fmadd_ps(_mm512_set1_ps(w[0][tap]), x, a0);
  a1 = _mm512_fmadd_ps(_mm512_set1_ps(w[1][tap]), x, a1);
  a2 = _mm512_fmadd_ps(_mm512_set1_ps(w[2][tap]), x, a2);
  a3 = _mm512_fmadd_ps(_mm512_set1_ps(w[3][tap]), x, a3);
  a4 = _mm512_fmadd_ps(_mm512_set1_ps(w[4][tap]), x, a4);
  a5 = _mm512_fmadd_ps(_mm512_set1_ps(w[5][tap]), x, a5);
  a6 = _mm512_fmadd_ps(_mm512_set1_ps(w[6][tap]), x, a6);
  a7 = _mm512_fmadd_ps(_mm512_set1_ps(w[7][tap]), x, a7);
}

// Output row i of one image for output channels [o0, o0 + 8) (clamped to
// the last channel; only real ones are stored), chunks chunk0 and chunk0 + 1
// (the padded rows hold an even number of chunks): 16 accumulators, two
// loads and eight broadcast weights per tap.
__attribute__((target("avx512f"))) void forward_row(const float* padded, const Padded& s, const float* weight,
                                                     const float* bias, const Problem& p, int64_t i, int64_t o0,
                                                     int64_t chunk0, float* out_image) {
  const int64_t channels = p.channels, kernel_h = p.kernel_h, kernel_w = p.kernel_w, plane = s.plane(), cols = s.cols;
  const int64_t taps = channels * kernel_h * kernel_w;
  const float* w[8];
  for (int b = 0; b < 8; ++b) w[b] = weight + std::min(o0 + b, p.out_channels - 1) * taps;
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  __m512 b0 = a0, b1 = a0, b2 = a0, b3 = a0, b4 = a0, b5 = a0, b6 = a0, b7 = a0;
  int64_t tap = 0;
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t ki = 0; ki < kernel_h; ++ki) {
      const float* row = padded + c * plane + (i + ki) * cols + chunk0 * kLanes;
      for (int64_t kj = 0; kj < kernel_w; ++kj, ++tap) {
        fma_taps(w, tap, _mm512_loadu_ps(row + kj), a0, a1, a2, a3, a4, a5, a6, a7);
        fma_taps(w, tap, _mm512_loadu_ps(row + kLanes + kj), b0, b1, b2, b3, b4, b5, b6, b7);
      }
    }
  }
  const __m512 low[8] = {a0, a1, a2, a3, a4, a5, a6, a7}, high[8] = {b0, b1, b2, b3, b4, b5, b6, b7};
  const int64_t out_plane = p.out_h * p.out_w;
  const __mmask16 low_mask = chunk_mask(chunk0, p.out_w), high_mask = chunk_mask(chunk0 + 1, p.out_w);
  for (int b = 0; b < 8 && o0 + b < p.out_channels; ++b) {
    const __m512 bv = _mm512_set1_ps(bias != nullptr ? bias[o0 + b] : 0.0f);
    float* y = out_image + (o0 + b) * out_plane + i * p.out_w + chunk0 * kLanes;
    _mm512_mask_storeu_ps(y, low_mask, _mm512_add_ps(low[b], bv));
    _mm512_mask_storeu_ps(y + kLanes, high_mask, _mm512_add_ps(high[b], bv));
  }
}

// c_b += g_b * x for the four output channels' accumulators of one kernel
// column (named variables, as in fma_taps).
__attribute__((target("avx512f"), always_inline)) inline void fma_column(const float* at, __m512 g0, __m512 g1,
                                                                        __m512 g2, __m512 g3, __m512& c0, __m512& c1,
                                                                        __m512& c2, __m512& c3) {
  const __m512 x = _mm512_loadu_ps(at);
  c0 = _mm512_fmadd_ps(g0, x, c0);
  c1 = _mm512_fmadd_ps(g1, x, c1);
  c2 = _mm512_fmadd_ps(g2, x, c2);
  c3 = _mm512_fmadd_ps(g3, x, c3);
}

// The weight gradient's accumulators of one image for output channels
// [o0, o0 + 4) and the five taps [tap0, tap0 + 5) of the flattened (c, ki,
// kj) order (the weight's own), both clamped like forward_row's: 4 x 5
// vectors over every output position, each then added to its 16-float
// partial sum sums[(o, tap)]. Blocks run across kernel rows and channels, so
// a 3x3 kernel wastes no FMAs on missing columns but those of its last block.
__attribute__((target("avx512f"))) void weight_block(const float* padded, const Padded& s, const float* dy_image,
                                                     const Problem& p, int64_t o0, int64_t tap0, float* sums) {
  const int64_t out_h = p.out_h, out_w = p.out_w, plane = out_h * out_w, cols = s.cols, chunks = s.chunks;
  const int64_t kernel = p.kernel_h * p.kernel_w, taps = p.channels * kernel;
  const float* dy0 = dy_image + std::min(o0 + 0, p.out_channels - 1) * plane;
  const float* dy1 = dy_image + std::min(o0 + 1, p.out_channels - 1) * plane;
  const float* dy2 = dy_image + std::min(o0 + 2, p.out_channels - 1) * plane;
  const float* dy3 = dy_image + std::min(o0 + 3, p.out_channels - 1) * plane;
  // Each tap's offset in the padded image: channel plane, kernel row and column.
  int64_t offset[5];
  for (int t = 0; t < 5; ++t) {
    const int64_t tap = std::min(tap0 + t, taps - 1), within = tap % kernel;
    offset[t] = tap / kernel * s.plane() + within / p.kernel_w * cols + within % p.kernel_w;
  }
  const int64_t k0 = offset[0], k1 = offset[1], k2 = offset[2], k3 = offset[3], k4 = offset[4];
  __m512 c00 = _mm512_setzero_ps(), c10 = c00, c20 = c00, c30 = c00, c01 = c00, c11 = c00, c21 = c00, c31 = c00;
  __m512 c02 = c00, c12 = c00, c22 = c00, c32 = c00, c03 = c00, c13 = c00, c23 = c00, c33 = c00;
  __m512 c04 = c00, c14 = c00, c24 = c00, c34 = c00;
  for (int64_t i = 0; i < out_h; ++i) {
    const float* row = padded + i * cols;
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      const __mmask16 mask = chunk_mask(chunk, out_w);
      const int64_t at = i * out_w + chunk * kLanes;
      const __m512 g0 = _mm512_maskz_loadu_ps(mask, dy0 + at), g1 = _mm512_maskz_loadu_ps(mask, dy1 + at);
      const __m512 g2 = _mm512_maskz_loadu_ps(mask, dy2 + at), g3 = _mm512_maskz_loadu_ps(mask, dy3 + at);
      const float* x = row + chunk * kLanes;
      fma_column(x + k0, g0, g1, g2, g3, c00, c10, c20, c30);
      fma_column(x + k1, g0, g1, g2, g3, c01, c11, c21, c31);
      fma_column(x + k2, g0, g1, g2, g3, c02, c12, c22, c32);
      fma_column(x + k3, g0, g1, g2, g3, c03, c13, c23, c33);
      fma_column(x + k4, g0, g1, g2, g3, c04, c14, c24, c34);
    }
  }
  const __m512 acc[4][5] = {{c00, c01, c02, c03, c04},
                            {c10, c11, c12, c13, c14},
                            {c20, c21, c22, c23, c24},
                            {c30, c31, c32, c33, c34}};
  for (int b = 0; b < 4 && o0 + b < p.out_channels; ++b) {
    for (int t = 0; t < 5 && tap0 + t < taps; ++t) {
      float* sum = sums + ((o0 + b) * taps + tap0 + t) * kLanes;
      _mm512_storeu_ps(sum, _mm512_add_ps(_mm512_loadu_ps(sum), acc[b][t]));
    }
  }
}

}  // namespace

bool applies(const Problem& p) {
  // The GEMM's kernel choice (LOOM_CPU_GEMM, set_gemm_kernel) also chooses
  // this: a user who keeps loom off AVX-512 keeps these kernels off too.
  const bool avx512 = gemm_kernel() == GemmKernel::avx512;
  return avx512 && p.channels * p.kernel_h * p.kernel_w <= 32 && p.out_w >= 8 && p.out_h >= 1 && p.kernel_h >= 1 &&
         p.kernel_w >= 1 && p.out_channels >= 1;
}

void forward(const float* input, const float* weight, const float* bias, const Problem& p, float* output) {
  const Padded s = padded_shape(p);
  const int64_t image_in = p.channels * p.height * p.width, image_out = p.out_channels * p.out_h * p.out_w;
  for_each_task(p.batch, [&](int64_t, int64_t first, int64_t last) {
    float* padded = thread_scratch(DirectSlot::forward_image, p.channels * s.plane());
    for (int64_t n = first; n < last; ++n) {
      pad_image(input + n * image_in, p, s, padded);
      float* out = output + n * image_out;
      for (int64_t o0 = 0; o0 < p.out_channels; o0 += 8) {
        for (int64_t i = 0; i < p.out_h; ++i) {
          for (int64_t chunk = 0; chunk < s.chunks; chunk += 2) forward_row(padded, s, weight, bias, p, i, o0, chunk, out);
        }
      }
    }
  });
}

void backward_weight(const float* grad_output, const float* input, const Problem& p, float* grad_weight) {
  const Padded s = padded_shape(p);
  const int64_t image_in = p.channels * p.height * p.width, image_out = p.out_channels * p.out_h * p.out_w;
  const int64_t taps = p.channels * p.kernel_h * p.kernel_w, weights = p.out_channels * taps;
  const int64_t tasks = task_count(p.batch);
  // Per task, a 16-float partial sum per weight: the lanes are output columns.
  std::vector<float> sums(static_cast<size_t>(tasks * weights * kLanes), 0.0f);
  for_each_task(p.batch, [&](int64_t task, int64_t first, int64_t last) {
    float* padded = thread_scratch(DirectSlot::weight_gradient_image, p.channels * s.plane());
    float* task_sums = sums.data() + task * weights * kLanes;
    for (int64_t n = first; n < last; ++n) {
      pad_image(input + n * image_in, p, s, padded);
      const float* dy = grad_output + n * image_out;
      for (int64_t o0 = 0; o0 < p.out_channels; o0 += 4) {
        for (int64_t tap0 = 0; tap0 < taps; tap0 += 5) weight_block(padded, s, dy, p, o0, tap0, task_sums);
      }
    }
  });
  // The tasks' sums in task order, then each weight's 16 lanes.
  for (int64_t t = 1; t < tasks; ++t) {
    const float* partial = sums.data() + t * weights * kLanes;
    for (int64_t i = 0; i < weights * kLanes; ++i) sums[static_cast<size_t>(i)] += partial[i];
  }
  for (int64_t w = 0; w < weights; ++w) {
    float total = 0.0f;
    for (int64_t lane = 0; lane < kLanes; ++lane) total += sums[static_cast<size_t>(w * kLanes + lane)];
    grad_weight[w] = total;
  }
}

}  // namespace loom::ops::cpu::direct
