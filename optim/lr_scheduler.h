// Learning-rate schedules stepped once per epoch, with PyTorch's closed forms:
// StepLR (lr = base * gamma^(epoch / step_size)) and CosineAnnealingLR
// (lr = eta_min + (base - eta_min) * (1 + cos(pi * epoch / T_max)) / 2).
#pragma once

#include <vector>

#include <loom/optim/optimizer.h>

namespace loom::optim {

class LRScheduler {
 public:
  explicit LRScheduler(Optimizer& optimizer);
  virtual ~LRScheduler() = default;
  // Advances one epoch and sets every group's learning rate.
  void step();
  int64_t last_epoch() const { return last_epoch_; }
  // Restores the position saved in a checkpoint and re-applies the rate.
  void set_last_epoch(int64_t epoch);

 protected:
  virtual double lr_at(double base_lr, int64_t epoch) const = 0;

 private:
  void apply();
  Optimizer& optimizer_;
  std::vector<double> base_lrs_;
  int64_t last_epoch_ = 0;
};

class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);

 protected:
  double lr_at(double base_lr, int64_t epoch) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min = 0.0);

 protected:
  double lr_at(double base_lr, int64_t epoch) const override;

 private:
  int64_t t_max_;
  double eta_min_;
};

}  // namespace loom::optim
