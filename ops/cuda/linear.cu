// CUDA kernels of linear (ops/linear.h): the products through cublasGemmEx
// with fp32 accumulation (f64 for f64; TF32 for f32 only when
// cuda::allow_tf32()), the bias through small kernels.
//
// cuBLAS is column-major: it reads a row-major (r, c) matrix as its (c, r)
// transpose. With x (N, in), W (out, in), dy (N, out) row-major, and x', W',
// dy' those buffers as cuBLAS reads them ((in, N), (in, out), (out, N)):
//   y  = x · Wᵀ   is  yᵀ  (out, N)  = op_T(W') · x'
//   dx = dy · W   is  dxᵀ (in, N)   = W' · dy'
//   dW = dyᵀ · x  is  dWᵀ (in, out) = x' · op_T(dy')
#include <cublas_v2.h>

#include <loom/core/cuda/handles.h>
#include <loom/ops/cuda/common.cuh>
#include <loom/ops/linear.h>

namespace loom::ops::cuda {
using namespace cuda_detail;

namespace {

// y (N, out) += bias broadcast over rows.
template <class T>
static __global__ void add_bias_kernel(T* y, const T* bias, int64_t rows, int64_t features) {
  const int64_t n = rows * features;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    y[i] = from_acc<T>(to_acc(y[i]) + to_acc(bias[i % features]));
  }
}

// db[f] = sum over rows of dy[row, f]: one thread per feature, 8 row groups
// per block combined in shared memory (fixed order: deterministic).
constexpr int kBiasFeatures = 32, kBiasRowGroups = 8;
template <class T>
static __global__ void bias_grad_kernel(const T* dy, T* db, int64_t rows, int64_t features) {
  __shared__ acc_t<T> partial[kBiasRowGroups][kBiasFeatures];
  const int64_t f = static_cast<int64_t>(blockIdx.x) * kBiasFeatures + threadIdx.x;
  acc_t<T> total = 0;
  if (f < features) {
    for (int64_t r = threadIdx.y; r < rows; r += kBiasRowGroups) total += to_acc(dy[r * features + f]);
  }
  partial[threadIdx.y][threadIdx.x] = total;
  __syncthreads();
  if (threadIdx.y == 0 && f < features) {
    acc_t<T> sum = 0;
    for (int g = 0; g < kBiasRowGroups; ++g) sum += partial[g][threadIdx.x];
    db[f] = from_acc<T>(sum);
  }
}

struct GemmTypes {
  cudaDataType_t data;
  cublasComputeType_t compute;
  cudaDataType_t scale;  // of alpha and beta
};

GemmTypes gemm_types(DType t) {
  switch (t) {
    case DType::f64: return {CUDA_R_64F, CUBLAS_COMPUTE_64F, CUDA_R_64F};
    case DType::f16: return {CUDA_R_16F, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case DType::bf16: return {CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    default:
      return {CUDA_R_32F, ::loom::cuda::allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F};
  }
}

// Column-major C (m, n) = op(A) · op(B) (+ C when accumulate), all of `dtype`.
void gemm(const Tensor& like, cublasOperation_t op_a, cublasOperation_t op_b, int64_t m, int64_t n, int64_t k,
          const void* a, int64_t lda, const void* b, int64_t ldb, void* c, int64_t ldc) {
  LOOM_CHECK(m < INT32_MAX && n < INT32_MAX && k < INT32_MAX, "linear: a matrix dimension exceeds 2^31");
  const GemmTypes types = gemm_types(like.dtype());
  const double alpha_d = 1.0, beta_d = 0.0;
  const float alpha_f = 1.0f, beta_f = 0.0f;
  const bool f64 = types.scale == CUDA_R_64F;
  const void* alpha = f64 ? static_cast<const void*>(&alpha_d) : &alpha_f;
  const void* beta = f64 ? static_cast<const void*>(&beta_d) : &beta_f;
  cublasHandle_t handle = ::loom::cuda::cublas_handle(::loom::cuda::current_stream(like.device().index));
  ::loom::cuda::detail::count_library_call();
  LOOM_CHECK_CUBLAS(cublasGemmEx(handle, op_a, op_b, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                                 alpha, a, types.data, static_cast<int>(lda), b, types.data, static_cast<int>(ldb),
                                 beta, c, types.data, static_cast<int>(ldc), types.compute, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

Tensor linear_forward(const Tensor& input_in, const Tensor& weight_in, const Tensor& bias_in) {
  const auto device_guard = on_device_of("linear", input_in);
  const Tensor x = contiguous_input(input_in), w = contiguous_input(weight_in);
  const int64_t n = x.size(0), in = x.size(1), out = w.size(0);
  Tensor y = Tensor::empty({n, out}, x.dtype(), x.device());
  if (n == 0 || out == 0) return y;
  if (in == 0) {
    y.zero_();  // no input features: the output is the bias alone, as on the CPU
  } else {      // yᵀ (out, N) = op_T(W') · x'
    gemm(x, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, w.raw_data(), in, x.raw_data(), in, y.raw_data(), out);
  }
  if (bias_in.defined()) {
    const Tensor b = contiguous_input(bias_in);
    visit_float(x.dtype(), "linear", [&]<class T>() {
      add_bias_kernel<T><<<blocks_for(n * out), kThreads, 0, stream_of(x)>>>(y.data<T>(), b.data<T>(), n, out);
      LOOM_CHECK_LAUNCH();
    });
  }
  return y;
}

void linear_backward(const Tensor& grad_in, const Tensor& input_in, const Tensor& weight_in, bool want_input,
                     bool want_weight, bool want_bias, Tensor& grad_input, Tensor& grad_weight, Tensor& grad_bias) {
  const auto device_guard = on_device_of("linear backward", grad_in);
  const Tensor x = contiguous_input(input_in), w = contiguous_input(weight_in);
  const Tensor dy = contiguous_input(grad_in.dtype() == x.dtype() ? grad_in : grad_in.to(x.dtype()));
  const int64_t n = x.size(0), in = x.size(1), out = w.size(0);
  // Outputs the caller passed in (gradient destinations), written into where
  // they fit, as on the CPU; the kernels compute in the tensors' own dtype.
  const Tensor weight_out = fits_result(grad_weight, {out, in}, x.dtype(), x.device()) ? grad_weight : Tensor();
  const Tensor bias_out = fits_result(grad_bias, {out}, x.dtype(), x.device()) ? grad_bias : Tensor();
  grad_input = grad_weight = grad_bias = Tensor();
  if (want_input) {
    grad_input = Tensor::empty({n, in}, x.dtype(), x.device());
    if (out == 0) {
      grad_input.zero_();
    } else if (n > 0 && in > 0) {  // dxᵀ (in, N) = W' · dy'
      gemm(x, CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, w.raw_data(), in, dy.raw_data(), out, grad_input.raw_data(), in);
    }
  }
  if (want_weight) {
    grad_weight = weight_out.defined() ? weight_out : Tensor::empty({out, in}, x.dtype(), x.device());
    if (n == 0) {
      grad_weight.zero_();
    } else if (out > 0 && in > 0) {  // dWᵀ (in, out) = x' · op_T(dy')
      gemm(x, CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, x.raw_data(), in, dy.raw_data(), out, grad_weight.raw_data(), in);
    }
  }
  if (want_bias) {
    grad_bias = bias_out.defined() ? bias_out : Tensor::empty({out}, x.dtype(), x.device());
    if (out > 0) {
      visit_float(x.dtype(), "linear backward", [&]<class T>() {
        const dim3 block(kBiasFeatures, kBiasRowGroups);
        const unsigned blocks = static_cast<unsigned>((out + kBiasFeatures - 1) / kBiasFeatures);
        bias_grad_kernel<T><<<blocks, block, 0, stream_of(x)>>>(dy.data<T>(), grad_bias.data<T>(), n, out);
        LOOM_CHECK_LAUNCH();
      });
    }
  }
  // As on the CPU: gradients in the dtypes of what they belong to.
  if (grad_input.defined() && grad_input.dtype() != input_in.dtype()) grad_input = grad_input.to(input_in.dtype());
  if (grad_weight.defined() && grad_weight.dtype() != weight_in.dtype()) grad_weight = grad_weight.to(weight_in.dtype());
  if (grad_bias.defined() && grad_bias.dtype() != weight_in.dtype()) grad_bias = grad_bias.to(weight_in.dtype());
}

}  // namespace loom::ops::cuda
