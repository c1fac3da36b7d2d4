#include <loom/optim/amp.h>

#include <limits>

#include <loom/core/autograd.h>
#include <loom/core/enum_names.h>
#include <loom/optim/clip_grad.h>

namespace loom::amp {
namespace {
const std::string kMasterPrefix = "amp.master.";
const std::string kScalerPrefix = "amp.grad_scaler.";
const std::string kLevelKey = "amp.opt_level";
constexpr EnumNames<OptLevel, 5> kOptLevelNames{{{OptLevel::O0, "O0"},
                                                 {OptLevel::O1, "O1"},
                                                 {OptLevel::O2, "O2"},
                                                 {OptLevel::O3, "O3"},
                                                 {OptLevel::bf16, "bf16"}}};
}  // namespace

OptLevel parse_opt_level(const std::string& name) {
  if (auto level = kOptLevelNames.parse(name)) return *level;
  throw Error(str("unknown amp opt level '", name, "'; expected O0, O1, O2, O3 or bf16"));
}

const char* opt_level_name(OptLevel level) { return kOptLevelNames.name(level); }

Properties properties(OptLevel level) {
  // What each level changes from Properties' defaults (f32 weights, no autocast).
  switch (level) {
    case OptLevel::O0: return {};
    case OptLevel::O1: return {.autocast = true, .dynamic_loss_scale = true};
    case OptLevel::O2:
      return {.model_dtype = DType::f16, .autocast = true, .master_weights = true, .dynamic_loss_scale = true};
    case OptLevel::O3: return {.model_dtype = DType::f16, .keep_batchnorm_f32 = false, .autocast = true};
    case OptLevel::bf16:
      return {.model_dtype = DType::bf16, .autocast = true, .autocast_dtype = DType::bf16, .master_weights = true};
  }
  return {};
}

MixedPrecisionOptimizer::MixedPrecisionOptimizer(nn::Module& model, const OptimizerFactory& make_optimizer,
                                                 OptLevel level, const optim::GradScalerOptions& scaler_options)
    : level_(level),
      properties_(amp::properties(level)),
      scaler_(optim::GradScalerOptions(scaler_options).enabled(properties_.dynamic_loss_scale)) {
  LOOM_CHECK(make_optimizer != nullptr, "amp: the optimizer factory is empty");
  nn::NamedTensors trainable;
  for (auto& [name, parameter] : model.named_parameters()) {
    if (!parameter.requires_grad()) continue;
    const bool batch_norm_dtype = parameter.dtype() == DType::f32 && properties_.keep_batchnorm_f32;
    LOOM_CHECK(parameter.dtype() == properties_.model_dtype || batch_norm_dtype, "amp ", opt_level_name(level),
               ": parameter '", name, "' is ", parameter.str(), " but the level trains ",
               dtype_name(properties_.model_dtype), " weights; convert the model with amp::initialize");
    trainable.emplace_back(name, parameter);
    parameters_.push_back(parameter);
  }
  if (level == OptLevel::O2 || level == OptLevel::bf16) {
    masters_.emplace(trainable, optim::MasterRefresh::keep);
  } else if (level == OptLevel::O3) {
    masters_.emplace(trainable, optim::MasterRefresh::from_model);
  }
  optimizer_ = make_optimizer(masters_ ? masters_->masters() : parameters_);
  LOOM_CHECK(optimizer_ != nullptr, "amp: the optimizer factory returned no optimizer");
  // LOOM_CUDA_LOSS_SCALE=device: the scale and the overflow flags live on the parameters' GPU.
  if (scaler_.enabled() && !parameters_.empty() && parameters_.front().device().is_cuda() &&
      optim::loss_scale_state_from_environment() == optim::LossScaleState::device) {
    scaler_.to(parameters_.front().device());
  }
}

ops::AutocastGuard MixedPrecisionOptimizer::autocast() const {
  return ops::AutocastGuard(properties_.autocast, properties_.autocast_dtype);
}

void MixedPrecisionOptimizer::zero_grad() {
  unscaled_ = false;
  // Dropped, not zero-filled: the next backward's ops write each gradient
  // straight into its DDP bucket view or a fresh buffer, with no fill before
  // and no add after (two launches a parameter a step on a GPU).
  for (Tensor& parameter : parameters_) {
    if (parameter.grad().defined()) parameter.set_grad(Tensor());
  }
}

std::vector<Tensor> MixedPrecisionOptimizer::model_gradients() const {
  std::vector<Tensor> gradients;
  gradients.reserve(parameters_.size());
  for (const Tensor& parameter : parameters_) gradients.push_back(parameter.grad());
  return gradients;
}

const Tensor& MixedPrecisionOptimizer::unscale_flag() {
  if (unscaled_) return found_inf_;
  if (masters_) {
    found_inf_ = masters_->load_gradients(scaler_);
  } else if (scaler_.enabled()) {
    const std::vector<Tensor> gradients = model_gradients();
    found_inf_ = scaler_.unscale(gradients, gradients);  // in place: the weights are the masters
  } else {
    found_inf_ = Tensor();
  }
  unscaled_ = true;
  return found_inf_;
}

bool MixedPrecisionOptimizer::unscale_gradients() {
  const Tensor& found_inf = unscale_flag();
  return found_inf.defined() && found_inf.item() != 0;
}

double MixedPrecisionOptimizer::clip_grad_norm(double max_norm, double norm_type) {
  // An overflowed step is skipped: its norm is not finite, and nothing is clipped.
  if (unscale_gradients()) return std::numeric_limits<double>::infinity();
  const double total_norm = optim::get_total_norm(stepped_parameters(), norm_type);
  optim::clip_grads_with_norm_(stepped_parameters(), max_norm, total_norm);
  return total_norm;
}

void MixedPrecisionOptimizer::step() {
  const Tensor found_inf = unscale_flag();
  unscaled_ = false;
  last_found_inf_ = found_inf;
  if (found_inf.defined()) scaler_.update(found_inf);
  optimizer_->step_if_finite(found_inf);
  // After a skipped step the masters are unchanged and the model already
  // holds their rounding: the copy rewrites the same values, and needs no
  // decision on the host.
  if (masters_) masters_->copy_to_model();
}

void MixedPrecisionOptimizer::save_state(nn::TrainingState& state) const {
  state.optimizer = optimizer_->state();
  if (masters_) {
    for (auto& [name, master] : masters_->state()) state.extra_tensors.emplace_back(kMasterPrefix + name, master);
  }
  for (auto& [name, value] : scaler_.state()) state.extra_tensors.emplace_back(kScalerPrefix + name, value);
  state.extra_metadata[kLevelKey] = opt_level_name(level_);
}

void MixedPrecisionOptimizer::check_compatible(const nn::TrainingState& state) const {
  auto saved = state.extra_metadata.find(kLevelKey);
  if (saved == state.extra_metadata.end()) {
    LOOM_CHECK(level_ == OptLevel::O0, "amp ", opt_level_name(level_),
               ": the checkpoint holds no mixed-precision state (it was written without --amp); resume it without "
               "--amp or with --amp O0");
    return;
  }
  LOOM_CHECK(saved->second == opt_level_name(level_), "amp: the checkpoint was written with --amp ", saved->second,
             " but this run uses --amp ", opt_level_name(level_), "; resume with --amp ", saved->second);
}

void MixedPrecisionOptimizer::load_state(const nn::TrainingState& state) {
  check_compatible(state);
  optimizer_->load_state(state.optimizer);
  nn::NamedTensors masters, scaler;
  for (auto& [name, t] : state.extra_tensors) {
    if (name.starts_with(kMasterPrefix)) masters.emplace_back(name.substr(kMasterPrefix.size()), t);
    if (name.starts_with(kScalerPrefix)) scaler.emplace_back(name.substr(kScalerPrefix.size()), t);
  }
  if (masters_) masters_->load_state(masters);
  if (state.extra_metadata.contains(kLevelKey)) scaler_.load_state(scaler);
}

std::unique_ptr<MixedPrecisionOptimizer> initialize(nn::Module& model, const OptimizerFactory& make_optimizer,
                                                    OptLevel level, const optim::GradScalerOptions& scaler_options) {
  const Properties p = properties(level);
  if (p.model_dtype != DType::f32) {
    std::vector<std::string> keep;
    if (p.keep_batchnorm_f32) keep = {"BatchNorm2d", "SyncBatchNorm"};
    model.to(p.model_dtype, keep);
  }
  return std::make_unique<MixedPrecisionOptimizer>(model, make_optimizer, level, scaler_options);
}

}  // namespace loom::amp
