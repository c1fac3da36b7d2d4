// Optimizers with PyTorch's update formulas and parameter groups: SGD
// (momentum, dampening, nesterov, weight decay), Adam and AdamW.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <loom/core/options.h>
#include <loom/core/tensor.h>
#include <loom/nn/module.h>

namespace loom::optim {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update of every parameter that has a gradient.
  virtual void step() = 0;
  // step() unless `found_inf`, GradScaler's overflow flag (an i32 scalar),
  // is non-zero: amp's skip of an overflowed step. An undefined flag (no
  // loss scaling) always steps. This default reads the flag, which on a GPU
  // waits for the step's unscale; SGD decides on the GPU where it can.
  virtual void step_if_finite(const Tensor& found_inf);
  // Drops the gradients (PyTorch 2's default), or zeroes them in place with
  // set_to_none = false.
  void zero_grad(bool set_to_none = true);

  size_t num_groups() const { return groups_.size(); }
  const std::vector<Tensor>& group_params(size_t group) const { return groups_.at(group).params; }
  double lr(size_t group = 0) const { return groups_.at(group).lr; }
  // Also writes the group's device rate (keep_lr_on_device), a fill queued
  // on that device's current stream.
  void set_lr(size_t group, double lr);
  void set_lr(double lr) {
    for (size_t g = 0; g < groups_.size(); ++g) set_lr(g, lr);
  }
  // Keeps every group's learning rate also as an f64 scalar tensor on
  // `device`, which set_lr updates and SGD's fused CUDA kernels read where
  // they run: a step captured as a CUDA graph (core/cuda/graph.h) then
  // follows the rates set between its replays (schedules, warm-up).
  void keep_lr_on_device(Device device);
  // The group's device rate; undefined unless keep_lr_on_device was called.
  const Tensor& lr_tensor(size_t group) const { return groups_.at(group).lr_tensor; }
  // Why a step of this optimizer cannot be captured as a CUDA graph, or
  // nothing when it can: its step must queue device work only, with every
  // value that changes between steps read from device memory. This default
  // says that the optimizer does not support capture.
  virtual std::optional<std::string> capture_refusal() const {
    return std::string("the optimizer's step uses host values that change every step (SGD's and Adam's can be "
                       "captured)");
  }
  // The rate every LR schedule of the group scales (PyTorch's
  // group['initial_lr']): the group's rate when the first schedule asked,
  // so that schedules built one after another (SequentialLR's) share it.
  double initial_lr(size_t group) {
    Group& g = groups_.at(group);
    if (!g.initial_lr) g.initial_lr = g.lr;
    return *g.initial_lr;
  }
  // Per-parameter state tensors (momentum buffers, Adam moments), named
  // "<group>.<index>.<kind>", and scalars such as the step count: what a
  // checkpoint saves and restores.
  virtual nn::NamedTensors state() const = 0;
  virtual void load_state(const nn::NamedTensors& state) = 0;
  // Makes state() complete on rank `to` of the optimizer's process group
  // before a checkpoint; collective for an optimizer whose state is spread
  // over ranks (dist::ZeroRedundancyOptimizer gathers it there), nothing for
  // one that holds all of it. The Trainer calls it on every rank.
  virtual void gather_state(int to) { (void)to; }

 protected:
  // Whether `found_inf` is on a GPU that holds every parameter with a
  // gradient: the kernels of a fused update can read it there.
  bool flag_on_parameters_gpu(const Tensor& found_inf) const;
  // The part of capture_refusal that SGD and Adam share: the rates kept on a
  // GPU that holds every parameter with a gradient; `who` names the optimizer.
  std::optional<std::string> rates_capture_refusal(const char* who) const;
  // The group's rate on a GPU (keep_lr_on_device), else undefined.
  Tensor gpu_lr(size_t group) const;

  struct Group {
    std::vector<Tensor> params;
    double lr;
    std::optional<double> initial_lr{};  // set by the first LR schedule
    Tensor lr_tensor{};                  // keep_lr_on_device's copy of lr
  };
  void add_group(std::vector<Tensor> params, double lr);
  std::vector<Group> groups_;
};

// What SGD and Adam share: each parameter group has its own Options
// (PyTorch's param_groups), checked by Options::check(), and each parameter a
// ParamState, empty until its first step, that state() names
// "<group>.<index>.<kind>" (ParamState::save and ParamState::load).
template <class Options, class ParamState>
class OptimizerWithGroups : public Optimizer {
 public:
  OptimizerWithGroups(std::vector<Tensor> params, const Options& options) {
    add_param_group(std::move(params), options);
  }
  // A further parameter group with its own options (PyTorch's param_groups).
  void add_param_group(std::vector<Tensor> params, const Options& options) {
    options.check();
    add_group(std::move(params), options.lr());
    options_.push_back(options);
    param_states_.emplace_back(groups_.back().params.size());
  }
  nn::NamedTensors state() const override {
    nn::NamedTensors out;
    for_each_param([&](size_t gi, size_t pi, const std::string& prefix) { param_states_[gi][pi].save(prefix, out); });
    return out;
  }
  void load_state(const nn::NamedTensors& state) override {
    for_each_param([&](size_t gi, size_t pi, const std::string& prefix) {
      param_states_[gi][pi].load(state, prefix, groups_[gi].params[pi]);
    });
  }
  void step() override { update(Tensor()); }

 protected:
  // One update of every parameter that has a gradient; with `skip_if`
  // (GradScaler's flag on their GPU) the fused kernels skip it when it is set.
  virtual void update(const Tensor& skip_if) = 0;
  // Whether lacks(state, group) holds for some parameter that has a gradient.
  template <class Lacks>
  bool any_with_gradient(Lacks&& lacks) const {
    for (size_t gi = 0; gi < param_states_.size(); ++gi) {
      for (size_t pi = 0; pi < param_states_[gi].size(); ++pi) {
        if (groups_[gi].params[pi].grad().defined() && lacks(param_states_[gi][pi], gi)) return true;
      }
    }
    return false;
  }

  std::vector<Options> options_;
  std::vector<std::vector<ParamState>> param_states_;  // per group, per parameter

 private:
  // Calls visit(group, index, "<group>.<index>.") for every parameter.
  template <class Visit>
  void for_each_param(Visit&& visit) const {
    for (size_t gi = 0; gi < param_states_.size(); ++gi) {
      for (size_t pi = 0; pi < param_states_[gi].size(); ++pi) {
        visit(gi, pi, std::to_string(gi) + "." + std::to_string(pi) + ".");
      }
    }
  }
};

// SGDOptions(0.1).momentum(0.9).weight_decay(5e-4), PyTorch's SGD.
class SGDOptions {
 public:
  explicit SGDOptions(double lr) : lr_(lr) {}
  // Throws loom::Error for a negative momentum or weight decay, or nesterov
  // without momentum or with dampening.
  void check() const;
  // Learning rate.
  LOOM_OPTION(double, lr);
  // Momentum factor (default 0: plain SGD).
  LOOM_OPTION(double, momentum) = 0;
  // Dampening of the momentum (default 0).
  LOOM_OPTION(double, dampening) = 0;
  // L2 penalty added to the gradient (default 0).
  LOOM_OPTION(double, weight_decay) = 0;
  // Nesterov momentum (default false).
  LOOM_OPTION(bool, nesterov) = false;
};

// A parameter's SGD state: its momentum buffer, undefined until its first
// step with momentum; saved as "momentum_buffer".
struct MomentumBuffer {
  Tensor buffer;
  void save(const std::string& prefix, nn::NamedTensors& out) const;
  void load(const nn::NamedTensors& state, const std::string& prefix, const Tensor& param);
};

class SGD : public OptimizerWithGroups<SGDOptions, MomentumBuffer> {
 public:
  using OptimizerWithGroups::OptimizerWithGroups;
  // Nothing once the rates are kept on the device, every parameter that has
  // a gradient is on it, and every momentum buffer is made (after a step).
  std::optional<std::string> capture_refusal() const override;
  // With the flag on the GPU that holds every parameter with a gradient, and
  // every momentum buffer already made, the fused kernels read the flag
  // where they run: nothing is read back. Otherwise (a first step makes the
  // buffers on the host's decision) the default.
  void step_if_finite(const Tensor& found_inf) override;

 private:
  bool buffers_made() const;
  void update(const Tensor& skip_if) override;
};

// AdamOptions(1e-3).betas(0.9, 0.999).weight_decay(0.01), PyTorch's Adam.
class AdamOptions {
 public:
  explicit AdamOptions(double lr = 1e-3) : lr_(lr) {}
  // Throws loom::Error for betas outside [0, 1) or a negative eps or weight decay.
  void check() const;
  // Decay rates of the first and second moment estimates.
  AdamOptions& betas(double b1, double b2) { beta1_ = b1; beta2_ = b2; return *this; }
  // Learning rate (default 1e-3).
  LOOM_OPTION(double, lr);
  // Decay rate of the first moment estimate (default 0.9).
  LOOM_OPTION(double, beta1) = 0.9;
  // Decay rate of the second moment estimate (default 0.999).
  LOOM_OPTION(double, beta2) = 0.999;
  // Added to the denominator (default 1e-8).
  LOOM_OPTION(double, eps) = 1e-8;
  // L2 penalty, or decoupled decay with decoupled_weight_decay (default 0).
  LOOM_OPTION(double, weight_decay) = 0;
  // AdamW: decoupled weight decay (p *= 1 - lr * wd) instead of L2 in the gradient.
  LOOM_OPTION(bool, decoupled_weight_decay) = false;
};

// A parameter's Adam state: its moment estimates, undefined until its first
// step, and its step count; saved as "exp_avg", "exp_avg_sq" and "step". On
// a GPU whose steps are skipped there (step_if_finite with a flag on the
// GPU) or captured (keep_lr_on_device), the count moves into `device_step`,
// an f64 scalar the fused kernels advance unless the step is skipped.
struct AdamMoments {
  Tensor exp_avg, exp_avg_sq;
  int64_t step = 0;
  Tensor device_step;  // when defined, it holds the count (`step` is stale)
  // The count, read from the device when it is there.
  int64_t count() const { return device_step.defined() ? static_cast<int64_t>(device_step.item()) : step; }
  void save(const std::string& prefix, nn::NamedTensors& out) const;
  void load(const nn::NamedTensors& state, const std::string& prefix, const Tensor& param);
};

class Adam : public OptimizerWithGroups<AdamOptions, AdamMoments> {
 public:
  using OptimizerWithGroups::OptimizerWithGroups;
  // With the flag on the GPU that holds every parameter with a gradient, the
  // fused kernels skip on it and advance the step counts on the device
  // (AdamMoments::device_step): nothing is read back. Otherwise the default.
  void step_if_finite(const Tensor& found_inf) override;
  // Nothing once the rates are on the GPU and every moment and device step
  // count is made (after a step).
  std::optional<std::string> capture_refusal() const override;

 private:
  void update(const Tensor& skip_if) override;
};

// torch.optim.AdamW's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8,
// weight_decay 1e-2, decoupled. The setters are AdamOptions':
// AdamWOptions(3e-4).weight_decay(0.05).
class AdamWOptions : public AdamOptions {
 public:
  explicit AdamWOptions(double lr = 1e-3) : AdamOptions(lr) {
    weight_decay(1e-2);
    decoupled_weight_decay(true);
  }
};

// torch.optim.AdamW: Adam whose weight decay is decoupled from the gradient
// (Loshchilov and Hutter), per step t and parameter p with gradient g:
//   p *= 1 - lr * weight_decay
//   m = beta1 m + (1 - beta1) g,  v = beta2 v + (1 - beta2) g^2
//   p -= lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
// Every group decouples, whatever decoupled_weight_decay says.
class AdamW : public Adam {
 public:
  explicit AdamW(std::vector<Tensor> params, const AdamOptions& options = AdamWOptions())
      : Adam(std::move(params), AdamOptions(options).decoupled_weight_decay(true)) {}
  void add_param_group(std::vector<Tensor> params, const AdamOptions& options) {
    Adam::add_param_group(std::move(params), AdamOptions(options).decoupled_weight_decay(true));
  }
};

// AdamW(params, AdamWOptions(lr).weight_decay(weight_decay)).
inline std::unique_ptr<Adam> make_adamw(std::vector<Tensor> params, double lr = 1e-3, double weight_decay = 1e-2) {
  return std::make_unique<AdamW>(std::move(params), AdamWOptions(lr).weight_decay(weight_decay));
}

}  // namespace loom::optim
