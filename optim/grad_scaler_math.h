// The loss-scale schedule of GradScaler (optim/grad_scaler.h), written once
// for the host update and the CUDA kernel that runs it on the device
// (optim/cuda/fused_update.cu, LOOM_CUDA_LOSS_SCALE=device).
#pragma once

#include <stdint.h>

#include <loom/core/host_device.h>

namespace loom::optim {

struct ScaleSchedule {
  double growth_factor, backoff_factor, min_scale, max_scale;
  int64_t growth_interval;

  // One step's update: on overflow the scale is multiplied by backoff_factor
  // (not below min_scale), the clean-step count restarts and the skipped
  // steps grow by one; otherwise the count grows, and when it reaches
  // growth_interval the scale is multiplied by growth_factor (not above
  // max_scale) and the count restarts.
  LOOM_HOST_DEVICE void advance(double& scale, int64_t& growth_tracker, int64_t& skipped_steps, bool found_inf) const {
    if (found_inf) {
      const double backed_off = scale * backoff_factor;
      scale = backed_off > min_scale ? backed_off : min_scale;
      growth_tracker = 0;
      ++skipped_steps;
      return;
    }
    if (++growth_tracker == growth_interval) {
      const double grown = scale * growth_factor;
      scale = grown < max_scale ? grown : max_scale;
      growth_tracker = 0;
    }
  }
};

}  // namespace loom::optim
