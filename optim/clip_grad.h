// Gradient clipping with PyTorch's torch.nn.utils semantics: clip_grad_norm_
// (and its halves get_total_norm / clip_grads_with_norm_) and
// clip_grad_value_, in place on the parameters' .grad, CPU and CUDA tensors.
//
//   loss.backward();                                   // with DDP: the averaged gradients
//   double norm = optim::clip_grad_norm_(model.parameters(), 1.0);
//   optimizer.step();
//
// Under mixed precision the gradients must be unscaled first: call
// amp::MixedPrecisionOptimizer::clip_grad_norm (optim/amp.h), which unscales
// once (GradScaler.unscale_), clips the f32 master gradients and lets step()
// skip an overflowed step. Parameters whose .grad is undefined are skipped.
#pragma once

#include <limits>
#include <vector>

#include <loom/core/tensor.h>

namespace loom::optim {

constexpr double kInfinityNorm = std::numeric_limits<double>::infinity();

// The p-norm of all the gradients together, as if concatenated into one
// vector: (Σ |g|^p)^(1/p) for a finite p > 0, max |g| for p = kInfinityNorm;
// 0 without gradients. Accumulated in f64 whatever the gradients' dtype. A
// NaN gradient gives NaN, an inf one +inf. Throws for p <= 0 or NaN.
// CUDA gradients: reading the result waits for the device.
[[nodiscard]] double get_total_norm(const std::vector<Tensor>& parameters, double norm_type = 2.0);

// Multiplies every gradient by clip_coef = max_norm / (total_norm + 1e-6)
// when that is below 1 (PyTorch clamps it to 1 and multiplies; a factor of 1
// is left out here, which changes no value). A non-finite total_norm gives a
// coefficient of NaN (NaN norm: every gradient becomes NaN) or 0 (+inf norm:
// finite entries become 0, infinite ones NaN), as PyTorch's default
// error_if_nonfinite=false does. Throws for a negative or NaN max_norm.
void clip_grads_with_norm_(const std::vector<Tensor>& parameters, double max_norm, double total_norm);

// torch.nn.utils.clip_grad_norm_: get_total_norm, then clip_grads_with_norm_;
// returns the total norm before clipping. With error_if_nonfinite, a NaN or
// infinite total norm throws (naming it) and leaves the gradients as they
// are; by default they are scaled anyway (see clip_grads_with_norm_).
double clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);

// torch.nn.utils.clip_grad_value_: every gradient element clamped to
// [-clip_value, clip_value] in place (NaN stays NaN). Throws for a negative or
// NaN clip_value.
void clip_grad_value_(const std::vector<Tensor>& parameters, double clip_value);

}  // namespace loom::optim
