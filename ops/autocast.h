// Autocast: a per-thread mode (PyTorch's torch.autocast, what amp O1 uses) in
// which the matrix ops, conv2d and linear, compute in a lower precision (f16 or
// bf16) whatever the dtype of their inputs, and the losses, cross_entropy and
// log_softmax, and layer_norm compute in f32. The casts are ordinary autograd ops, so
// gradients flow back to the f32 weights in their own dtype. Ops not listed
// here run in the dtype they are given.
#pragma once

#include <loom/core/autograd.h>
#include <loom/core/tensor.h>

namespace loom::ops {

bool autocast_enabled();
// The lower precision of the current autocast region (f16 or bf16).
DType autocast_dtype();

// Turns autocast on (or off) for this thread until the guard is destroyed:
//   { ops::AutocastGuard autocast(true, DType::f16); loss = cross_entropy(model(x), y); }
class AutocastGuard {
 public:
  explicit AutocastGuard(bool enabled, DType dtype = DType::f16);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool previous_enabled_;
  DType previous_dtype_;
};

// What conv2d and linear ask: true when autocast is on and some defined input
// is a floating-point tensor other than f64 (kept for gradient checks) whose
// dtype differs from autocast_dtype().
bool autocast_lowers(const TensorList& inputs);
// `t` cast to autocast_dtype() when autocast_lowers({t}); else `t` itself.
Tensor autocast_lower(const Tensor& t);
// What the losses and layer_norm ask: true when autocast is on and `t` is f16 or bf16.
bool autocast_raises(const Tensor& t);

}  // namespace loom::ops
