// Packed GEMM in the style of BLIS / GotoBLAS: C is computed in MC x NC blocks;
// for each KC slice, B is packed into NR-wide column strips and A into MR-tall
// row strips, and a 6 x 16 register-blocked AVX2/FMA micro-kernel does the
// arithmetic. Packing absorbs the transposes and zero-pads ragged edges.
#include "ops/cpu/gemm.h"

#include <immintrin.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/parallel.h"

namespace loom::ops::cpu {
namespace {

constexpr int64_t kMR = 6;    // rows of C per micro-tile
constexpr int64_t kNR = 16;   // columns of C per micro-tile (two 8-float registers)
constexpr int64_t kKC = 256;  // depth of a packed slice
constexpr int64_t kMC = 96;   // rows of A packed at once (multiple of kMR)
constexpr int64_t kNC = 2048; // columns of B packed at once (multiple of kNR)

bool cpu_has_avx2_fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}

// Packs op(A)[row0 .. row0+rows, p0 .. p0+depth] as MR-tall strips:
// packed[strip][p][r], zero beyond `rows`. One loop per storage order, so the
// inner loops read memory in order.
void pack_a(Transpose t, const float* a, int64_t lda, int64_t row0, int64_t rows, int64_t p0, int64_t depth,
            float* packed) {
  for (int64_t strip = 0; strip < rows; strip += kMR) {
    const int64_t height = std::min(kMR, rows - strip);
    if (height < kMR) std::fill(packed, packed + depth * kMR, 0.0f);
    if (t == Transpose::no) {
      // A is (m, k): row i of the strip is contiguous in p.
      for (int64_t r = 0; r < height; ++r) {
        const float* row = a + (row0 + strip + r) * lda + p0;
        for (int64_t p = 0; p < depth; ++p) packed[p * kMR + r] = row[p];
      }
    } else {
      // A is stored (k, m): for each p the strip's rows are contiguous.
      for (int64_t p = 0; p < depth; ++p) {
        const float* column = a + (p0 + p) * lda + row0 + strip;
        for (int64_t r = 0; r < height; ++r) packed[p * kMR + r] = column[r];
      }
    }
    packed += depth * kMR;
  }
}

// Packs op(B)[p0 .. p0+depth, col0 .. col0+cols] as NR-wide strips:
// packed[strip][p][c], zero beyond `cols`.
void pack_b(Transpose t, const float* b, int64_t ldb, int64_t p0, int64_t depth, int64_t col0, int64_t cols,
            float* packed) {
  for (int64_t strip = 0; strip < cols; strip += kNR) {
    const int64_t width = std::min(kNR, cols - strip);
    if (width < kNR) std::fill(packed, packed + depth * kNR, 0.0f);
    if (t == Transpose::no) {
      // B is (k, n): each p contributes `width` contiguous values.
      for (int64_t p = 0; p < depth; ++p) {
        const float* row = b + (p0 + p) * ldb + col0 + strip;
        float* out = packed + p * kNR;
        if (width == kNR) {
          for (int64_t c = 0; c < kNR; ++c) out[c] = row[c];
        } else {
          for (int64_t c = 0; c < width; ++c) out[c] = row[c];
        }
      }
    } else {
      // B is stored (n, k): column c of the strip is contiguous in p.
      for (int64_t c = 0; c < width; ++c) {
        const float* column = b + (col0 + strip + c) * ldb + p0;
        for (int64_t p = 0; p < depth; ++p) packed[p * kNR + c] = column[p];
      }
    }
    packed += depth * kNR;
  }
}

// C tile (rows x cols <= 6 x 16) = alpha * A_strip · B_strip + beta * C tile;
// with `transposed_c` the tile is stored transposed (element (r, col) at
// c[col * ldc + r]), for problems computed as Cᵀ = Bᵀ Aᵀ.
// alpha and beta arrive through memory: as float arguments they would pin a
// vector register for the whole loop and force an accumulator to spill.
__attribute__((target("avx2,fma"))) void micro_kernel_avx2(int64_t depth, const float* a, const float* b, float* c,
                                                            int64_t ldc, const float* alpha_beta, int64_t rows,
                                                            int64_t cols, bool transposed_c) {
  __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps(), c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
  __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps(), c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
  __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps(), c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
  for (int64_t p = 0; p < depth; ++p) {
    const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
    __m256 av = _mm256_broadcast_ss(a + 0);
    c00 = _mm256_fmadd_ps(av, b0, c00);
    c01 = _mm256_fmadd_ps(av, b1, c01);
    av = _mm256_broadcast_ss(a + 1);
    c10 = _mm256_fmadd_ps(av, b0, c10);
    c11 = _mm256_fmadd_ps(av, b1, c11);
    av = _mm256_broadcast_ss(a + 2);
    c20 = _mm256_fmadd_ps(av, b0, c20);
    c21 = _mm256_fmadd_ps(av, b1, c21);
    av = _mm256_broadcast_ss(a + 3);
    c30 = _mm256_fmadd_ps(av, b0, c30);
    c31 = _mm256_fmadd_ps(av, b1, c31);
    av = _mm256_broadcast_ss(a + 4);
    c40 = _mm256_fmadd_ps(av, b0, c40);
    c41 = _mm256_fmadd_ps(av, b1, c41);
    av = _mm256_broadcast_ss(a + 5);
    c50 = _mm256_fmadd_ps(av, b0, c50);
    c51 = _mm256_fmadd_ps(av, b1, c51);
    a += kMR;
    b += kNR;
  }
  const __m256 accumulators[kMR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
  const float alpha = alpha_beta[0], beta = alpha_beta[1];
  const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
  if (rows == kMR && cols == kNR && !transposed_c) {
    for (int64_t r = 0; r < kMR; ++r) {
      float* out = c + r * ldc;
      for (int half = 0; half < 2; ++half) {
        __m256 v = _mm256_mul_ps(va, accumulators[r][half]);
        if (beta != 0.0f) v = _mm256_fmadd_ps(vb, _mm256_loadu_ps(out + 8 * half), v);
        _mm256_storeu_ps(out + 8 * half, v);
      }
    }
    return;
  }
  alignas(32) float tile[kMR][kNR];
  for (int64_t r = 0; r < kMR; ++r) {
    _mm256_store_ps(tile[r], accumulators[r][0]);
    _mm256_store_ps(tile[r] + 8, accumulators[r][1]);
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t col = 0; col < cols; ++col) {
      float& out = transposed_c ? c[col * ldc + r] : c[r * ldc + col];
      out = alpha * tile[r][col] + (beta != 0.0f ? beta * out : 0.0f);
    }
  }
}

// With `transposed_c`, C is stored transposed: the caller computes Cᵀ.
void gemm_packed_f32(Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                     int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
                     bool transposed_c) {
  thread_local std::vector<float> packed_a, packed_b;
  packed_a.resize(static_cast<size_t>(kMC * kKC));
  for (int64_t jc = 0; jc < n; jc += kNC) {
    const int64_t nc = std::min(kNC, n - jc);
    const int64_t nc_padded = (nc + kNR - 1) / kNR * kNR;
    packed_b.resize(static_cast<size_t>(nc_padded * kKC));
    for (int64_t pc = 0; pc < k; pc += kKC) {
      const int64_t kc = std::min(kKC, k - pc);
      const float alpha_beta[2] = {alpha, pc == 0 ? beta : 1.0f};
      pack_b(tb, b, ldb, pc, kc, jc, nc, packed_b.data());
      for (int64_t ic = 0; ic < m; ic += kMC) {
        const int64_t mc = std::min(kMC, m - ic);
        pack_a(ta, a, lda, ic, mc, pc, kc, packed_a.data());
        for (int64_t jr = 0; jr < nc; jr += kNR) {
          const float* b_strip = packed_b.data() + (jr / kNR) * kc * kNR;
          for (int64_t ir = 0; ir < mc; ir += kMR) {
            float* tile = transposed_c ? c + (jc + jr) * ldc + ic + ir : c + (ic + ir) * ldc + jc + jr;
            micro_kernel_avx2(kc, packed_a.data() + (ir / kMR) * kc * kMR, b_strip, tile, ldc, alpha_beta,
                              std::min(kMR, mc - ir), std::min(kNR, nc - jr), transposed_c);
          }
        }
      }
    }
  }
}

template <class T>
using RowMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using StridedMap = Eigen::Map<RowMajor<T>, 0, Eigen::OuterStride<>>;
template <class T>
using ConstStridedMap = Eigen::Map<const RowMajor<T>, 0, Eigen::OuterStride<>>;

template <class T>
void gemm_eigen(Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
                const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  StridedMap<T> cm(c, m, n, Eigen::OuterStride<>(ldc));
  if (beta == T(0)) {
    cm.setZero();
  } else if (beta != T(1)) {
    cm *= beta;
  }
  if (k == 0) return;
  const ConstStridedMap<T> am(a, ta == Transpose::no ? m : k, ta == Transpose::no ? k : m, Eigen::OuterStride<>(lda));
  const ConstStridedMap<T> bm(b, tb == Transpose::no ? k : n, tb == Transpose::no ? n : k, Eigen::OuterStride<>(ldb));
  if (ta == Transpose::no && tb == Transpose::no) cm.noalias() += alpha * am * bm;
  if (ta == Transpose::no && tb == Transpose::yes) cm.noalias() += alpha * am * bm.transpose();
  if (ta == Transpose::yes && tb == Transpose::no) cm.noalias() += alpha * am.transpose() * bm;
  if (ta == Transpose::yes && tb == Transpose::yes) cm.noalias() += alpha * am.transpose() * bm.transpose();
}

// Splits the rows of C over the thread team when the problem is big enough.
template <class T, class Fn>
void split_rows(int64_t m, int64_t n, int64_t k, Transpose ta, const T* a, int64_t lda, T* c, int64_t ldc, Fn&& fn) {
  const int64_t work = m * n * k;
  if (in_parallel_region() || get_num_threads() == 1 || work < (int64_t{1} << 21) || m < 2 * kMR) {
    fn(m, a, c);
    return;
  }
  const int64_t rows_per_grain = std::max<int64_t>(kMR, (int64_t{1} << 20) / std::max<int64_t>(n * k, 1));
  parallel_for(0, m, rows_per_grain, [&](int64_t begin, int64_t end) {
    const T* a_rows = ta == Transpose::no ? a + begin * lda : a + begin;
    fn(end - begin, a_rows, c + begin * ldc);
  });
}

}  // namespace

const char* gemm_kernel_name() { return cpu_has_avx2_fma() ? "avx2-fma" : "eigen"; }

void gemm(Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  split_rows(m, n, k, ta, a, lda, c, ldc, [&](int64_t rows, const float* a_rows, float* c_rows) {
    if (cpu_has_avx2_fma() && k > 0) {
      // The 6 x 16 tiles fit some shapes badly (m = 32: the sixth strip is a
      // third full). Cᵀ = op(B)ᵀ op(A)ᵀ swaps the roles of m and n; take the
      // orientation that wastes fewer tile slots.
      auto slots = [](int64_t rows_, int64_t cols_) {
        return ((rows_ + kMR - 1) / kMR * kMR) * ((cols_ + kNR - 1) / kNR * kNR);
      };
      if (slots(n, rows) < slots(rows, n)) {
        const Transpose flip_a = ta == Transpose::no ? Transpose::yes : Transpose::no;
        const Transpose flip_b = tb == Transpose::no ? Transpose::yes : Transpose::no;
        gemm_packed_f32(flip_b, flip_a, n, rows, k, alpha, b, ldb, a_rows, lda, beta, c_rows, ldc, true);
      } else {
        gemm_packed_f32(ta, tb, rows, n, k, alpha, a_rows, lda, b, ldb, beta, c_rows, ldc, false);
      }
    } else {
      gemm_eigen<float>(ta, tb, rows, n, k, alpha, a_rows, lda, b, ldb, beta, c_rows, ldc);
    }
  });
}

void gemm(Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
          const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  split_rows(m, n, k, ta, a, lda, c, ldc, [&](int64_t rows, const double* a_rows, double* c_rows) {
    gemm_eigen<double>(ta, tb, rows, n, k, alpha, a_rows, lda, b, ldb, beta, c_rows, ldc);
  });
}

}  // namespace loom::ops::cpu
