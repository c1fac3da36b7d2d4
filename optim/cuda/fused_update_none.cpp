// The fused CUDA optimizer updates of a build without CUDA: a clear error.
#include <loom/core/cuda/runtime.h>
#include <loom/optim/cuda/fused_update.h>

namespace loom::optim::cuda {

void sgd_step(const std::vector<Tensor>&, const std::vector<Tensor>&, const std::vector<Tensor>&,
              const std::vector<bool>&, const SgdHyper&, const Tensor&, const Tensor&) {
  ::loom::cuda::require_device(0);
}

void adam_step(const std::vector<Tensor>&, const std::vector<Tensor>&, const std::vector<Tensor>&,
               const std::vector<Tensor>&, const std::vector<int64_t>&, const AdamHyper&, const std::vector<Tensor>&,
               const Tensor&, const Tensor&) {
  ::loom::cuda::require_device(0);
}

bool unscale_and_check(const std::vector<Tensor>&, const std::vector<Tensor>&, double) {
  ::loom::cuda::require_device(0);
  return false;
}

void unscale_and_check(const std::vector<Tensor>&, const std::vector<Tensor>&, const Tensor&, const Tensor&) {
  ::loom::cuda::require_device(0);
}

void update_scale(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const ScaleSchedule&) {
  ::loom::cuda::require_device(0);
}

void copy_tensors(const std::vector<Tensor>&, const std::vector<Tensor>&) { ::loom::cuda::require_device(0); }

double norm_terms(const std::vector<Tensor>&, double) {
  ::loom::cuda::require_device(0);
  return 0;
}

void clamp_(const std::vector<Tensor>&, double) { ::loom::cuda::require_device(0); }

}  // namespace loom::optim::cuda
