// Fused optimizer updates for CUDA parameters: one kernel launch updates many
// parameters of one dtype and device (up to 36 per launch), with the same
// arithmetic as the CPU loops in optim/optimizer.cpp. Tensors must be
// contiguous; gradients and state have the parameter's dtype and device.
// A build without CUDA throws "loom was built without CUDA".
#pragma once

#include <cstdint>
#include <vector>

#include <loom/core/tensor.h>

namespace loom::optim::cuda {

struct SgdHyper {
  double lr, momentum, dampening, weight_decay;
  bool nesterov;
};

// For each i: step = g + wd * p; with momentum, buf = first_step[i] ? step :
// momentum * buf + (1 - dampening) * step and step = nesterov ? step +
// momentum * buf : buf; then p -= lr * step. `momentum_buffers` is empty when
// momentum is 0.
void sgd_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
              const std::vector<Tensor>& momentum_buffers, const std::vector<bool>& first_step, const SgdHyper& hyper);

struct AdamHyper {
  double lr, beta1, beta2, eps, weight_decay;
  bool decoupled;  // AdamW: p *= 1 - lr * wd instead of g += wd * p
};

// For each i, at step count steps[i] (already incremented): PyTorch's Adam /
// AdamW update of params[i] and its moments.
void adam_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, const std::vector<Tensor>& exp_avgs,
               const std::vector<Tensor>& exp_avg_sqs, const std::vector<int64_t>& steps, const AdamHyper& hyper);

// GradScaler's unscale on the GPU: destinations[i] = sources[i] * factor (in
// f32, f64 for f64 sources) for contiguous destinations of f32 or the
// source's dtype; returns whether any product is inf or NaN. One launch per
// list of tensors; reading the flag waits for the device once.
[[nodiscard]] bool unscale_and_check(const std::vector<Tensor>& sources, const std::vector<Tensor>& destinations,
                                     double factor);

// destinations[i] = sources[i] in the destination's dtype, rounded as
// Tensor::copy_ rounds (to nearest even), for contiguous CUDA tensors of
// equal sizes, each pair on one device: one launch per list of up to 36
// pairs of one (device, source dtype, destination dtype) instead of one per
// pair. AMP's master -> model copy under LOOM_CUDA_MASTER_COPY=fused
// (optim/master_weights.h).
void copy_tensors(const std::vector<Tensor>& sources, const std::vector<Tensor>& destinations);

// Gradient clipping (optim/clip_grad.h) on the GPU. norm_terms: the terms of
// the p-norm of all `gradients` folded in f64 (Σ |g|^p, or max |g| for an
// infinite p; optim/clip_grad_math.h), per block on the device and the blocks
// in order on the host (deterministic); reading it waits for the device.
// clamp_: every element clamped to [-clip_value, clip_value] in place.
// Gradients are contiguous CUDA tensors of a floating dtype.
[[nodiscard]] double norm_terms(const std::vector<Tensor>& gradients, double norm_type);
void clamp_(const std::vector<Tensor>& gradients, double clip_value);

}  // namespace loom::optim::cuda
