#include <loom/optim/lr_scheduler.h>

#include <cmath>

namespace loom::optim {

LRScheduler::LRScheduler(Optimizer& optimizer) : optimizer_(optimizer) {
  for (size_t g = 0; g < optimizer.num_groups(); ++g) base_lrs_.push_back(optimizer.lr(g));
}

void LRScheduler::step() {
  ++last_epoch_;
  apply();
}

void LRScheduler::set_last_epoch(int64_t epoch) {
  last_epoch_ = epoch;
  apply();
}

void LRScheduler::apply() {
  for (size_t g = 0; g < base_lrs_.size(); ++g) optimizer_.set_lr(g, lr_at(base_lrs_[g], last_epoch_));
}

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  LOOM_CHECK(step_size > 0, "StepLR: step_size must be positive, got ", step_size);
}

double StepLR::lr_at(double base_lr, int64_t epoch) const {
  return base_lr * std::pow(gamma_, static_cast<double>(epoch / step_size_));
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min)
    : LRScheduler(optimizer), t_max_(t_max), eta_min_(eta_min) {
  LOOM_CHECK(t_max > 0, "CosineAnnealingLR: T_max must be positive, got ", t_max);
}

double CosineAnnealingLR::lr_at(double base_lr, int64_t epoch) const {
  return eta_min_ + (base_lr - eta_min_) * (1 + std::cos(M_PI * static_cast<double>(epoch) / t_max_)) / 2;
}

}  // namespace loom::optim
