// Learning-rate schedules stepped once per epoch, with PyTorch's closed forms:
// StepLR (lr = base * gamma^(epoch / step_size)) and CosineAnnealingLR
// (lr = eta_min + (base - eta_min) * (1 + cos(pi * epoch / T_max)) / 2).
#pragma once

#include <functional>
#include <vector>

#include <loom/optim/optimizer.h>

namespace loom::optim {

// Sets every group's learning rate to schedule(group's initial rate, epoch).
// StepLR and CosineAnnealingLR are LRSchedulers with a closed-form schedule.
class LRScheduler {
 public:
  // The rate of a group whose initial rate is `base_lr`, at `epoch` (0 at the start).
  using Schedule = std::function<double(double base_lr, int64_t epoch)>;

  LRScheduler(Optimizer& optimizer, Schedule schedule);
  virtual ~LRScheduler() = default;
  // Advances one epoch and sets every group's learning rate.
  void step();
  int64_t last_epoch() const { return last_epoch_; }
  // Restores the position saved in a checkpoint and re-applies the rate.
  void set_last_epoch(int64_t epoch);

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

}  // namespace loom::optim
