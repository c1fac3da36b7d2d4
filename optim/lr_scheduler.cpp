#include <loom/optim/lr_scheduler.h>

#include <algorithm>
#include <cmath>
#include <utility>

namespace loom::optim {

LRScheduler::LRScheduler(Optimizer& optimizer, Schedule schedule)
    : optimizer_(optimizer), schedule_(std::move(schedule)) {
  for (size_t g = 0; g < optimizer.num_groups(); ++g) base_lrs_.push_back(optimizer.initial_lr(g));
  apply();  // PyTorch's schedulers set the rate of step 0 when built
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

// One phase of OneCycleLR: from start to end as pct goes from 0 to 1.
double anneal(AnnealStrategy strategy, double start, double end, double pct) {
  if (strategy == AnnealStrategy::linear) return (end - start) * pct + start;
  return end + (start - end) / 2.0 * (std::cos(M_PI * pct) + 1);
}

LRScheduler::Schedule one_cycle(const OneCycleLROptions& o) {
  const int64_t total = positive(o.total_steps(), "OneCycleLR: total_steps");
  LOOM_CHECK(o.max_lr() > 0, "OneCycleLR: max_lr must be positive, got ", o.max_lr());
  LOOM_CHECK(o.pct_start() >= 0 && o.pct_start() <= 1, "OneCycleLR: pct_start must be in [0, 1], got ", o.pct_start());
  LOOM_CHECK(o.div_factor() > 0 && o.final_div_factor() > 0,
             "OneCycleLR: div_factor and final_div_factor must be positive");
  const double initial = o.max_lr() / o.div_factor(), minimum = initial / o.final_div_factor();
  // PyTorch's two phases: (end step, start rate, end rate).
  const double rise_end = o.pct_start() * static_cast<double>(total) - 1, fall_end = static_cast<double>(total) - 1;
  LOOM_CHECK(rise_end > 0 && rise_end < fall_end, "OneCycleLR: pct_start * total_steps = ",
             o.pct_start() * static_cast<double>(total), " must be more than 1 and less than total_steps");
  return [=, max_lr = o.max_lr(), strategy = o.anneal_strategy()](double, int64_t t) {
    LOOM_CHECK(t <= total, "OneCycleLR: stepped ", t, " times, but total_steps is ", total);
    const double step = static_cast<double>(t);
    if (step <= rise_end) return anneal(strategy, initial, max_lr, step / rise_end);
    return anneal(strategy, max_lr, minimum, (step - rise_end) / (fall_end - rise_end));
  };
}
LRScheduler::Schedule linear(double start_factor, double end_factor, int64_t total_iters) {
  LOOM_CHECK(start_factor > 0 && start_factor <= 1 && end_factor >= 0 && end_factor <= 1,
             "LinearLR: need 0 < start_factor <= 1 and 0 <= end_factor <= 1, got ", start_factor, " and ", end_factor);
  return [=, total = positive(total_iters, "LinearLR: total_iters")](double base_lr, int64_t t) {
    const double done = static_cast<double>(std::min(t, total)) / static_cast<double>(total);
    return base_lr * (start_factor + (end_factor - start_factor) * done);
  };
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

LinearLR::LinearLR(Optimizer& optimizer, double start_factor, double end_factor, int64_t total_iters)
    : LRScheduler(optimizer, linear(start_factor, end_factor, total_iters)) {}

OneCycleLR::OneCycleLR(Optimizer& optimizer, const OneCycleLROptions& options)
    : LRScheduler(optimizer, one_cycle(options)) {}

namespace {
LRScheduler::Schedule sequence(std::vector<std::shared_ptr<LRScheduler>> schedulers, std::vector<int64_t> milestones) {
  LOOM_CHECK(!schedulers.empty() && milestones.size() + 1 == schedulers.size(), "SequentialLR: ",
             schedulers.size(), " schedules need ", schedulers.size() > 0 ? schedulers.size() - 1 : 0,
             " milestones, got ", milestones.size());
  for (const auto& scheduler : schedulers) LOOM_CHECK(scheduler != nullptr, "SequentialLR: a schedule is null");
  LOOM_CHECK(std::is_sorted(milestones.begin(), milestones.end()) &&
                 (milestones.empty() || milestones.front() > 0),
             "SequentialLR: milestones must be positive and increasing");
  return [schedulers = std::move(schedulers), milestones = std::move(milestones)](double base_lr, int64_t t) {
    const size_t i = static_cast<size_t>(std::upper_bound(milestones.begin(), milestones.end(), t) - milestones.begin());
    const int64_t start = i == 0 ? 0 : milestones[i - 1];
    return schedulers[i]->schedule()(base_lr, t - start);
  };
}
}  // namespace

SequentialLR::SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
                           std::vector<int64_t> milestones)
    : LRScheduler(optimizer, sequence(std::move(schedulers), std::move(milestones))) {}

}  // namespace loom::optim
