#include <loom/optim/master_weights.h>

#include <algorithm>
#include <map>

#include <loom/core/autograd.h>
#include <loom/core/environment.h>
#include <loom/core/memory_format.h>
#include <loom/optim/cuda/fused_update.h>

namespace loom::optim {

MasterWeights::MasterWeights(const nn::NamedTensors& parameters, MasterRefresh refresh) : refresh_(refresh) {
  for (auto& [name, parameter] : parameters) {
    if (!parameter.requires_grad()) continue;
    LOOM_CHECK(is_floating(parameter.dtype()), "MasterWeights: parameter '", name, "' is ", parameter.str(),
               "; expected a floating-point parameter");
    LOOM_CHECK(in_a_memory_format(parameter), "MasterWeights: parameter '", name,
               "' is neither contiguous nor channels-last");
    names_.push_back(name);
    parameters_.push_back(parameter);
    // A master and its gradient lie as the parameter does (channels-last
    // too): the copies between them and the unscale run in memory order.
    const MemoryFormat format = memory_format_of(parameter);
    Tensor master = empty_with_format(parameter.sizes(), DType::f32, parameter.device(), format).zero_();
    master.set_requires_grad(true);
    masters_.push_back(master);
    master_grads_.push_back(empty_with_format(parameter.sizes(), DType::f32, parameter.device(), format).zero_());
  }
  LOOM_CHECK(!masters_.empty(), "MasterWeights: the model has no parameter that requires grad");
}

void MasterWeights::copy_from_model() {
  NoGradGuard no_grad;
  for (size_t i = 0; i < masters_.size(); ++i) masters_[i].copy_(parameters_[i]);
  initialized_ = true;
}

void MasterWeights::ensure_initialized() {
  if (!initialized_ || refresh_ == MasterRefresh::from_model) copy_from_model();
}

Tensor MasterWeights::load_gradients(const GradScaler& scaler) {
  ensure_initialized();
  std::vector<Tensor> gradients;
  gradients.reserve(parameters_.size());
  for (const Tensor& parameter : parameters_) gradients.push_back(parameter.grad());
  Tensor found_inf = scaler.unscale(gradients, master_grads_);
  for (size_t i = 0; i < masters_.size(); ++i) masters_[i].set_grad(gradients[i].defined() ? master_grads_[i] : Tensor());
  return found_inf;
}

MasterCopy master_copy_from_environment() {
  return environment_switch("LOOM_CUDA_MASTER_COPY", {"per_tensor", "the default: one copy per parameter"},
                            MasterCopy::per_tensor, {"fused", "one launch per 36 parameters, not yet proven on a GPU"},
                            MasterCopy::fused);
}

void MasterWeights::copy_to_model() {
  NoGradGuard no_grad;
  static const MasterCopy copy = master_copy_from_environment();
  const bool on_gpus = std::all_of(masters_.begin(), masters_.end(), [](const Tensor& m) { return m.device().is_cuda(); });
  if (copy == MasterCopy::fused && on_gpus) {
    cuda::copy_tensors(masters_, parameters_);
    return;
  }
  for (size_t i = 0; i < masters_.size(); ++i) parameters_[i].copy_(masters_[i]);
}

nn::NamedTensors MasterWeights::state() const {
  nn::NamedTensors out;
  // Before the first step the masters are not filled yet: they are the model.
  for (size_t i = 0; i < masters_.size(); ++i)
    out.emplace_back(names_[i], initialized_ ? masters_[i].detach() : parameters_[i].detach().to(DType::f32));
  return out;
}

void MasterWeights::load_state(const nn::NamedTensors& state) {
  std::map<std::string, const Tensor*> given;
  for (auto& [name, t] : state) given[name] = &t;
  NoGradGuard no_grad;
  for (size_t i = 0; i < masters_.size(); ++i) {
    auto it = given.find(names_[i]);
    LOOM_CHECK(it != given.end(), "master weights: the saved state has no master for parameter '", names_[i], "'");
    LOOM_CHECK(it->second->sizes() == masters_[i].sizes(), "master weights: '", names_[i], "' has shape ",
               shape_str(it->second->sizes()), " but the parameter has ", shape_str(masters_[i].sizes()));
    masters_[i].copy_(*it->second);
  }
  initialized_ = true;
}

}  // namespace loom::optim
