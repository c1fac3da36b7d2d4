// The Winograd transforms on the CPU: the matrices of F(m, r) applied to rows
// (compiled per F(m, r) under AVX2), and the weight's transform and its adjoint.
#include <loom/ops/cpu/winograd_internal.h>

#include <algorithm>

#include <loom/core/error.h>
#include <loom/ops/cpu/simd.h>

namespace loom::ops::cpu::winograd::detail {

const Transforms& transforms(int m, int r) {
  // Every F(m, r) with r in {3, 5} and α <= 8, built once.
  static const std::vector<Transforms> table = [] {
    std::vector<Transforms> all;
    for (int r : {3, 5}) {
      for (int m = 2; m + r - 1 <= kMaxAlpha; ++m) all.push_back(make_transforms(m, r));
    }
    return all;
  }();
  for (const Transforms& t : table) {
    if (t.m == m && t.r == r) return t;
  }
  LOOM_FAIL("winograd: no F(", m, ", ", r, ") transform (r must be 3 or 5, m + r - 1 at most ", kMaxAlpha, ")");
}

namespace {

// out[i * out_stride + l] = sum_j mat[i * in_rows + j] * in[j * in_stride + l]
// for l < length: the matrix applied to `in_rows` rows. The portable
// fallback of the compiled kernels below (CPUs without AVX2).
void apply_rows(const float* mat, int out_rows, int in_rows, const float* in, int64_t in_stride, float* out,
                int64_t out_stride, int64_t length) {
  for (int i = 0; i < out_rows; ++i) {
    for (int64_t l = 0; l < length; ++l) {
      float sum = 0;
      for (int j = 0; j < in_rows; ++j) sum += mat[i * in_rows + j] * in[j * in_stride + l];
      out[i * out_stride + l] = sum;
    }
  }
}

using RowsFn = void (*)(const float* in, int64_t in_stride, float* out, int64_t out_stride, int64_t length);
struct FastRows {
  RowsFn of[6] = {};  // indexed by Which
};

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
template <class F, Which W, int Out, int In>
void apply_rows_fixed(const float* in, int64_t in_stride, float* out, int64_t out_stride, int64_t length) {
  int64_t l = 0;
  for (; l + 8 <= length; l += 8) {
    __m256 x[In];
    unroll<In>([&](auto j) __attribute__((always_inline)) { x[j] = _mm256_loadu_ps(in + j * in_stride + l); });
    fixed_product<F, W, Out, In>(x, [&](int i, __m256 sum) { _mm256_storeu_ps(out + i * out_stride + l, sum); });
  }
  for (; l < length; ++l) {
    float x[In];
    for (int j = 0; j < In; ++j) x[j] = in[j * in_stride + l];
    fixed_product<F, W, Out, In>(x, [&](int i, float sum) { out[i * out_stride + l] = sum; });
  }
}
#pragma GCC pop_options

template <int M, int R>
FastRows fast_rows_of() {
  using F = Fixed<M, R>;
  constexpr int A = M + R - 1;
  return {{&apply_rows_fixed<F, Which::bt, A, A>, &apply_rows_fixed<F, Which::b, A, A>,
           &apply_rows_fixed<F, Which::at, M, A>, &apply_rows_fixed<F, Which::a, A, M>,
           &apply_rows_fixed<F, Which::g, A, R>, &apply_rows_fixed<F, Which::gt, R, A>}};
}
#endif

// The compiled transforms of F(m, r), or none (no AVX2: the generic apply_rows).
FastRows fast_rows(int m, int r) {
#if defined(__x86_64__)
  if (!cpu_has_avx2()) return {};
  if (r == 3) {
    switch (m) {
      case 2: return fast_rows_of<2, 3>();
      case 3: return fast_rows_of<3, 3>();
      case 4: return fast_rows_of<4, 3>();
      case 5: return fast_rows_of<5, 3>();
      case 6: return fast_rows_of<6, 3>();
    }
  }
  if (r == 5) {
    switch (m) {
      case 2: return fast_rows_of<2, 5>();
      case 3: return fast_rows_of<3, 5>();
      case 4: return fast_rows_of<4, 5>();
    }
  }
#endif
  return {};
}

}  // namespace

// Applies transform W of t (Bᵀ, B: α x α; Aᵀ: m x α; A: α x m; G: α x r;
// Gᵀ: r x α) to rows of `length` values.
void transform_rows(const Transforms& t, Which w, const float* in, int64_t in_stride, float* out, int64_t out_stride,
                    int64_t length) {
  static const std::vector<FastRows> table = [] {
    std::vector<FastRows> all(kMaxAlpha * kMaxAlpha);
    for (int r : {3, 5}) {
      for (int m = 2; m + r - 1 <= kMaxAlpha; ++m) all[m * kMaxAlpha + r] = fast_rows(m, r);
    }
    return all;
  }();
  if (const RowsFn fast = table[t.m * kMaxAlpha + t.r].of[static_cast<int>(w)]) {
    return fast(in, in_stride, out, out_stride, length);
  }
  switch (w) {
    case Which::bt: return apply_rows(t.bt, t.alpha, t.alpha, in, in_stride, out, out_stride, length);
    case Which::b: return apply_rows(t.b, t.alpha, t.alpha, in, in_stride, out, out_stride, length);
    case Which::at: return apply_rows(t.at, t.m, t.alpha, in, in_stride, out, out_stride, length);
    case Which::a: return apply_rows(t.a, t.alpha, t.m, in, in_stride, out, out_stride, length);
    case Which::g: return apply_rows(t.g, t.alpha, t.r, in, in_stride, out, out_stride, length);
    case Which::gt: return apply_rows(t.gt, t.r, t.alpha, in, in_stride, out, out_stride, length);
  }
}


namespace {

// The weight transforms split their (o, c) columns over the thread team, at
// least this many per thread: ResNet's 256-channel layers have 65,536.
constexpr int64_t kWeightColumnsGrain = 4096;

// Columns [begin, end) of the weight's taps, gathered: taps[k][q] =
// weight[source(q) * r² + k], where sources(q0, count, from) sets from[j] =
// source(q0 + j), the (o, c) index o * C + c of column q0 + j. In blocks of
// columns, so that each tap's row is written in runs: one column at a time
// wrote r² floats oc apart (a power of two), each store to the same cache set.
template <class Sources>
void gather_taps(const float* weight, int64_t taps_per_column, int64_t columns, int64_t begin, int64_t end,
                 Sources&& sources, float* taps) {
  constexpr int64_t kBlock = 64;
  int64_t from[kBlock];
  for (int64_t q0 = begin; q0 < end; q0 += kBlock) {
    const int64_t count = std::min(end - q0, kBlock);
    sources(q0, count, from);
    for (int64_t j = 0; j < count; ++j) from[j] *= taps_per_column;
    for (int64_t k = 0; k < taps_per_column; ++k) {
      float* row = taps + k * columns + q0;
      for (int64_t j = 0; j < count; ++j) row[j] = weight[from[j] + k];
    }
  }
}

// The G transforms of columns [begin, end) of taps[ki][kj][column] (through
// half[ξ][kj][column]) into u[ξ][ν][column].
void transform_taps(const Transforms& t, int64_t columns, const float* taps, float* half, float* u, int64_t begin,
                    int64_t end) {
  const int64_t r = t.r, alpha = t.alpha;
  for (int64_t kj = 0; kj < r; ++kj) {  // ki -> ξ
    transform_rows(t, Which::g, taps + kj * columns + begin, r * columns, half + kj * columns + begin, r * columns,
                   end - begin);
  }
  for (int64_t xi = 0; xi < alpha; ++xi) {  // kj -> ν
    transform_rows(t, Which::g, half + xi * r * columns + begin, columns, u + xi * alpha * columns + begin, columns,
                   end - begin);
  }
}

// U[ξ][ν][o][c] = sum over (ki, kj) of G[ξ][ki] w[o][c][ki][kj] G[ν][kj], into
// the transformed_weight slot; U[ξ][ν][c][o] with Order::c_major.
}  // namespace

const float* transform_weight(const float* weight, const Problem& p, const Transforms& t,
                              Order order) {
  const int64_t o_count = p.out_channels, c_count = p.channels, oc = o_count * c_count, r = t.r, alpha = t.alpha;
  float* taps = scratch(WinogradSlot::weight_taps, r * r * oc);      // [ki][kj][column]
  float* half = scratch(WinogradSlot::weight_half, alpha * r * oc);  // [ξ][kj][column]
  float* u = scratch(WinogradSlot::transformed_weight, alpha * alpha * oc);
  parallel_for(0, oc, kWeightColumnsGrain, [&](int64_t begin, int64_t end) {
    gather_taps(weight, r * r, oc, begin, end,
                [&](int64_t q0, int64_t count, int64_t* from) {
                  if (order == Order::o_major) {
                    for (int64_t j = 0; j < count; ++j) from[j] = q0 + j;
                    return;
                  }
                  int64_t c = q0 / o_count, o = q0 % o_count;  // column q = c * O + o
                  for (int64_t j = 0; j < count; ++j) {
                    from[j] = o * c_count + c;
                    if (++o == o_count) o = 0, ++c;
                  }
                },
                taps);
    transform_taps(t, oc, taps, half, u, begin, end);
  });
  return u;
}

// The adjoint: dw[o][c][ki][kj] = sum over (ξ, ν) of G[ξ][ki] dU[ξ][ν][o][c] G[ν][kj].
// `du` must not be in the weight_taps or weight_half slot.
void inverse_transform_weight(const float* du, const Problem& p, const Transforms& t, float* grad_weight) {
  const int64_t oc = p.out_channels * p.channels, r = t.r, alpha = t.alpha;
  float* half = scratch(WinogradSlot::weight_half, r * alpha * oc);  // [ki][ν][o][c]
  float* taps = scratch(WinogradSlot::weight_taps, r * r * oc);      // [ki][kj][o][c]
  parallel_for(0, oc, kWeightColumnsGrain, [&](int64_t begin, int64_t end) {
    for (int64_t nu = 0; nu < alpha; ++nu) {  // ξ -> ki
      transform_rows(t, Which::gt, du + nu * oc + begin, alpha * oc, half + nu * oc + begin, alpha * oc,
                     end - begin);
    }
    for (int64_t ki = 0; ki < r; ++ki) {  // ν -> kj
      transform_rows(t, Which::gt, half + ki * alpha * oc + begin, oc, taps + ki * r * oc + begin, oc, end - begin);
    }
    for (int64_t i = begin; i < end; ++i) {
      for (int64_t k = 0; k < r * r; ++k) grad_weight[i * r * r + k] = taps[k * oc + i];
    }
  });
}

namespace {

// The α² matrices U[ξ][ν] (o x c each) as GEMM operands packed once for
// every chunk's products (PackedA, into the packed_weight slot): op = U for
// the forward, Uᵀ for the input gradient.
std::vector<PackedA<float>> packed_weight(const float* u, int64_t count, int64_t o_count, int64_t c_count,
                                          Transpose t) {
  const int64_t rows = t == Transpose::no ? o_count : c_count, depth = t == Transpose::no ? c_count : o_count;
  const int64_t each = PackedA<float>::storage_size(rows, depth);
  float* storage = scratch(WinogradSlot::packed_weight, count * each);
  std::vector<PackedA<float>> out;
  out.reserve(static_cast<size_t>(count));
  for (int64_t e = 0; e < count; ++e) out.emplace_back(t, rows, depth, u + e * o_count * c_count, c_count, storage + e * each);
  return out;
}

}  // namespace

// packed_weight(transform_weight(...)) in one go where the GEMM packs A and
// op(U_e)'s rows fill whole strips: the taps are gathered in the packing's
// order (PackedA's layout), so the G transforms write every U_e packed, into
// the packed_weight slot, and no U is packed afterwards (that pass and its read
// of U were a visible share of the forward of a 256-channel 3x3 on 8x8 planes;
// measured in
// benchmarks/results/2026-12-06-cpu-kernel-timings-from-comments.md). The same
// values.
std::vector<PackedA<float>> packed_transformed_weight(const float* weight, const Problem& p, const Transforms& t,
                                                      Transpose op) {
  const int64_t o_count = p.out_channels, c_count = p.channels, oc = o_count * c_count, r = t.r, alpha = t.alpha;
  const int64_t rows = op == Transpose::no ? o_count : c_count, depth = op == Transpose::no ? c_count : o_count;
  constexpr int64_t kStrip = PackedA<float>::kStripRows, kSlice = PackedA<float>::kSliceDepth;
  if (!PackedA<float>::packs() || rows % kStrip != 0) {
    return packed_weight(transform_weight(weight, p, t), alpha * alpha, o_count, c_count, op);
  }
  float* taps = scratch(WinogradSlot::weight_taps, r * r * oc);      // [ki][kj][packing position]
  float* half = scratch(WinogradSlot::weight_half, alpha * r * oc);  // [ξ][kj][packing position]
  float* u = scratch(WinogradSlot::packed_weight, alpha * alpha * oc);
  // Position q of slice s, strip (rows i0 .. i0+8), depth d, row i is
  // s * kSlice * rows + i0 * kc + (d - s * kSlice) * 8 + (i - i0): the
  // strips of a slice follow one another, so each task's positions are a
  // range. op(U)(i, d) is U[o = i][c = d], or U[o = d][c = i] transposed.
  const int64_t strips = rows / kStrip, slices = (depth + kSlice - 1) / kSlice;
  parallel_for(0, slices * strips, std::max<int64_t>(1, kWeightColumnsGrain / (kStrip * kSlice)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t task = begin; task < end; ++task) {
                   const int64_t d0 = (task / strips) * kSlice, i0 = (task % strips) * kStrip;
                   const int64_t kc = std::min(kSlice, depth - d0), first = d0 * rows + i0 * kc;
                   gather_taps(weight, r * r, oc, first, first + kc * kStrip,
                               [&](int64_t q0, int64_t count, int64_t* from) {
                                 for (int64_t j = 0; j < count; ++j) {
                                   const int64_t q = q0 + j - first, d = d0 + q / kStrip, i = i0 + q % kStrip;
                                   from[j] = op == Transpose::no ? i * c_count + d : d * c_count + i;
                                 }
                               },
                               taps);
                 }
               });
  parallel_for(0, oc, kWeightColumnsGrain,
               [&](int64_t begin, int64_t end) { transform_taps(t, oc, taps, half, u, begin, end); });
  std::vector<PackedA<float>> out;
  out.reserve(static_cast<size_t>(alpha * alpha));
  for (int64_t e = 0; e < alpha * alpha; ++e) out.push_back(PackedA<float>::adopt(op, rows, depth, u + e * oc));
  return out;
}

}  // namespace loom::ops::cpu::winograd::detail
