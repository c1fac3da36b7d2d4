// How an op reaches its kernel: CPU kernels in ops/cpu, CUDA kernels in
// ops/cuda (compiled only with the CUDA backend). Also the CPU compute-dtype rule.
#pragma once

#include <loom/core/autograd.h>
#include <loom/core/cuda/runtime.h>
#include <loom/core/tensor.h>

namespace loom::ops {

// The one way an op reaches its kernel: the kernel `name` of the backend that
// holds `tensor`, ops::cuda::name(args...) for a CUDA tensor and
// ops::cpu::name(args...) otherwise. Every kernel has a CPU and a CUDA twin
// declared together in ops/<op>.h with the same signature, so one line serves
// both backends:
//   Tensor y = LOOM_DISPATCH(x, relu_forward, x);
// For a CUDA tensor, a build without CUDA throws its one-line "built without
// CUDA" error, and a build with the CUDA runtime but without the op kernels
// (ops/cuda, LOOM_CUDA_OPS) says that; neither references the CUDA kernels.
#define LOOM_DISPATCH(tensor, name, ...)                                                          \
  (::loom::ops::on_cuda(tensor) ? LOOM_CUDA_KERNEL(::loom::ops::cuda::name(__VA_ARGS__)) \
                                : ::loom::ops::cpu::name(__VA_ARGS__))

// True when `t` is on a CUDA device whose op kernels this build has; throws
// the errors above otherwise. LOOM_DISPATCH's test.
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
// Never reached (on_cuda threw); has the call's type without calling it.
template <class Result>
[[noreturn]] Result cuda_kernels_not_built() {
  throw Error("this build of loom has no CUDA op kernels (ops/cuda)");
}
#define LOOM_CUDA_KERNEL(call) (::loom::ops::cuda_kernels_not_built<decltype(call)>())
#endif

// Checks that all defined tensors share `first`'s device and dtype.
void check_same_device_and_dtype(const char* op, const TensorList& tensors);

// CPU kernels compute in f32 or f64. f16 / bf16 inputs are converted to f32
// (contiguous) on the way in, and results converted back on the way out.
Tensor cpu_compute_input(const Tensor& t);
DType cpu_compute_dtype(DType t);

}  // namespace loom::ops
