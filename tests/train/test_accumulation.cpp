// Gradient accumulation and gradient clipping in the Trainer: K batches per
// optimizer step equal one step on a K times larger batch (world 1, and two
// real processes under DDP against a one-process run on the whole batch);
// the epoch's leftover batches make one step of their own; checkpoints and
// stops happen between optimizer steps, so a stopped run resumes exactly;
// clip_grad_norm limits the update and reports the norm before clipping; a
// schedule stepped per optimizer step (OneCycleLR) counts steps, not batches;
// --cuda-graph's ranks replay only when every rank captured the step.
#include <doctest/doctest.h>

#include <signal.h>

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "tests/dist/multiprocess.h"
#include "tests/train/signs.h"
#include "tests/support/temp_dir.h"
#include <loom/core/generator.h>
#include <loom/data/loader.h>
#include <loom/data/sampler.h>
#include <loom/nn/layers.h>
#include <loom/ops/loss.h>
#include <loom/optim/amp.h>
#include <loom/optim/lr_scheduler.h>
#include <loom/optim/optimizer.h>
#include <loom/train/captured_step.h>
#include <loom/train/stop.h>
#include <loom/train/trainer.h>

namespace {

using namespace loom;
using namespace std::chrono_literals;
using train::testing::relative_difference;
using train::testing::Signs;
constexpr int64_t kSamples = Signs::kSize;

struct Run {
  std::shared_ptr<nn::Module> model;
  std::shared_ptr<amp::MixedPrecisionOptimizer> optimizer;
  data::DataLoader loader;
};

// The same initial model every time; batches of `batch_size` from rank
// `rank`'s shard of `world` (one shuffled order for every world size).
Run make_run(int64_t batch_size, int world = 1, int rank = 0, double lr = 0.2, double momentum = 0.9) {
  manual_seed(11);
  auto model = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(4, 3)});
  std::shared_ptr<amp::MixedPrecisionOptimizer> optimizer = amp::initialize(
      *model,
      [=](std::vector<Tensor> parameters) -> std::unique_ptr<optim::Optimizer> {
        return std::make_unique<optim::SGD>(std::move(parameters), optim::SGDOptions(lr).momentum(momentum));
      },
      amp::OptLevel::O0);
  data::DataLoader loader(std::make_shared<Signs>(), data::DataLoaderOptions().batch_size(batch_size).num_workers(0),
                          std::make_shared<data::DistributedSampler>(kSamples, world, rank, /*shuffle=*/true, 4));
  return {model, optimizer, std::move(loader)};
}

std::vector<double> values_of(nn::Module& model) {
  std::vector<double> values;
  for (const Tensor& parameter : model.parameters()) {
    for (double v : parameter.to_vector<double>()) values.push_back(v);
  }
  return values;
}

// f32 sums in another order: the runs differ by about 1e-7 after 14 steps
// (measured 2026-12-06); a missing division or all-reduce moves them by > 1e-3.
constexpr double kTolerance = 1e-5;

train::TrainerOptions quiet() { return train::TrainerOptions().log_interval(1000).stop_signal(0); }

}  // namespace

// Rank r of 2: K = 2 batches of 8 per step under DDP, and alone the whole
// step's 32 images (both ranks' 2 x 8) as one batch; the models agree.
LOOM_DIST_SCENARIO("accumulate_two_ranks") {
  auto group = dist::init_process_group(dist::InitOptions().init_method("env://").timeout(30s));
  Run reference = make_run(32);
  train::Trainer alone(reference.model, reference.optimizer, quiet().epochs(2));
  alone.fit(reference.loader);

  Run ranks = make_run(8, group->size(), group->rank());
  int64_t steps = 0;
  train::Trainer accumulating(ranks.model, ranks.optimizer, quiet().epochs(2).accumulate_steps(2).process_group(group));
  accumulating.on_step([&](const train::StepInfo& step) {
    ++steps;
    dist::testing::expect(step.steps_per_epoch == 7, "steps per epoch ", step.steps_per_epoch);  // 13 batches of 8 per rank
  });
  const train::FitResult result = accumulating.fit(ranks.loader);
  dist::testing::expect(result.steps == 14 && steps == 14, "steps ", result.steps);
  const double difference = relative_difference(values_of(*ranks.model), values_of(*reference.model));
  dist::testing::expect(difference < kTolerance, "rank ", group->rank(), ": the parameters differ by ", difference);
  group->barrier()->wait();
}

// --cuda-graph's agreement after the capture (train::detail::agree_on_capture),
// over gloo: rank 1's capture failed, so every rank runs eagerly; with every
// capture done, every rank replays.
LOOM_DIST_SCENARIO("capture_agreement") {
  auto group = dist::init_process_group(dist::InitOptions().init_method("env://").timeout(30s));
  const int rank = group->rank();
  const std::optional<std::string> mine =
      rank == 1 ? std::optional<std::string>("a host sync in the step") : std::nullopt;
  const std::optional<std::string> agreed = train::detail::agree_on_capture(*group, mine);
  const std::string expected = rank == 1 ? "a host sync in the step"
                                         : "another rank's capture of the step failed, so every rank runs eagerly";
  dist::testing::expect(agreed == expected, "rank ", rank, " agreed on: ", agreed.value_or("(replay)"));
  dist::testing::expect(train::detail::agree_on_capture(*group, std::nullopt) == std::nullopt, "rank ", rank,
                        ": every capture succeeded, yet it runs eagerly");
  group->barrier()->wait();
}

TEST_SUITE("accumulation") {
  TEST_CASE("K = 2 batches of 16 per step equal batches of 32, the leftover batch a step of its own") {
    Run whole = make_run(32);
    std::vector<double> expected_losses;
    train::Trainer one(whole.model, whole.optimizer, quiet().epochs(2));
    one.on_step([&](const train::StepInfo& step) { expected_losses.push_back(step.loss->item()); });
    one.fit(whole.loader);  // 7 steps per epoch: 6 of 32 and one of 8

    Run split = make_run(16);
    std::vector<double> losses;
    std::vector<int64_t> epoch_steps;
    train::Trainer accumulating(split.model, split.optimizer, quiet().epochs(2).accumulate_steps(2));
    accumulating.on_step([&](const train::StepInfo& step) {
      CHECK(step.steps_per_epoch == 7);  // 13 batches: 6 pairs and the last batch of 8
      epoch_steps.push_back(step.epoch_step);
      losses.push_back(step.loss->item());
    });
    const train::FitResult result = accumulating.fit(split.loader);
    CHECK(result.steps == 14);
    CHECK(result.images == 400);
    CHECK(epoch_steps == std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7});
    CHECK(relative_difference(values_of(*split.model), values_of(*whole.model)) < kTolerance);
    CHECK(relative_difference(losses, expected_losses) < kTolerance);  // a step's loss: the mean of its batches'
    // Batches of 16 stepped one by one give another model: the comparison can tell.
    Run summed = make_run(16);
    train::Trainer plain(summed.model, summed.optimizer, quiet().epochs(2).max_steps_per_epoch(7));
    plain.fit(summed.loader);
    CHECK(relative_difference(values_of(*summed.model), values_of(*whole.model)) > 1e-3);
  }

  TEST_CASE("--cuda-graph: the ranks run the graph only when every rank captured it") {
    for (const auto& rank : dist::testing::spawn_ranks("capture_agreement", 3, {.deadline = 60s}))
      CHECK_MESSAGE(rank.ok(), rank.describe());
    auto alone = dist::testing::world_of_one();
    CHECK(train::detail::agree_on_capture(*alone, std::nullopt) == std::nullopt);
    CHECK(train::detail::agree_on_capture(*alone, std::string("why")) == std::optional<std::string>("why"));
  }

  TEST_CASE("two ranks, K = 2 batches of 8 each: equal to one process on batches of 32") {
    for (const auto& rank : dist::testing::spawn_ranks("accumulate_two_ranks", 2, {.deadline = 90s}))
      CHECK_MESSAGE(rank.ok(), rank.describe());
  }

  TEST_CASE("max_steps, warm-up and checkpoints count optimizer steps; a stop waits for the step's end") {
    loom::testing::TempDir dir;
    Run whole = make_run(16);
    train::Trainer uninterrupted(whole.model, whole.optimizer, quiet().epochs(2).accumulate_steps(3).warmup_steps(4));
    uninterrupted.fit(whole.loader);
    const std::vector<double> expected = values_of(*whole.model);

    // 13 batches an epoch: 5 steps (4 of 3 batches, 1 of 1). SIGUSR1 during
    // batch 15, the second of step 6: the run ends after step 6 (batch 16).
    const auto checkpoints = train::CheckpointOptions().directory(dir.path().string()).resume("auto").every_steps(4);
    const auto options = quiet().epochs(2).accumulate_steps(3).warmup_steps(4).checkpoints(checkpoints);
    {
      Run first = make_run(16);
      int64_t batches = 0;
      train::Trainer stopped(first.model, first.optimizer, train::TrainerOptions(options).stop_signal(SIGUSR1));
      stopped.step_function([&](nn::Module& model, const data::Batch& batch) {
        if (++batches == 15) ::raise(SIGUSR1);
        return cross_entropy(model(batch.images), batch.labels);
      });
      const train::FitResult result = stopped.fit(first.loader);
      CHECK(result.stop_signal == SIGUSR1);
      CHECK(result.steps == 6);
      CHECK(batches == 16);
      CHECK(std::filesystem::exists(dir / "1GPU_step4.checkpoint"));  // after batch 12
      CHECK(std::filesystem::exists(dir / "1GPU_step6.checkpoint"));  // the stop's
      CHECK(std::filesystem::exists(dir / "1GPU_1epoch.checkpoint"));
    }
    train::StopSignals::reset();
    ::signal(SIGUSR1, SIG_DFL);
    manual_seed(999);
    Run second = make_run(16);
    int64_t first_step = -1;
    train::Trainer resumed(second.model, second.optimizer, options);
    resumed.on_step([&](const train::StepInfo& step) {
      if (first_step < 0) first_step = step.step;
    });
    CHECK(resumed.fit(second.loader).steps == 10);
    CHECK(first_step == 7);
    CHECK(values_of(*second.model) == expected);
    // max_steps counts optimizer steps.
    Run capped = make_run(16);
    train::Trainer three(capped.model, capped.optimizer, quiet().epochs(2).accumulate_steps(3).max_steps(3));
    CHECK(three.fit(capped.loader).images == 9 * 16);
  }

  TEST_CASE("clip_grad_norm limits each update and reports the norm before clipping") {
    // Plain SGD with lr 1: the update is the (clipped) gradient.
    Run free = make_run(32, 1, 0, 1.0, 0.0);
    const std::vector<double> start = values_of(*free.model);
    train::Trainer unclipped(free.model, free.optimizer, quiet().max_steps(1));
    unclipped.fit(free.loader);
    double norm = 0;
    const std::vector<double> moved = values_of(*free.model);
    for (size_t i = 0; i < start.size(); ++i) norm += (moved[i] - start[i]) * (moved[i] - start[i]);
    norm = std::sqrt(norm);
    REQUIRE(norm > 0.01);

    Run clipped = make_run(32, 1, 0, 1.0, 0.0);
    double reported = -1;
    train::Trainer clipping(clipped.model, clipped.optimizer, quiet().max_steps(1).clip_grad_norm(0.01));
    clipping.on_step([&](const train::StepInfo& step) { reported = step.grad_norm; });
    clipping.fit(clipped.loader);
    CHECK(reported == doctest::Approx(norm).epsilon(1e-5));
    const std::vector<double> after = values_of(*clipped.model);
    double update = 0;
    for (size_t i = 0; i < start.size(); ++i) {
      update += (after[i] - start[i]) * (after[i] - start[i]);
      CHECK(after[i] - start[i] == doctest::Approx((moved[i] - start[i]) * 0.01 / (norm + 1e-6)).epsilon(1e-4));
    }
    CHECK(std::sqrt(update) == doctest::Approx(0.01).epsilon(1e-4));
  }

  TEST_CASE("a OneCycleLR stepped per optimizer step: one rate per step, whatever the batches per step") {
    Run run = make_run(8);  // 25 batches: 13 steps in the epoch
    std::vector<double> used;  // the rate each batch trained with
    train::Trainer trainer(run.model, run.optimizer,
                           quiet().max_steps(10).accumulate_steps(2).scheduler_interval(train::SchedulerInterval::step));
    trainer.scheduler(std::make_shared<optim::OneCycleLR>(run.optimizer->optimizer(), optim::OneCycleLROptions(1.0, 10)));
    trainer.step_function([&](nn::Module& model, const data::Batch& batch) {
      used.push_back(run.optimizer->optimizer().lr());
      return cross_entropy(model(batch.images), batch.labels);
    });
    trainer.fit(run.loader);
    // tests/nn/test_lr_schedules.cpp's sequence for max_lr 1 over 10 steps, each rate for two batches.
    const std::vector<double> cycle = {0.04, 0.52, 1.0, 0.9504846320134737, 0.8117456539497631, 0.6112620219362893,
                                       0.38874197806371075, 0.18825834605023697, 0.049519367986526286, 4e-06};
    REQUIRE(used.size() == 20);
    for (size_t i = 0; i < used.size(); ++i) CHECK(used[i] == doctest::Approx(cycle[i / 2]).epsilon(1e-12));
  }

  TEST_CASE("bad accumulation and clipping options are refused with their names") {
    Run s = make_run(16);
    CHECK_THROWS_WITH_AS(train::Trainer(s.model, s.optimizer, quiet().accumulate_steps(0)),
                         doctest::Contains("accumulate_steps must be >= 1, got 0"), Error);
    CHECK_THROWS_WITH_AS(train::Trainer(s.model, s.optimizer, quiet().clip_grad_norm(-1)),
                         doctest::Contains("clip_grad_norm must be >= 0"), Error);
  }
}
