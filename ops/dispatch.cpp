#include <loom/ops/dispatch.h>

namespace loom::ops {

void check_same_device_and_dtype(const char* op, const TensorList& tensors) {
  const Tensor* first = nullptr;
  for (const Tensor& t : tensors) {
    if (!t.defined()) continue;
    if (first == nullptr) {
      first = &t;
      continue;
    }
    LOOM_CHECK(t.device() == first->device(), op, ": tensors on different devices (", first->device().str(),
               " and ", t.device().str(), ")");
    LOOM_CHECK(t.dtype() == first->dtype(), op, ": tensors of different dtypes (", dtype_name(first->dtype()),
               " and ", dtype_name(t.dtype()), ")");
  }
}

DType cpu_compute_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

Tensor cpu_compute_input(const Tensor& t) {
  NoGradGuard no_grad;
  return t.to(cpu_compute_dtype(t.dtype())).contiguous();
}

}  // namespace loom::ops
