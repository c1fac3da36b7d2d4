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

// Where a GradScaler on a GPU run keeps its scale and overflow flag
// (LOOM_CUDA_LOSS_SCALE, read by amp::MixedPrecisionOptimizer):
//   host    unset, empty or "host", the default, proven on GPUs: the state
//           lives on the CPU and every O1 / O2 step reads the overflow flag
//           back (one wait for the device per step);
//   device  the scale, its schedule and the flag stay on the GPU, SGD skips
//           an overflowed step there and nothing is read back (not yet run
//           on a GPU).
// Anything else is a loom::Error naming the variable and its values.
enum class LossScaleState { host, device };
LossScaleState loss_scale_state_from_environment();

class GradScaler {
 public:
  explicit GradScaler(const GradScalerOptions& options = {});

  // Moves the scale, its schedule and the overflow flags to `device` (they
  // start on the CPU). On a GPU, scale(), unscale() and update() then run
  // there without the host waiting; get_scale() and the counters read back.
  void to(Device device);
  Device device() const { return scale_.device(); }

  // loss * scale, recorded by autograd, computed in f32 (an f16 loss would
  // overflow at the default scale); the loss itself when disabled.
  Tensor scale(const Tensor& loss) const;

  // Divides the gradients by the scale into `destinations` (see
  // unscale_and_check) and returns the step's overflow flag: an i32 scalar on
  // device(), 1 when a quotient was inf or NaN, else 0. With the state on the
  // CPU and the gradients on a GPU, making it waited for the GPU. When
  // disabled it copies the gradients and returns an undefined tensor (nothing
  // was looked for).
  [[nodiscard]] Tensor unscale(const std::vector<Tensor>& gradients, const std::vector<Tensor>& destinations) const;

  // Advances the schedule (optim/grad_scaler_math.h) by a step whose
  // unscale() returned `found_inf`, where the state lives: on a GPU in one
  // kernel. Nothing happens when disabled.
  void update(const Tensor& found_inf);

  // These read the state back (on a GPU the host waits for it): for logs
  // and tests, not for every step.
  double get_scale() const;
  // Clean steps since the last change of the scale (PyTorch's growth tracker).
  int64_t growth_tracker() const;
  // Steps skipped for inf / NaN since construction (or the restored state).
  int64_t skipped_steps() const;
  bool enabled() const { return options_.enabled(); }
  const GradScalerOptions& options() const { return options_; }

  // "scale" (f64), "growth_tracker" and "skipped_steps" (i64) on the CPU:
  // what a checkpoint needs to continue the schedule exactly.
  nn::NamedTensors state() const;
  // Restores state(); throws naming a missing entry.
  void load_state(const nn::NamedTensors& state);

 private:
  GradScalerOptions options_;
  // Scalars on device(): the scale (f64), the same in f32 (what the loss is
  // multiplied by), the growth tracker and the skipped steps (i64).
  Tensor scale_, loss_scale_, growth_tracker_, skipped_steps_;
};

}  // namespace loom::optim
