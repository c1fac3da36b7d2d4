// The CPU matrix multiply under conv2d and linear:
//   C (m x n) = alpha * op(A) (m x k) * op(B) (k x n) + beta * C
// on row-major arrays with leading dimensions. f32 runs a packed AVX-512 or
// AVX2/FMA kernel when the CPU has one (chosen at run time, so the default
// build still runs on any x86-64) and Eigen otherwise; f64 runs Eigen.
#pragma once

#include <cstdint>

namespace loom::ops::cpu {

enum class Transpose : bool { no = false, yes = true };

// Single-threaded unless called outside a parallel region on a large problem,
// where it splits the rows of C across the thread team.
void gemm(Transpose transpose_a, Transpose transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void gemm(Transpose transpose_a, Transpose transpose_b, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc);

// op(A) (m x k) packed once for several products with different B: conv2d's
// weight, which the GEMMs over a batch's groups of images would otherwise
// each pack again. Only f32 under the AVX-512 kernel is packed, into the
// caller's `storage` of storage_size(m, k) elements, by the thread team;
// otherwise A is read at the product as gemm reads it. A and the storage
// must outlive the products.
template <class T>
struct PackedA {
  PackedA(Transpose transpose, int64_t m, int64_t k, const T* a, int64_t lda, T* storage);
  static int64_t storage_size(int64_t m, int64_t k);

  // Whether the constructor packs (f32 under the AVX-512 kernel). Where it
  // does, a caller may write op(A) in the packing's layout itself and adopt
  // it: for m a multiple of kStripRows, op(A)(i, p) lies at
  //   s * kSliceDepth * m + (i / kStripRows) * kStripRows * kc
  //     + (p - s * kSliceDepth) * kStripRows + i % kStripRows,
  // s = p / kSliceDepth, kc = min(kSliceDepth, k - s * kSliceDepth).
  static bool packs();
  static constexpr int64_t kSliceDepth = 256, kStripRows = 8;
  // op(A) already packed in that layout (packs() true, m a multiple of
  // kStripRows); A itself is not kept.
  static PackedA adopt(Transpose transpose, int64_t m, int64_t k, const T* packed);

  Transpose transpose;
  int64_t m, k;
  const T* a;
  int64_t lda;
  const T* packed = nullptr;  // null: not packed
};

// C (m x n) = alpha * op(A) · op(B) + beta * C, as gemm, with A packed
// beforehand. With A packed, the product is computed as C, never as Cᵀ.
void gemm(const PackedA<float>& a, Transpose transpose_b, int64_t n, float alpha, const float* b, int64_t ldb,
          float beta, float* c, int64_t ldc);
void gemm(const PackedA<double>& a, Transpose transpose_b, int64_t n, double alpha, const double* b, int64_t ldb,
          double beta, double* c, int64_t ldc);

// The row stride, at least `columns` floats, for a matrix built to be gemm's
// non-transposed B: one that the f32 kernels read in place. Rows a multiple
// of a large power of two apart alias in L1, and gemm packs such a B first
// (a copy of it); 16 floats more and it is read where it lies.
int64_t gemm_b_stride(int64_t columns);

// The f32 kernels: packed 8 x 32 tiles in 512-bit registers, packed 6 x 16
// tiles in 256-bit ones, or Eigen's product.
enum class GemmKernel { avx512, avx2_fma, eigen };

// The f32 kernel gemm runs: the widest this CPU has, unless the environment
// variable LOOM_CPU_GEMM names another (avx512, avx2-fma or eigen; read once)
// or set_gemm_kernel chose one. A name that is not a kernel, or one this CPU
// lacks, throws here, and so in gemm: the apps call this at start, so that
// the error comes before any work and not from inside a parallel region.
GemmKernel gemm_kernel();
const char* gemm_kernel_name(GemmKernel kernel);  // "avx512", "avx2-fma", "eigen"
const char* gemm_kernel_name();                   // of gemm_kernel()
bool gemm_kernel_supported(GemmKernel kernel);    // whether this CPU has it
// Makes every later f32 gemm run `kernel` (tests and benchmarks compare the
// kernels); throws when this CPU does not have it.
void set_gemm_kernel(GemmKernel kernel);

}  // namespace loom::ops::cpu
