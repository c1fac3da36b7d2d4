// Learning-rate schedules with PyTorch's closed forms, each a function of the
// scheduler's step count t (last_epoch): StepLR (lr = base * gamma^(t /
// step_size)) and CosineAnnealingLR (lr = eta_min + (base - eta_min) * (1 +
// cos(pi * t / T_max)) / 2), stepped once per epoch in PyTorch's examples;
// LinearLR, OneCycleLR (per optimizer step in PyTorch) and SequentialLR
// (schedules one after another at milestones). `base` is the group's
// initial_lr (Optimizer::initial_lr). A checkpoint saves t alone.
// The Trainer steps a schedule per epoch or per optimizer step
// (TrainerOptions::scheduler_interval).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include <loom/core/options.h>
#include <loom/optim/optimizer.h>

namespace loom::optim {

// Sets every group's learning rate to schedule(group's initial rate, t), at
// construction (t = 0) and after every step.
class LRScheduler {
 public:
  // The rate of a group whose initial rate is `base_lr`, at step `t` (0 at the start).
  using Schedule = std::function<double(double base_lr, int64_t t)>;

  LRScheduler(Optimizer& optimizer, Schedule schedule);
  virtual ~LRScheduler() = default;
  // Advances one step (an epoch, or an optimizer step) and sets every group's learning rate.
  void step();
  int64_t last_epoch() const { return last_epoch_; }
  // Restores the position saved in a checkpoint and re-applies the rate.
  void set_last_epoch(int64_t epoch);
  const Schedule& schedule() const { return schedule_; }

 private:
  void apply();
  Optimizer& optimizer_;
  Schedule schedule_;
  std::vector<double> base_lrs_;
  int64_t last_epoch_ = 0;
};

class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
};

class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min = 0.0);
};

// torch.optim.lr_scheduler.LinearLR: lr = base * (start_factor + (end_factor
// - start_factor) * min(t, total_iters) / total_iters); a warm-up with the
// defaults (1/3 of the rate rising to all of it over 5 steps).
class LinearLR : public LRScheduler {
 public:
  explicit LinearLR(Optimizer& optimizer, double start_factor = 1.0 / 3, double end_factor = 1.0,
                    int64_t total_iters = 5);
};

enum class AnnealStrategy { cos, linear };

// OneCycleLROptions(0.1, 1000).pct_start(0.25), PyTorch's OneCycleLR arguments
// (three_phase=False; cycle_momentum is not implemented: momentum stays as set).
class OneCycleLROptions {
 public:
  OneCycleLROptions(double max_lr, int64_t total_steps) : max_lr_(max_lr), total_steps_(total_steps) {}
  // The peak rate of every group.
  LOOM_OPTION(double, max_lr);
  // Steps in the cycle; stepping past it throws, as PyTorch's does.
  LOOM_OPTION(int64_t, total_steps);
  // Share of the steps that raise the rate (default 0.3).
  LOOM_OPTION(double, pct_start) = 0.3;
  // cos (default) or linear annealing in both phases.
  LOOM_OPTION(AnnealStrategy, anneal_strategy) = AnnealStrategy::cos;
  // initial rate = max_lr / div_factor (default 25).
  LOOM_OPTION(double, div_factor) = 25;
  // minimum rate = initial rate / final_div_factor (default 1e4).
  LOOM_OPTION(double, final_div_factor) = 1e4;
};

// torch.optim.lr_scheduler.OneCycleLR (Smith and Topin), stepped after every
// optimizer step: from max_lr / div_factor up to max_lr over the first
// pct_start * total_steps - 1 steps, then down to initial / final_div_factor
// at step total_steps - 1, each phase annealed by
// cos: end + (start - end) * (1 + cos(pi * pct)) / 2, or linear.
class OneCycleLR : public LRScheduler {
 public:
  OneCycleLR(Optimizer& optimizer, const OneCycleLROptions& options);
};

// torch.optim.lr_scheduler.SequentialLR: schedules[i] runs from milestones[i
// - 1] (0 for the first) on, its own step count starting again at 0 there;
// lr(t) = schedules[i].schedule(base, t - milestones[i - 1]). Build the
// schedules over `optimizer`: only their schedule() is used, with the
// optimizer's initial rates (their own construction set rates SequentialLR
// replaces), and their step counts are not advanced. E.g. warm-up
// then cosine: SequentialLR(opt, {LinearLR(opt, 0.1, 1, 5), CosineAnnealingLR(opt, 95)}, {5}).
class SequentialLR : public LRScheduler {
 public:
  SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
               std::vector<int64_t> milestones);
};

}  // namespace loom::optim
