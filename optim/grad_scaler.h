// Dynamic loss scaling for f16 training (apex's DynamicLossScaler, PyTorch's
// GradScaler): the loss is multiplied by a scale so that small gradients do not
// flush to zero in f16; the gradients are divided by it again before the
// optimizer step, in one pass that also looks for inf / NaN. A step whose
// gradients overflowed is skipped and the scale halved; after
// `growth_interval` clean steps in a row the scale doubles.
//
// With DDP, unscale after the all-reduce (DistributedDataParallel::
// wait_for_gradients()): every rank then reads the same averaged gradients, so
// every rank takes the same skip decision and the replicas stay identical.
#pragma once

#include <cstdint>
#include <vector>

#include <loom/core/options.h>
#include <loom/core/tensor.h>
#include <loom/nn/module.h>

namespace loom::optim {

// GradScalerOptions().init_scale(1024).growth_interval(100)
class GradScalerOptions {
  // The first loss scale (default 2^16).
  LOOM_OPTION(double, init_scale) = 65536.0;
  // Factor applied after growth_interval steps without inf / NaN (default 2).
  LOOM_OPTION(double, growth_factor) = 2.0;
  // Factor applied after a step with inf / NaN gradients (default 0.5).
  LOOM_OPTION(double, backoff_factor) = 0.5;
  // Clean steps before the scale grows (default 2000).
  LOOM_OPTION(int64_t, growth_interval) = 2000;
  // Lower bound of the scale (default 1).
  LOOM_OPTION(double, min_scale) = 1.0;
  // Upper bound of the scale (default 2^24).
  LOOM_OPTION(double, max_scale) = 16777216.0;
  // A disabled scaler scales by 1, never checks and never skips (bf16, O0, O3).
  LOOM_OPTION(bool, enabled) = true;
};

// destinations[k][i] = sources[k][i] * factor for every pair k, in one pass
// over each source, and whether any product is inf or NaN. Sources are
// tensors of any floating dtype; destinations are tensors on the same device
// of the same numel, f32 or the source's dtype, and may be the sources
// themselves (in-place unscale). An undefined source is skipped. CUDA tensors
// go through fused kernels (optim/cuda/fused_update.h); reading their flag
// waits for the device.
[[nodiscard]] bool unscale_and_check(const std::vector<Tensor>& sources, const std::vector<Tensor>& destinations,
                                     double factor);

class GradScaler {
 public:
  explicit GradScaler(const GradScalerOptions& options = {});

  // loss * scale, recorded by autograd, computed in f32 (an f16 loss would
  // overflow at the default scale); the loss itself when disabled.
  Tensor scale(const Tensor& loss) const;

  // Divides the gradients by the scale into `destinations` (see
  // unscale_and_check) and returns whether any was inf or NaN. When disabled
  // it copies them and returns false.
  [[nodiscard]] bool unscale(const std::vector<Tensor>& gradients, const std::vector<Tensor>& destinations) const;

  // Advances the schedule after a step's unscale: on overflow the scale is
  // multiplied by backoff_factor (not below min_scale) and the count of clean
  // steps restarts; otherwise the count grows, and when it reaches
  // growth_interval the scale is multiplied by growth_factor (not above
  // max_scale) and the count restarts. Nothing happens when disabled.
  void update(bool found_inf);

  double get_scale() const { return enabled() ? scale_ : 1.0; }
  // Clean steps since the last change of the scale (PyTorch's growth tracker).
  int64_t growth_tracker() const { return growth_tracker_; }
  // Steps skipped for inf / NaN since construction (or the restored state).
  int64_t skipped_steps() const { return skipped_steps_; }
  bool enabled() const { return options_.enabled(); }
  const GradScalerOptions& options() const { return options_; }

  // "scale" (f64), "growth_tracker" and "skipped_steps" (i64): what a checkpoint
  // needs to continue the schedule exactly.
  nn::NamedTensors state() const;
  // Restores state(); throws naming a missing entry.
  void load_state(const nn::NamedTensors& state);

 private:
  GradScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t skipped_steps_ = 0;
};

}  // namespace loom::optim
