#include <loom/ops/autocast.h>

namespace loom::ops {
namespace {
thread_local bool t_autocast_enabled = false;
thread_local DType t_autocast_dtype = DType::f16;

bool lowered(const Tensor& t) {
  return t.defined() && is_floating(t.dtype()) && t.dtype() != DType::f64 && t.dtype() != t_autocast_dtype;
}
}  // namespace

bool autocast_enabled() { return t_autocast_enabled; }
DType autocast_dtype() { return t_autocast_dtype; }

AutocastGuard::AutocastGuard(bool enabled, DType dtype)
    : previous_enabled_(t_autocast_enabled), previous_dtype_(t_autocast_dtype) {
  LOOM_CHECK(!enabled || dtype == DType::f16 || dtype == DType::bf16, "autocast: the lower precision must be f16 or bf16, got ",
             dtype_name(dtype));
  t_autocast_enabled = enabled;
  if (enabled) t_autocast_dtype = dtype;
}

AutocastGuard::~AutocastGuard() {
  t_autocast_enabled = previous_enabled_;
  t_autocast_dtype = previous_dtype_;
}

bool autocast_lowers(const TensorList& inputs) {
  if (!t_autocast_enabled) return false;
  for (const Tensor& t : inputs) {
    if (lowered(t)) return true;
  }
  return false;
}

Tensor autocast_lower(const Tensor& t) { return t_autocast_enabled && lowered(t) ? t.to(t_autocast_dtype) : t; }

bool autocast_raises(const Tensor& t) {
  return t_autocast_enabled && t.defined() && (t.dtype() == DType::f16 || t.dtype() == DType::bf16);
}

}  // namespace loom::ops
