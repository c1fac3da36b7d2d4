// Fused optimizer updates for CUDA parameters: one kernel launch updates many
// parameters of one dtype and device (up to 36 per launch), with the same
// arithmetic as the CPU loops in optim/optimizer.cpp. Tensors must be
// contiguous; gradients and state have the parameter's dtype and device.
// A build without CUDA throws "loom was built without CUDA".
#pragma once

#include <cstdint>
#include <vector>

#include <loom/core/tensor.h>
#include <loom/optim/grad_scaler_math.h>

namespace loom::optim::cuda {

struct SgdHyper {
  double lr, momentum, dampening, weight_decay;
  bool nesterov;
};

// For each i: step = g + wd * p; with momentum, buf = first_step[i] ? step :
// momentum * buf + (1 - dampening) * step and step = nesterov ? step +
// momentum * buf : buf; then p -= lr * step. `momentum_buffers` is empty when
// momentum is 0. With `skip_if` (GradScaler's i32 overflow flag on the
// parameters' GPU) the kernels leave everything as it is when it is non-zero:
// the skip of an overflowed step decided on the device.
// With `lr` (an f64 scalar on the parameters' GPU: Optimizer::keep_lr_on_device)
// the kernels read the learning rate from it instead of hyper.lr.
void sgd_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
              const std::vector<Tensor>& momentum_buffers, const std::vector<bool>& first_step, const SgdHyper& hyper,
              const Tensor& skip_if = Tensor(), const Tensor& lr = Tensor());

struct AdamHyper {
  double lr, beta1, beta2, eps, weight_decay;
  bool decoupled;  // AdamW: p *= 1 - lr * wd instead of g += wd * p
};

// For each i, at step count steps[i] (already incremented): PyTorch's Adam /
// AdamW update of params[i] and its moments. Where device_steps[i] is
// defined (an f64 scalar on the parameter's GPU: AdamMoments::device_step),
// the count is that one instead, advanced by one on the device first, and
// the bias corrections are computed there; `skip_if` and `lr` as sgd_step's
// (a skipped step advances no count). `device_steps` may be empty.
void adam_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, const std::vector<Tensor>& exp_avgs,
               const std::vector<Tensor>& exp_avg_sqs, const std::vector<int64_t>& steps, const AdamHyper& hyper,
               const std::vector<Tensor>& device_steps = {}, const Tensor& skip_if = Tensor(),
               const Tensor& lr = Tensor());

// GradScaler's unscale on the GPU: destinations[i] = sources[i] * factor (in
// f32, f64 for f64 sources) for contiguous destinations of f32 or the
// source's dtype; returns whether any product is inf or NaN. One launch per
// list of tensors; reading the flag waits for the device once.
[[nodiscard]] bool unscale_and_check(const std::vector<Tensor>& sources, const std::vector<Tensor>& destinations,
                                     double factor);
// The same with nothing read back (LOOM_CUDA_LOSS_SCALE=device): the factor
// is 1 / scale, read by the kernels from `scale` (an f64 scalar), and an inf
// or NaN sets `found_inf` (an i32 scalar, which the caller zeroed) to 1; both
// on the sources' GPU.
void unscale_and_check(const std::vector<Tensor>& sources, const std::vector<Tensor>& destinations,
                       const Tensor& scale, const Tensor& found_inf);

// GradScaler::update on the GPU: one single-thread kernel advances `schedule`
// on the scalars scale (f64), growth_tracker and skipped_steps (i64) by the
// flag found_inf (i32) and writes the new scale into loss_scale (f32) too.
void update_scale(const Tensor& scale, const Tensor& loss_scale, const Tensor& growth_tracker,
                  const Tensor& skipped_steps, const Tensor& found_inf, const ScaleSchedule& schedule);

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
