// LinearLR, OneCycleLR and SequentialLR against sequences computed by hand
// (and with Python's math module) from PyTorch's closed forms; the rate of
// step 0 set at construction; a restored step count; bad arguments refused.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <vector>

#include <loom/core/error.h>
#include <loom/optim/lr_scheduler.h>
#include <loom/optim/optimizer.h>

using namespace loom;

namespace {
// The rates of steps 0 .. count - 1 (the one set at construction first).
std::vector<double> rates(optim::LRScheduler& scheduler, const optim::Optimizer& optimizer, int count) {
  std::vector<double> out = {optimizer.lr()};
  for (int t = 1; t < count; ++t) {
    scheduler.step();
    out.push_back(optimizer.lr());
  }
  return out;
}

void check_sequence(const std::vector<double>& actual, const std::vector<double>& expected) {
  REQUIRE(actual.size() == expected.size());
  for (size_t t = 0; t < expected.size(); ++t) {
    INFO("step ", t);
    CHECK(actual[t] == doctest::Approx(expected[t]).epsilon(1e-12));
  }
}

struct Parameters {
  Tensor p = Tensor::zeros({2}).set_requires_grad(true);
  optim::SGD sgd{{p}, optim::SGDOptions(0.1)};
};
}  // namespace

TEST_CASE("LinearLR: PyTorch's defaults, 1/3 of the rate to all of it over 5 steps") {
  Parameters s;
  optim::LinearLR linear(s.sgd);
  check_sequence(rates(linear, s.sgd, 8), {0.1 / 3, 0.1 * 7 / 15, 0.1 * 9 / 15, 0.1 * 11 / 15, 0.1 * 13 / 15, 0.1, 0.1, 0.1});
  Parameters d;
  optim::LinearLR decay(d.sgd, 1.0, 0.5, 4);  // to half over 4 steps
  check_sequence(rates(decay, d.sgd, 6), {0.1, 0.0875, 0.075, 0.0625, 0.05, 0.05});
  CHECK_THROWS_WITH_AS(optim::LinearLR(d.sgd, 0.0), doctest::Contains("0 < start_factor <= 1"), Error);
  CHECK_THROWS_WITH_AS(optim::LinearLR(d.sgd, 0.5, 1.0, 0), doctest::Contains("total_iters must be positive"), Error);
}

TEST_CASE("OneCycleLR: PyTorch's defaults over 10 steps, cosine and linear") {
  // max_lr 1: initial 1 / 25 = 0.04, minimum 0.04 / 1e4; the rise ends at
  // step 0.3 * 10 - 1 = 2, the fall at step 9.
  Parameters s;
  optim::OneCycleLR cycle(s.sgd, optim::OneCycleLROptions(1.0, 10));
  // Steps 3 to 10: 4e-6 + (1 - 4e-6) / 2 * (cos(pi * (t - 2) / 7) + 1), from Python.
  check_sequence(rates(cycle, s.sgd, 11),
                 {0.04, 0.52, 1.0, 0.9504846320134737, 0.8117456539497631, 0.6112620219362893, 0.38874197806371075,
                  0.18825834605023697, 0.049519367986526286, 4e-06, 0.04951936798652623});
  CHECK_THROWS_WITH_AS(cycle.step(), doctest::Contains("stepped 11 times, but total_steps is 10"), Error);

  Parameters l;
  optim::OneCycleLR linear(l.sgd, optim::OneCycleLROptions(2.0, 10).anneal_strategy(optim::AnnealStrategy::linear)
                                       .pct_start(0.5).div_factor(10).final_div_factor(100));
  // initial 0.2, peak 2 at step 4, minimum 0.002 at step 9.
  check_sequence(rates(linear, l.sgd, 10), {0.2, 0.65, 1.1, 1.55, 2.0, 2.0 - 1.998 * 0.2, 2.0 - 1.998 * 0.4,
                                            2.0 - 1.998 * 0.6, 2.0 - 1.998 * 0.8, 0.002});
  CHECK_THROWS_WITH_AS(optim::OneCycleLR(l.sgd, optim::OneCycleLROptions(1.0, 10).pct_start(0.1)),
                       doctest::Contains("pct_start * total_steps = 1 must be more than 1"), Error);
}

TEST_CASE("SequentialLR: LinearLR warm-up, then cosine from the milestone, over the optimizer's initial rate") {
  Parameters s;
  s.sgd.set_lr(1.0);
  auto warmup = std::make_shared<optim::LinearLR>(s.sgd, 0.1, 1.0, 5);  // sets the rate to 0.1 ...
  auto cosine = std::make_shared<optim::CosineAnnealingLR>(s.sgd, 10);   // ... but its base is still 1
  optim::SequentialLR sequence(s.sgd, {warmup, cosine}, {5});
  const double c1 = (1 + std::cos(M_PI / 10)) / 2;  // 0.9755282581475768
  check_sequence(rates(sequence, s.sgd, 7), {0.1, 0.28, 0.46, 0.64, 0.82, 1.0, c1});
  // A checkpoint's step count restores the rate (cosine at t - 5 = 10: 0).
  sequence.set_last_epoch(15);
  CHECK(s.sgd.lr() == doctest::Approx(0.0).epsilon(1e-12));
  CHECK_THROWS_WITH_AS(optim::SequentialLR(s.sgd, {warmup, cosine}, {}), doctest::Contains("need 1 milestones"),
                       Error);
}
