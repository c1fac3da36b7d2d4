// The Trainer on uneven inputs (TrainerOptions::join): two real processes,
// rank 0 with 12 batches an epoch and rank 1 with 9 (three fewer; also the
// other way round), finish two epochs without hanging; their parameters and
// SGD momentum equal one process computing each step's averaged gradient
// itself (divided by the world, PyTorch's default, or by the ranks that had
// batches in the step), with 1 and 2 batches per step (at 2, the short
// rank's data ends inside a step);
// the images and steps are counted right. In the uneven tail no step
// checkpoint is written and a stop signal ends the run at the epoch's end
// (its checkpoint written); max_steps reached in the tail ends every rank.
#include <doctest/doctest.h>

#include <signal.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <numeric>
#include <vector>

#include "tests/dist/multiprocess.h"
#include "tests/train/signs.h"
#include "tests/support/temp_dir.h"
#include <loom/core/generator.h>
#include <loom/data/loader.h>
#include <loom/data/sampler.h>
#include <loom/nn/layers.h>
#include <loom/ops/elementwise.h>
#include <loom/ops/loss.h>
#include <loom/optim/amp.h>
#include <loom/optim/optimizer.h>
#include <loom/train/stop.h>
#include <loom/train/trainer.h>

namespace {

using namespace loom;
using namespace std::chrono_literals;
using train::testing::relative_difference;
using train::testing::Signs;
using dist::testing::expect;

constexpr int64_t kBatch = 8;
constexpr int kEpochs = 2;

// The ranks' batches per epoch: LOOM_JOIN_COUNTS, else 12 and 9 (rank 1 three short).
std::vector<int64_t> batch_counts() {
  const char* text = std::getenv("LOOM_JOIN_COUNTS");
  if (text == nullptr || std::string(text) == "12,9") return {12, 9};
  expect(std::string(text) == "9,12", "LOOM_JOIN_COUNTS is 12,9 or 9,12, not ", text);
  return {9, 12};
}

// Rank r's share: counts[r] batches of consecutive samples after rank 0's (no padding, no shuffle).
class Slice final : public data::Sampler {
 public:
  Slice(const std::vector<int64_t>& counts, int rank)
      : first_(rank == 0 ? 0 : counts[0] * kBatch), count_(counts[static_cast<size_t>(rank)] * kBatch) {}
  std::vector<int64_t> indices() const override {
    std::vector<int64_t> order(static_cast<size_t>(count_));
    std::iota(order.begin(), order.end(), first_);
    return order;
  }
  int64_t size() const override { return count_; }

 private:
  int64_t first_, count_;
};

struct Run {
  std::shared_ptr<nn::Module> model;
  std::shared_ptr<amp::MixedPrecisionOptimizer> optimizer;
};

Run make_run() {
  manual_seed(11);
  auto model = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(4, 3)});
  std::shared_ptr<amp::MixedPrecisionOptimizer> optimizer = amp::initialize(
      *model,
      [](std::vector<Tensor> parameters) -> std::unique_ptr<optim::Optimizer> {
        return std::make_unique<optim::SGD>(std::move(parameters), optim::SGDOptions(0.2).momentum(0.9));
      },
      amp::OptLevel::O0);
  return {model, optimizer};
}

data::DataLoader loader_of(const std::vector<int64_t>& counts, int rank) {
  return data::DataLoader(std::make_shared<Signs>(), data::DataLoaderOptions().batch_size(kBatch).num_workers(0),
                          std::make_shared<Slice>(counts, rank));
}

std::vector<double> values_of(const nn::NamedTensors& tensors) {
  std::vector<double> values;
  for (const auto& [name, tensor] : tensors)
    for (double v : tensor.to(DType::f64).to_vector<double>()) values.push_back(v);
  return values;
}

// f32 sums in another order (measured about 1e-7); a wrong divisor or a
// joined rank's stale momentum moves the parameters by more than 1e-3.
constexpr double kTolerance = 1e-5;

// One process: each step groups the batches [g K, min(g K + K, largest count)) of
// every rank that has them, each loss divided by the group's size, the sum
// divided by the world or by the ranks with a batch in the group.
Run reference_run(const std::vector<int64_t>& counts, int64_t accumulate, bool divide_by_world) {
  Run run = make_run();
  std::vector<std::vector<data::Batch>> batches(2);
  for (int r = 0; r < 2; ++r) {
    data::DataLoader loader = loader_of(counts, r);
    loader.start_epoch(0);
    while (auto batch = loader.next()) batches[r].push_back(*batch);
  }
  const int64_t largest = std::max(counts[0], counts[1]);
  for (int epoch = 0; epoch < kEpochs; ++epoch) {
    for (int64_t begin = 0; begin < largest; begin += accumulate) {
      const int64_t end = std::min(begin + accumulate, largest);
      int contributors = 0;
      for (int r = 0; r < 2; ++r) contributors += counts[r] > begin ? 1 : 0;
      const double divisor = divide_by_world ? 2.0 : contributors;
      run.optimizer->zero_grad();
      for (int r = 0; r < 2; ++r) {
        for (int64_t i = begin; i < std::min(end, counts[r]); ++i) {
          const data::Batch& batch = batches[r][static_cast<size_t>(i)];
          scale(cross_entropy(run.model->forward(batch.images), batch.labels),
                1.0 / (static_cast<double>(end - begin) * divisor))
              .backward();
        }
      }
      run.optimizer->step();
    }
  }
  return run;
}

train::TrainerOptions quiet() { return train::TrainerOptions().log_interval(1000).stop_signal(0).epochs(kEpochs); }

}  // namespace

// LOOM_JOIN_ACCUMULATE batches per step, LOOM_JOIN_DIVISOR "world" or "contributors".
LOOM_DIST_SCENARIO("trainer_join") {
  auto group = dist::init_process_group(dist::InitOptions().init_method("env://").timeout(30s));
  const int rank = group->rank();
  const std::vector<int64_t> counts = batch_counts();
  const int64_t largest = std::max(counts[0], counts[1]);
  const int64_t accumulate = dist::testing::env_int("LOOM_JOIN_ACCUMULATE");
  const bool divide_by_world = dist::testing::env_string("LOOM_JOIN_DIVISOR") == "world";
  Run run = make_run();
  data::DataLoader loader = loader_of(counts, rank);
  train::Trainer trainer(run.model, run.optimizer,
                         quiet().accumulate_steps(accumulate).process_group(group).join(
                             dist::JoinOptions().divide_by_initial_world_size(divide_by_world)));
  int64_t hooked_steps = 0;
  trainer.on_step([&](const train::StepInfo& step) {
    ++hooked_steps;
    expect(step.steps_per_epoch == (largest + accumulate - 1) / accumulate, "steps per epoch ", step.steps_per_epoch);
  });
  const train::FitResult result = trainer.fit(loader);
  const int64_t steps_per_epoch = (largest + accumulate - 1) / accumulate;
  expect(result.steps == kEpochs * steps_per_epoch, "rank ", rank, ": ", result.steps, " steps");
  // on_step runs for the steps with this rank's batches: all of the longer
  // rank's, the full groups of the shorter one (12 and 9 batches).
  expect(hooked_steps == kEpochs * (counts[rank] == largest ? steps_per_epoch : counts[rank] / accumulate), "rank ",
         rank, ": ", hooked_steps, " hooked steps");
  expect(result.images == kEpochs * (counts[0] + counts[1]) * kBatch, "images ", result.images);

  const Run reference = reference_run(counts, accumulate, divide_by_world);
  const double parameters = relative_difference(values_of(run.model->named_parameters()),
                                                values_of(reference.model->named_parameters()));
  expect(parameters < kTolerance, "rank ", rank, ": the parameters differ by ", parameters);
  const double momentum = relative_difference(values_of(run.optimizer->optimizer().state()),
                                              values_of(reference.optimizer->optimizer().state()));
  expect(momentum < kTolerance, "rank ", rank, ": the momentum buffers differ by ", momentum);
  const Run other = reference_run(counts, accumulate, !divide_by_world);  // the test can tell the divisors apart
  expect(relative_difference(values_of(other.model->named_parameters()),
                             values_of(reference.model->named_parameters())) > 1e-3,
         "both divisors give the same parameters");
  group->barrier()->wait();
}

// LOOM_JOIN_CASE "stop": rank 0 raises SIGUSR1 after its step 10 of epoch 1,
// in the tail (rank 1 joined after 9): no step checkpoint after step 9, the
// run stops at the epoch's end with its checkpoint. "max_steps": max_steps 10
// is reached in the tail; every rank ends there.
LOOM_DIST_SCENARIO("trainer_join_tail") {
  auto group = dist::init_process_group(dist::InitOptions().init_method("env://").timeout(30s));
  const int rank = group->rank();
  const std::string directory = dist::testing::env_string("LOOM_JOIN_DIR");
  const bool stop = dist::testing::env_string("LOOM_JOIN_CASE") == "stop";
  Run run = make_run();
  data::DataLoader loader = loader_of({12, 9}, rank);
  auto options = quiet().process_group(group).join(dist::JoinOptions());
  if (stop) {
    options.stop_signal(SIGUSR1).checkpoints(train::CheckpointOptions().directory(directory).every_steps(1).keep(0));
  } else {
    options.max_steps(10);
  }
  train::Trainer trainer(run.model, run.optimizer, options);
  trainer.on_step([&](const train::StepInfo& step) {
    if (stop && rank == 0 && step.step == 10) ::raise(SIGUSR1);
  });
  const train::FitResult result = trainer.fit(loader);
  expect(result.steps == (stop ? 12 : 10), "rank ", rank, ": ", result.steps, " steps");
  expect(result.stop_signal == (stop ? SIGUSR1 : 0), "rank ", rank, ": stop signal ", result.stop_signal);
  group->barrier()->wait();
  if (!stop || rank != 0) return;
  namespace fs = std::filesystem;
  for (int step = 1; step <= 9; ++step)
    expect(fs::exists(fs::path(directory) / str("2GPU_step", step, ".checkpoint")), "no checkpoint of step ", step);
  for (int step : {10, 11, 12})
    expect(!fs::exists(fs::path(directory) / str("2GPU_step", step, ".checkpoint")), "a checkpoint of step ", step,
           " in the uneven tail");
  expect(fs::exists(fs::path(directory) / "2GPU_1epoch.checkpoint"), "no checkpoint at the epoch's end");
  expect(!fs::exists(fs::path(directory) / "2GPU_2epoch.checkpoint"), "the run went on after the stop");
}

TEST_SUITE("join") {
  TEST_CASE("rank 1 three batches short: the Trainer's steps equal one process's averaged gradients") {
    for (int accumulate : {1, 2})
      for (const char* divisor : {"world", "contributors"}) {
        CAPTURE(accumulate);
        CAPTURE(divisor);
        const dist::testing::SpawnOptions options{
            .deadline = 90s,
            .environment = {{"LOOM_JOIN_ACCUMULATE", std::to_string(accumulate)}, {"LOOM_JOIN_DIVISOR", divisor}}};
        for (const auto& rank : dist::testing::spawn_ranks("trainer_join", 2, options))
          CHECK_MESSAGE(rank.ok(), rank.describe());
      }
  }

  TEST_CASE("rank 0, which logs and writes the checkpoints, three batches short") {
    const dist::testing::SpawnOptions options{
        .deadline = 90s,
        .environment = {{"LOOM_JOIN_ACCUMULATE", "2"}, {"LOOM_JOIN_DIVISOR", "world"}, {"LOOM_JOIN_COUNTS", "9,12"}}};
    for (const auto& rank : dist::testing::spawn_ranks("trainer_join", 2, options))
      CHECK_MESSAGE(rank.ok(), rank.describe());
  }

  TEST_CASE("the uneven tail: no step checkpoint, a stop at the epoch's end, max_steps on every rank") {
    for (const char* which : {"stop", "max_steps"}) {
      CAPTURE(which);
      loom::testing::TempDir dir;
      const dist::testing::SpawnOptions options{
          .deadline = 90s, .environment = {{"LOOM_JOIN_CASE", which}, {"LOOM_JOIN_DIR", dir.path().string()}}};
      for (const auto& rank : dist::testing::spawn_ranks("trainer_join_tail", 2, options))
        CHECK_MESSAGE(rank.ok(), rank.describe());
    }
  }
}
