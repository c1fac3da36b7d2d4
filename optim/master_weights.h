// f32 master copies of a model's parameters (apex O2): the model holds f16 or
// bf16 weights (batch norm's stay f32), the optimizer steps the f32 masters,
// and the model's weights are the masters rounded to their dtype after each
// step, so updates smaller than half an f16 ulp accumulate instead of being
// lost. Any optim::Optimizer works: construct it over masters().
//
//   MasterWeights masters(model.named_parameters());
//   optim::SGD sgd(masters.masters(), optim::SGDOptions(0.01));
//   ... backward ...
//   const Tensor found_inf = masters.load_gradients(scaler);
//   sgd.step_if_finite(found_inf);
//   scaler.update(found_inf);
//   masters.copy_to_model();
#pragma once

#include <string>
#include <vector>

#include <loom/nn/module.h>
#include <loom/optim/grad_scaler.h>

namespace loom::optim {

// Where the masters' values come from at the start of each step.
enum class MasterRefresh {
  // The masters persist between steps (apex O2, bf16): the model is their rounding.
  keep,
  // The masters are reloaded from the model before every step: a pure f16 /
  // bf16 model whose optimizer computes in f32 (apex O3). Updates below half
  // an ulp of the model's dtype are lost, as in pure f16 training.
  from_model,
};

// How copy_to_model writes CUDA parameters: one copy per parameter (the
// default, proven on GPUs) or fused, one launch per list of up to 36
// (optim/cuda/fused_update.h; not yet run on a GPU).
enum class MasterCopy { per_tensor, fused };
// LOOM_CUDA_MASTER_COPY: unset, empty or "per_tensor" is per_tensor, "fused"
// fused; anything else is a loom::Error naming the variable. Reads the
// environment on every call; copy_to_model reads it once per process.
MasterCopy master_copy_from_environment();

class MasterWeights {
 public:
  // One f32 master per parameter that requires grad, in the given order. The
  // masters are filled from the model on the first load_gradients() (after
  // DDP has broadcast rank 0's weights), unless load_state() restored them.
  explicit MasterWeights(const nn::NamedTensors& parameters, MasterRefresh refresh = MasterRefresh::keep);
  MasterWeights(const MasterWeights&) = delete;
  MasterWeights& operator=(const MasterWeights&) = delete;

  // The f32 leaves an optimizer is constructed over (requires_grad, contiguous).
  const std::vector<Tensor>& masters() const { return masters_; }
  const std::vector<std::string>& names() const { return names_; }
  // The model parameters they mirror (the same TensorImpls as the module's).
  const std::vector<Tensor>& model_parameters() const { return parameters_; }

  // masters = model parameters, exactly (every f16 / bf16 value is an f32 value).
  void copy_from_model();
  // Every master's .grad = its parameter's .grad / scale, in one pass that
  // checks for inf / NaN; a parameter without a gradient leaves its master
  // without one (the optimizer skips it). Returns the scaler's overflow flag
  // (GradScaler::unscale): the optimizer step must be skipped when it is set.
  [[nodiscard]] Tensor load_gradients(const GradScaler& scaler);
  // model parameters = masters rounded to nearest even in the parameters'
  // dtype, written in place (the module's and DDP's handles stay valid);
  // on GPUs as LOOM_CUDA_MASTER_COPY says. After a skipped step it writes the
  // values the model already holds.
  void copy_to_model();

  // "<parameter name>" -> f32 master, for a checkpoint's extra tensors.
  nn::NamedTensors state() const;
  // Restores the masters by name; every parameter must be present with its shape.
  void load_state(const nn::NamedTensors& state);

 private:
  void ensure_initialized();

  MasterRefresh refresh_;
  std::vector<std::string> names_;
  std::vector<Tensor> parameters_;
  std::vector<Tensor> masters_;
  std::vector<Tensor> master_grads_;  // persistent f32 gradient buffers
  bool initialized_ = false;
};

}  // namespace loom::optim
