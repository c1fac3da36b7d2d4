// Mixed-precision training with apex's opt levels. amp::initialize converts
// the model for the level and builds the optimizer over the tensors it must
// step; the returned MixedPrecisionOptimizer scales the loss, unscales and
// checks the gradients, skips overflowed steps and keeps the masters:
//
//   apex                                            loom
//   model, optimizer = amp.initialize(              auto optimizer = amp::initialize(*model,
//       model, optimizer, opt_level='O2')               make_sgd, amp::OptLevel::O2);
//   model = DDP(model)                              auto ddp = make_shared<DistributedDataParallel>(model);
//   with amp.scale_loss(loss, optimizer)            optimizer->scale_loss(loss).backward();
//       as scaled_loss: scaled_loss.backward()      ddp->wait_for_gradients();
//   clip_grad_norm_(amp.master_params(optimizer),   optimizer->clip_grad_norm(1.0);  // optional
//                   1.0)
//   optimizer.step()                                optimizer->step();
//
// and the forward pass and loss run under optimizer->autocast(), which
// computes the loss in f32 (apex casts the model's output to f32) and, at O1,
// runs conv2d and linear in f16.
//
//   level  weights                 compute                      optimizer steps      loss scale
//   O0     f32                     f32                          the weights          none
//   O1     f32                     f16 conv/linear (autocast),  the weights          dynamic
//                                  f32 BN, softmax, loss
//   O2     f16, BN f32             f16, BN and loss in f32      f32 masters          dynamic
//   O3     f16, BN too             f16, loss in f32             f32 copies refreshed  none
//                                                               from the model (no masters)
//   bf16   bf16, BN f32            bf16, BN and loss in f32     f32 masters          none
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <loom/nn/checkpoint.h>
#include <loom/nn/module.h>
#include <loom/ops/autocast.h>
#include <loom/optim/grad_scaler.h>
#include <loom/optim/master_weights.h>
#include <loom/optim/optimizer.h>

namespace loom::amp {

enum class OptLevel { O0, O1, O2, O3, bf16 };
// "O0", "O1", "O2", "O3" or "bf16"; throws loom::Error listing them otherwise.
OptLevel parse_opt_level(const std::string& name);
const char* opt_level_name(OptLevel level);

// What a level means (apex's Properties).
struct Properties {
  DType model_dtype = DType::f32;     // the parameters' dtype after initialize
  bool keep_batchnorm_f32 = true;     // BatchNorm2d / SyncBatchNorm keep f32 parameters and statistics
  bool autocast = false;              // forward under ops::AutocastGuard
  DType autocast_dtype = DType::f16;  // its lower precision
  bool master_weights = false;        // the optimizer steps f32 copies
  bool dynamic_loss_scale = false;    // GradScaler enabled
};
Properties properties(OptLevel level);

// The dtype the input batches should have: the model's (f32 at O0 and O1).
inline DType input_dtype(OptLevel level) { return properties(level).model_dtype; }

// Builds the optimizer over the tensors it is handed (the f32 masters, or the
// model's parameters at O0 / O1).
using OptimizerFactory = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor> parameters)>;

class MixedPrecisionOptimizer {
 public:
  // Prefer amp::initialize. `model` must already have the level's dtypes.
  MixedPrecisionOptimizer(nn::Module& model, const OptimizerFactory& make_optimizer, OptLevel level,
                          const optim::GradScalerOptions& scaler_options);
  MixedPrecisionOptimizer(const MixedPrecisionOptimizer&) = delete;
  MixedPrecisionOptimizer& operator=(const MixedPrecisionOptimizer&) = delete;

  // The forward pass and loss of a training (or evaluation) step run under
  // this guard: { auto autocast = optimizer->autocast(); loss = ...; }
  [[nodiscard]] ops::AutocastGuard autocast() const;
  // loss * the current loss scale (f32); call backward() on it.
  Tensor scale_loss(const Tensor& loss) const { return scaler_.scale(loss); }
  // Drops the model's gradients (PyTorch's zero_grad(set_to_none=True)): a
  // parameter the next backward does not reach has none, and the optimizer
  // skips it. Under DDP the next backward writes into the bucket views again.
  void zero_grad();
  // After backward (and after DDP's wait_for_gradients()): unscales the
  // gradients (into the masters' at O2 / O3 / bf16) checking for inf / NaN,
  // unless unscale_gradients() already did this step, advances the loss-scale
  // schedule, and unless a gradient overflowed steps the optimizer
  // (Optimizer::step_if_finite) and rounds the masters into the model.
  // With the loss scale on the GPU (LOOM_CUDA_LOSS_SCALE=device) and SGD the
  // host never waits for the device here; last_step_skipped() says whether
  // it skipped.
  void step();
  // GradScaler.unscale_: unscales the gradients into the tensors the
  // optimizer steps (stepped_parameters()' .grad) once per step; a second
  // call before step() or zero_grad() does nothing. Returns whether a
  // gradient overflowed (step() will skip: on every rank, since under DDP
  // every rank unscales the same averaged gradients), which on a GPU waits
  // for the unscale.
  bool unscale_gradients();
  // optim::clip_grad_norm_ between backward (DDP's wait included) and step():
  // unscales first (unscale_gradients), then clips the unscaled gradients the
  // optimizer steps (the f32 masters at O2 / O3 / bf16) and returns their
  // total norm. After an overflow it returns infinity without computing the
  // norm and leaves the gradients as they are: step() skips that step.
  double clip_grad_norm(double max_norm, double norm_type = 2.0);
  // The tensors the wrapped optimizer steps: the masters, or the model's
  // trainable parameters at O0 / O1.
  const std::vector<Tensor>& stepped_parameters() const { return masters_ ? masters_->masters() : parameters_; }

  OptLevel level() const { return level_; }
  const Properties& properties() const { return properties_; }
  // The wrapped optimizer: learning rate, LR schedulers, its state.
  optim::Optimizer& optimizer() { return *optimizer_; }
  const optim::Optimizer& optimizer() const { return *optimizer_; }
  const optim::GradScaler& scaler() const { return scaler_; }
  // Moves the loss scale's state to `device` (GradScaler::to): onto the
  // parameters' GPU for steps without a host sync, as a CUDA graph's capture
  // needs (LOOM_CUDA_LOSS_SCALE=device does this at construction).
  void place_loss_scale(Device device) { scaler_.to(device); }
  // Null at O0 and O1.
  const optim::MasterWeights* master_weights() const { return masters_ ? &*masters_ : nullptr; }
  // Whether the last step() skipped its update for inf / NaN gradients; with
  // the loss scale on a GPU this reads its flag back (the host waits).
  bool last_step_skipped() const { return last_found_inf_.defined() && last_found_inf_.item() != 0; }

  // Writes the optimizer's state into state.optimizer and the masters
  // ("amp.master.<parameter>"), the loss scaler ("amp.grad_scaler.<field>") and
  // the level ("amp.opt_level" metadata) into the extra entries, so that a
  // resumed run continues bit for bit.
  void save_state(nn::TrainingState& state) const;
  // Throws, naming both levels, unless `state` was saved at this level; one
  // without amp entries (written without --amp) passes at O0 only. Call it
  // before loading the model's weights, whose dtypes depend on the level.
  void check_compatible(const nn::TrainingState& state) const;
  // Restores what save_state wrote, after check_compatible().
  void load_state(const nn::TrainingState& state);

 private:
  std::vector<Tensor> model_gradients() const;
  // The step's overflow flag (GradScaler::unscale), unscaling first unless
  // done since the last step() / zero_grad(); undefined without loss scaling.
  const Tensor& unscale_flag();

  OptLevel level_;
  Properties properties_;
  std::vector<Tensor> parameters_;  // the model's trainable parameters
  std::optional<optim::MasterWeights> masters_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  optim::GradScaler scaler_;
  bool unscaled_ = false;  // unscale_flag() ran since the last step() / zero_grad()
  Tensor found_inf_;       // what it found
  Tensor last_found_inf_;  // the flag of the last step()
};

// apex's amp.initialize: converts `model` to the level's dtypes (in place;
// keep_batchnorm_f32 keeps BatchNorm2d and SyncBatchNorm in f32) and builds
// the optimizer. Call it before wrapping the model in DistributedDataParallel
// and before building anything that holds the model's parameter handles.
// The loss-scale options apply at O1 and O2 (the levels that scale the loss).
std::unique_ptr<MixedPrecisionOptimizer> initialize(nn::Module& model, const OptimizerFactory& make_optimizer,
                                                    OptLevel level,
                                                    const optim::GradScalerOptions& scaler_options = {});

}  // namespace loom::amp
