// The CPU matrix multiply under conv2d and linear:
//   C (m x n) = alpha * op(A) (m x k) * op(B) (k x n) + beta * C
// on row-major arrays with leading dimensions. f32 runs a packed AVX2/FMA
// kernel when the CPU has it (chosen at run time, so the default build still
// runs on any x86-64) and Eigen otherwise; f64 runs Eigen.
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

// Which f32 kernel gemm uses on this CPU: "avx2-fma" or "eigen".
const char* gemm_kernel_name();

}  // namespace loom::ops::cpu
