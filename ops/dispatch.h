// How an op reaches its kernel: CPU kernels in ops/cpu, CUDA kernels in
// ops/cuda (compiled only with the CUDA backend). Also the CPU compute-dtype rule.
#pragma once

#include <loom/core/autograd.h>
#include <loom/core/cuda/runtime.h>
#include <loom/core/tensor.h>

namespace loom::ops {

// True when `t` is on a CUDA device, so callers can write
//   on_cuda(x) ? LOOM_CUDA_KERNEL(cuda::relu_forward(x)) : cpu::relu_forward(x)
// A build without CUDA throws the one-line "built without CUDA" error instead;
// a build whose CUDA runtime exists but whose op kernels (ops/cuda) are not
// compiled in (LOOM_CUDA_OPS undefined) says that.
inline bool on_cuda(const Tensor& t) {
  if (!t.device().is_cuda()) return false;
#if !defined(LOOM_HAVE_CUDA)
  ::loom::cuda::require_device(t.device().index);
#elif !defined(LOOM_CUDA_OPS)
  throw Error("this build of loom has the CUDA runtime but not the CUDA op kernels (ops/cuda); use --device cpu");
#endif
  return true;
}

#if defined(LOOM_CUDA_OPS)
#define LOOM_CUDA_KERNEL(call) (call)
#else
#define LOOM_CUDA_KERNEL(call) (::loom::cuda::require_device(0), ::loom::Tensor())
#endif

// Checks that all defined tensors share `first`'s device and dtype.
void check_same_device_and_dtype(const char* op, const TensorList& tensors);

// CPU kernels compute in f32 or f64. f16 / bf16 inputs are converted to f32
// (contiguous) on the way in, and results converted back on the way out.
Tensor cpu_compute_input(const Tensor& t);
DType cpu_compute_dtype(DType t);

}  // namespace loom::ops
