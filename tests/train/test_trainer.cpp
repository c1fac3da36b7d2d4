// loom::train::Trainer on a small model and a user's Dataset: the steps and
// hooks it runs, warm-up rates, a run stopped by a signal or by max_steps and
// resumed from its checkpoint ending bit for bit where an uninterrupted run
// ends, and a step function of the user's.
#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <vector>

#include "tests/support/finished_group.h"
#include "tests/support/generated_dataset.h"
#include "tests/support/temp_dir.h"
#include <loom/core/generator.h>
#include <loom/data/loader.h>
#include <loom/data/sampler.h>
#include <loom/nn/layers.h>
#include <loom/ops/elementwise.h>
#include <loom/ops/loss.h>
#include <loom/optim/amp.h>
#include <loom/optim/lr_scheduler.h>
#include <loom/optim/optimizer.h>
#include <loom/train/captured_step.h>
#include <loom/train/stop.h>
#include <loom/train/trainer.h>

namespace {

namespace fs = std::filesystem;
using namespace loom;

// 2x2 single-channel "images" whose class is the quadrant of their mean
// position: separable, so a linear model learns it.
int64_t quadrant_sample(int64_t index, float* pixels) {
  Generator random(static_cast<uint64_t>(index) + 17);
  const double x = 2 * random.uniform() - 1, y = 2 * random.uniform() - 1;
  const float values[4] = {static_cast<float>(x), static_cast<float>(y), static_cast<float>(x * y), 0.5f};
  for (int i = 0; i < 4; ++i) pixels[i] = values[i];
  return (x > 0 ? 1 : 0) + (y > 0 ? 2 : 0);
}
std::shared_ptr<loom::testing::GeneratedDataset> quadrants(int64_t size) {
  return std::make_shared<loom::testing::GeneratedDataset>("quadrants", size, data::SampleShape{1, 2, 2},
                                                           quadrant_sample);
}

struct Setup {
  std::shared_ptr<nn::Module> model;
  std::shared_ptr<amp::MixedPrecisionOptimizer> optimizer;
  data::DataLoader train_loader;
  data::DataLoader test_loader;
};

// The same model, optimizer and data every time (seeded).
Setup make_setup(double lr = 0.1) {
  manual_seed(5);
  auto model = std::make_shared<nn::Sequential>(
      std::initializer_list<std::shared_ptr<nn::Module>>{std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(4, 4)});
  std::shared_ptr<amp::MixedPrecisionOptimizer> optimizer = amp::initialize(
      *model,
      [lr](std::vector<Tensor> parameters) -> std::unique_ptr<optim::Optimizer> {
        return std::make_unique<optim::SGD>(std::move(parameters), optim::SGDOptions(lr).momentum(0.9));
      },
      amp::OptLevel::O0);
  auto train_set = quadrants(200), test_set = quadrants(64);
  data::DataLoader train_loader(train_set, data::DataLoaderOptions().batch_size(16).num_workers(1).seed(3),
                                std::make_shared<data::DistributedSampler>(200, 1, 0, /*shuffle=*/true, 3));
  data::DataLoader test_loader(test_set, data::DataLoaderOptions().batch_size(32));
  return {model, optimizer, std::move(train_loader), std::move(test_loader)};
}

std::vector<double> parameters_of(nn::Module& model) {
  std::vector<double> values;
  for (const Tensor& parameter : model.parameters()) {
    for (float v : parameter.contiguous().to_vector<float>()) values.push_back(v);
  }
  return values;
}

// Runs fit() with stdout going to a scratch file (the Trainer prints loss lines and "Saved ...").
train::FitResult quiet_fit(train::Trainer& trainer, data::DataLoader& train_data, data::DataLoader* test_data) {
  std::fflush(stdout);
  const int saved = ::dup(1);
  std::FILE* sink = std::tmpfile();
  ::dup2(::fileno(sink), 1);
  train::FitResult result;
  try {
    result = trainer.fit(train_data, test_data);
  } catch (...) {
    std::fflush(stdout);
    ::dup2(saved, 1);
    ::close(saved);
    std::fclose(sink);
    throw;
  }
  std::fflush(stdout);
  ::dup2(saved, 1);
  ::close(saved);
  std::fclose(sink);
  return result;
}

void restore_default_signals() {
  train::StopSignals::reset();
  ::signal(SIGTERM, SIG_DFL);
  ::signal(SIGINT, SIG_DFL);
  ::signal(SIGUSR1, SIG_DFL);
}

}  // namespace

TEST_SUITE("train.trainer") {
  TEST_CASE("fit runs every step of every epoch, calls the hooks, evaluates and learns") {
    restore_default_signals();  // test_checkpoints.cpp's signal test ran first
    Setup s = make_setup();
    int64_t steps_seen = 0, log_lines = 0, after_training = 0, after_evaluation = 0;
    std::vector<double> losses;
    train::Trainer trainer(s.model, s.optimizer, train::TrainerOptions().epochs(3).log_interval(5));
    trainer.on_step([&](const train::StepInfo& step) {
      ++steps_seen;
      CHECK(step.step == steps_seen);
      CHECK(step.steps_per_epoch == 13);  // ceil(200 / 16)
      CHECK(step.epoch_step == (steps_seen - 1) % 13 + 1);
      CHECK(step.epoch == (steps_seen - 1) / 13);
      losses.push_back(step.loss->item());
    });
    trainer.on_log([&](const train::StepInfo& step, double loss) {
      ++log_lines;
      CHECK(step.epoch_step % 5 == 0);
      CHECK(loss == doctest::Approx(step.loss->item()));
    });
    trainer.after_training([&](const train::FitResult& result) {
      ++after_training;
      CHECK_FALSE(result.accuracy.has_value());
    });
    trainer.after_evaluation([&](const train::FitResult& result) {
      ++after_evaluation;
      REQUIRE(result.accuracy.has_value());
    });
    const train::FitResult result = quiet_fit(trainer, s.train_loader, &s.test_loader);
    CHECK(result.stop_signal == 0);
    CHECK(result.exit_code() == 0);
    CHECK(steps_seen == 39);
    CHECK(result.steps == 39);
    CHECK(result.images == 600);
    CHECK(log_lines == 3 * 2);  // steps 5 and 10 of each epoch
    CHECK(after_training == 1);
    CHECK(after_evaluation == 1);
    REQUIRE(result.accuracy.has_value());
    CHECK(result.accuracy->total == 64);
    CHECK(result.accuracy->accuracy() > 0.8);  // chance is 0.25
    // The mean loss of the last epoch is well below the first's.
    double first = 0, last = 0;
    for (int i = 0; i < 13; ++i) first += losses[i], last += losses[26 + i];
    CHECK(last < 0.6 * first);
  }

  TEST_CASE("evaluate_each_epoch tests after every epoch; the last epoch's is the final evaluation") {
    Setup s = make_setup();
    std::vector<int64_t> epochs;
    std::vector<double> accuracies;
    train::Trainer trainer(s.model, s.optimizer, train::TrainerOptions().epochs(3).evaluate_each_epoch(true));
    trainer.after_epoch([&](int64_t epoch, const std::optional<dist::AccuracyCounts>& accuracy) {
      epochs.push_back(epoch);
      if (accuracy) {
        CHECK(accuracy->total == 64);
        accuracies.push_back(accuracy->accuracy());
      }
    });
    const train::FitResult result = quiet_fit(trainer, s.train_loader, &s.test_loader);
    CHECK(epochs == std::vector<int64_t>{0, 1, 2});
    CHECK(accuracies.size() == 2);  // epochs 1 and 2; epoch 3's is result.accuracy
    REQUIRE(result.accuracy.has_value());
    // Without the option and without records, no evaluation before the end.
    Setup t = make_setup();
    int64_t evaluated = 0;
    train::Trainer plain(t.model, t.optimizer, train::TrainerOptions().epochs(2));
    plain.after_epoch([&](int64_t, const std::optional<dist::AccuracyCounts>& accuracy) { evaluated += accuracy.has_value(); });
    quiet_fit(plain, t.train_loader, &t.test_loader);
    CHECK(evaluated == 0);
  }

  TEST_CASE("warm-up raises the rate linearly over the first steps, then holds the scheduled one") {
    Setup s = make_setup(0.08);
    std::vector<double> rates;
    train::Trainer trainer(s.model, s.optimizer, train::TrainerOptions().epochs(1).max_steps(6).warmup_steps(4));
    trainer.on_step([&](const train::StepInfo&) { rates.push_back(s.optimizer->optimizer().lr(0)); });
    quiet_fit(trainer, s.train_loader, nullptr);
    REQUIRE(rates.size() == 6);
    const double expected[] = {0.02, 0.04, 0.06, 0.08, 0.08, 0.08};
    for (size_t i = 0; i < 6; ++i) CHECK(rates[i] == doctest::Approx(expected[i]).epsilon(1e-12));
  }

  TEST_CASE("max_steps ends the run mid-epoch; max_steps_per_epoch ends each epoch early") {
    Setup s = make_setup();
    train::Trainer stops(s.model, s.optimizer, train::TrainerOptions().epochs(5).max_steps(20));
    CHECK(quiet_fit(stops, s.train_loader, nullptr).steps == 20);
    Setup t = make_setup();
    int64_t epochs_seen = 0;
    train::Trainer short_epochs(t.model, t.optimizer, train::TrainerOptions().epochs(3).max_steps_per_epoch(4));
    short_epochs.on_step([&](const train::StepInfo& step) {
      CHECK(step.steps_per_epoch == 4);
      if (step.epoch_step == 4) ++epochs_seen;
    });
    CHECK(quiet_fit(short_epochs, t.train_loader, nullptr).steps == 12);
    CHECK(epochs_seen == 3);
  }

  TEST_CASE("a run stopped by a signal resumes from its checkpoint and ends bit for bit as an uninterrupted one") {
    loom::testing::TempDir dir;
    // Uninterrupted: 2 epochs with an LR schedule.
    Setup a = make_setup();
    train::Trainer whole(a.model, a.optimizer, train::TrainerOptions().epochs(2));
    whole.scheduler(std::make_shared<optim::StepLR>(a.optimizer->optimizer(), 1, 0.5));
    quiet_fit(whole, a.train_loader, nullptr);
    const std::vector<double> expected = parameters_of(*a.model);

    // SIGUSR1 during step 17 (epoch 2, batch 4): every rank stops after it, with a checkpoint.
    const auto checkpoints = train::CheckpointOptions().directory(dir.path().string()).resume("auto");
    {
      Setup b = make_setup();
      train::Trainer first(b.model, b.optimizer, train::TrainerOptions().epochs(2).checkpoints(checkpoints));
      first.scheduler(std::make_shared<optim::StepLR>(b.optimizer->optimizer(), 1, 0.5));
      first.on_step([](const train::StepInfo& step) {
        if (step.step == 17) ::raise(SIGUSR1);
      });
      const train::FitResult stopped = quiet_fit(first, b.train_loader, nullptr);
      CHECK(stopped.stop_signal == SIGUSR1);
      CHECK(stopped.exit_code() == 128 + SIGUSR1);
      CHECK(stopped.steps == 17);
      CHECK(fs::exists(dir / "1GPU_step17.checkpoint"));
      CHECK(fs::exists(dir / "1GPU_1epoch.checkpoint"));
    }
    restore_default_signals();
    // A new process would start with a fresh generator; the resume restores it.
    manual_seed(12345);
    Setup c = make_setup();
    int64_t first_step = -1;
    train::Trainer second(c.model, c.optimizer, train::TrainerOptions().epochs(2).checkpoints(checkpoints));
    second.scheduler(std::make_shared<optim::StepLR>(c.optimizer->optimizer(), 1, 0.5));
    second.on_step([&](const train::StepInfo& step) {
      if (first_step < 0) first_step = step.step;
    });
    const train::FitResult resumed = quiet_fit(second, c.train_loader, nullptr);
    CHECK(first_step == 18);
    CHECK(resumed.steps == 26);
    CHECK(parameters_of(*c.model) == expected);
    restore_default_signals();
  }

  TEST_CASE("a step function of the user's computes the loss the Trainer steps on") {
    // A loss of zero gradient: SGD without weight decay leaves the parameters as they were.
    Setup s = make_setup();
    const std::vector<double> before = parameters_of(*s.model);
    int64_t calls = 0;
    train::Trainer trainer(s.model, s.optimizer, train::TrainerOptions().epochs(1).max_steps(3));
    trainer.step_function([&](nn::Module& model, const data::Batch& batch) {
      ++calls;
      return cross_entropy(model(batch.images), batch.labels) * 0.0;
    });
    const train::FitResult result = quiet_fit(trainer, s.train_loader, nullptr);
    CHECK(calls == 3);
    CHECK(result.steps == 3);
    CHECK(parameters_of(*s.model) == before);
    // The default step trains: the same run without it moves them.
    Setup t = make_setup();
    train::Trainer plain(t.model, t.optimizer, train::TrainerOptions().epochs(1).max_steps(3));
    quiet_fit(plain, t.train_loader, nullptr);
    CHECK(parameters_of(*t.model) != before);
    restore_default_signals();
  }

  TEST_CASE("bad options are refused with the option's name") {
    Setup s = make_setup();
    CHECK_THROWS_WITH_AS(train::Trainer(s.model, s.optimizer, train::TrainerOptions().log_interval(0)),
                         doctest::Contains("log_interval must be >= 1"), Error);
    CHECK_THROWS_WITH_AS(train::Trainer(s.model, s.optimizer, train::TrainerOptions().trace_path("/no/such/dir/t.json")),
                         doctest::Contains("/no/such/dir/t.json: cannot write this file"), Error);
    // A CUDA graph of the step needs the model on a GPU: refused before the first step.
    train::Trainer graphed(s.model, s.optimizer, train::TrainerOptions().cuda_graph(true));
    const std::vector<double> before = parameters_of(*s.model);
    CHECK_THROWS_WITH_AS(quiet_fit(graphed, s.train_loader, nullptr),
                         doctest::Contains("cuda_graph (--cuda-graph) needs the model on a GPU, not on cpu"), Error);
    CHECK(parameters_of(*s.model) == before);
    restore_default_signals();
  }

  TEST_CASE("a CUDA graph of the step: what makes the Trainer run the steps eagerly, said") {
    using train::CapturedStep;
    const Device gpu = Device::cuda(0);
    // What refusal() says, as a doctest string (doctest::Contains compares with it).
    const auto said = [](const std::optional<std::string>& why) { return doctest::String(why.value_or("").c_str()); };
    CHECK(CapturedStep::refusal(gpu, nullptr, false, 1, 0) == std::nullopt);
    CHECK(said(CapturedStep::refusal(Device::cpu(), nullptr, false, 1, 0)) == doctest::Contains("not a GPU"));
    // DDP: its all-reduces go into the graph where the group can be captured (nccl), not over gloo or shm.
    auto host_group = std::make_shared<loom::testing::FinishedGroup>();
    auto capturable = std::make_shared<loom::testing::FinishedGroup>();
    capturable->allow_capture();
    CHECK(CapturedStep::refusal(gpu, capturable.get(), false, 1, 0) == std::nullopt);
    CHECK(said(CapturedStep::refusal(gpu, host_group.get(), false, 1, 0)) ==
          doctest::Contains("DistributedDataParallel's all-reduces cannot be captured: the no-op process group "
                            "runs its collectives on the host"));
    CHECK(said(CapturedStep::refusal(gpu, capturable.get(), true, 1, 0)) ==
          doctest::Contains("uneven inputs (Join)"));
    CHECK(said(CapturedStep::refusal(gpu, nullptr, false, 4, 0)) == doctest::Contains("--accumulate-steps"));
    CHECK(said(CapturedStep::refusal(gpu, nullptr, false, 1, 1.0)) == doctest::Contains("--clip-grad-norm"));
    Setup s = make_setup();
    CHECK_THROWS_WITH_AS(CapturedStep(*s.model, *s.optimizer, {}, Device::cpu(), false),
                         doctest::Contains("CUDA graphs need a GPU, not cpu"), Error);
  }
}
