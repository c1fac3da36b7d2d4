#include <loom/optim/lr_scheduler.h>

#include <cmath>
#include <utility>

namespace loom::optim {

LRScheduler::LRScheduler(Optimizer& optimizer, Schedule schedule)
    : optimizer_(optimizer), schedule_(std::move(schedule)) {
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
  for (size_t g = 0; g < base_lrs_.size(); ++g) optimizer_.set_lr(g, schedule_(base_lrs_[g], last_epoch_));
}

namespace {
// `value`, checked positive where a schedule captures it.
int64_t positive(int64_t value, const char* what) {
  LOOM_CHECK(value > 0, what, " must be positive, got ", value);
  return value;
}
}  // namespace

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer,
                  [step_size = positive(step_size, "StepLR: step_size"), gamma](double base_lr, int64_t epoch) {
                    return base_lr * std::pow(gamma, static_cast<double>(epoch / step_size));
                  }) {}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min)
    : LRScheduler(optimizer,
                  [t_max = positive(t_max, "CosineAnnealingLR: T_max"), eta_min](double base_lr, int64_t epoch) {
                    const double cosine = std::cos(M_PI * static_cast<double>(epoch) / t_max);
                    return eta_min + (base_lr - eta_min) * (1 + cosine) / 2;
                  }) {}

}  // namespace loom::optim
