#include "tests/dist/elastic_phases.h"

#include <doctest/doctest.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>

#include <loom/data/dataset.h>
#include <loom/data/loader.h>
#include <loom/data/sampler.h>
#include <loom/dist/host_staging.h>
#include <loom/dist/zero_redundancy_optimizer.h>
#include <loom/nn/checkpoint.h>
#include <loom/optim/amp.h>
#include <loom/optim/optimizer.h>
#include <loom/train/trainer.h>
#include "tests/dist/multiprocess.h"
#include "tests/dist/rows_dataset.h"
#include "tests/dist/tiny_mlp.h"
#include "tests/support/temp_dir.h"

namespace loom::dist::testing {

namespace fs = std::filesystem;

namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value ? value : fallback;
}

}  // namespace

// One phase of a run: LOOM_TEST_DIR (checkpoints, --resume auto), either
// LOOM_TEST_GLOBAL_BATCH or LOOM_TEST_BATCH (run_phases), LOOM_TEST_MAX_STEPS
// (0: to the end), LOOM_TEST_STOP_AT (rank 0 raises SIGTERM after this step;
// 0: never), LOOM_TEST_ZERO (1: a ZeroRedundancyOptimizer over SGD at world >
// 1), and ElasticSetting's LOOM_TEST_DEVICE, LOOM_TEST_BACKEND (read by
// group_from_environment) and LOOM_TEST_AMP. Rank r appends "epoch row" per
// trained sample to LOOM_TEST_DIR/samples.r<rank>.w<world>.log, rank 0 "step
// world loss" (its own batch's loss) to losses.log.
LOOM_DIST_SCENARIO("elastic_phase") {
  const int world = env_int("WORLD_SIZE"), rank = env_int("RANK");
  const Device device = env_or("LOOM_TEST_DEVICE", "cpu") == "cuda" ? Device::cuda(0) : Device::cpu();
  const amp::OptLevel level = amp::parse_opt_level(env_or("LOOM_TEST_AMP", "O0"));
  auto group = world > 1 ? stage_through_host(group_from_environment(std::chrono::seconds(20)), device) : nullptr;
  const fs::path dir = env_string("LOOM_TEST_DIR");
  const int64_t global_batch = std::stoll(env_or("LOOM_TEST_GLOBAL_BATCH", "0"));
  const int64_t batch = global_batch > 0 ? global_batch / world : std::stoll(env_string("LOOM_TEST_BATCH"));
  auto sampler = std::make_shared<data::DistributedSampler>(kElasticRows, world, rank, /*shuffle=*/true, /*seed=*/5);
  data::DataLoader loader(std::make_shared<RowsDataset>(kElasticRows),
                          data::DataLoaderOptions().batch_size(batch).num_workers(1).seed(7).device(device), sampler);
  auto model = tiny_model(300);
  model->to(DType::f32);  // amp::initialize takes f32 weights (O0 trains them as they are)
  model->to(device);
  const optim::SGDOptions sgd = optim::SGDOptions(0.2).momentum(0.9);
  const bool zero = env_or("LOOM_TEST_ZERO", "0") == "1";  // the momentum sharded (ZeRO), at world > 1
  std::shared_ptr<amp::MixedPrecisionOptimizer> optimizer = amp::initialize(
      *model,
      [&](std::vector<Tensor> parameters) -> std::unique_ptr<optim::Optimizer> {
        if (zero && group) return std::make_unique<ZeroRedundancyOptimizer>(std::move(parameters), group, sgd);
        return std::make_unique<optim::SGD>(std::move(parameters), sgd);
      },
      level);
  const int64_t max_steps = std::stoll(env_or("LOOM_TEST_MAX_STEPS", "0"));
  const int64_t stop_at = std::stoll(env_or("LOOM_TEST_STOP_AT", "0"));
  train::Trainer trainer(model, optimizer,
                         train::TrainerOptions()
                             .epochs(kElasticEpochs)
                             .max_steps(max_steps)
                             .warmup_steps(3)
                             .log_interval(1000)
                             .process_group(group)
                             .checkpoints(train::CheckpointOptions()
                                              .directory(dir.string())
                                              .every_steps(1)
                                              .keep(0)
                                              .resume("auto")));
  std::ofstream samples(dir / str("samples.r", rank, ".w", world, ".log"), std::ios::app);
  std::ofstream losses;
  if (rank == 0) losses.open(dir / "losses.log", std::ios::app);
  const DType input_dtype = amp::input_dtype(level);
  trainer.step_function([&](nn::Module& trained, const data::Batch& batch) {
    const int64_t size = batch.size();
    Tensor output = trained(batch.images.to(input_dtype).reshape({size, 6}));
    return mse(output.to(DType::f32), row_targets(batch.samples, DType::f32).to(device));  // the loss in f32, as amp's
  });
  trainer.on_step([&](const train::StepInfo& step) {
    for (int64_t row : step.batch->samples) samples << step.epoch << ' ' << row << '\n';
    samples.flush();
    if (rank == 0) {
      char line[64];
      std::snprintf(line, sizeof line, "%lld %d %.17g\n", static_cast<long long>(step.step), world, step.loss->item());
      losses << line << std::flush;
      if (step.step == stop_at) ::raise(SIGTERM);  // the Trainer's handler: every rank stops with a checkpoint
    }
  });
  trainer.fit(loader);
}

std::string ElasticSetting::describe() const { return str(device, " over ", backend, " at ", amp); }

std::vector<std::string> run_phases(const fs::path& dir, const std::vector<Phase>& phases,
                                    const std::string& batch_variable, int64_t batch, const ElasticSetting& setting) {
  std::vector<std::string> outputs;
  for (const Phase& phase : phases) {
    SpawnOptions options;
    // A CUDA rank starts a context and loads kernels first: more time on a shared GPU.
    options.deadline = std::chrono::seconds(setting.device == "cuda" ? 120 : 60);
    options.environment = {{"LOOM_TEST_DIR", dir.string()},
                           {batch_variable, std::to_string(batch)},
                           {"LOOM_TEST_MAX_STEPS", std::to_string(phase.max_steps)},
                           {"LOOM_TEST_STOP_AT", std::to_string(phase.stop_at)},
                           {"LOOM_TEST_ZERO", phase.zero ? "1" : "0"},
                           {"LOOM_TEST_DEVICE", setting.device},
                           {"LOOM_TEST_BACKEND", setting.backend},
                           {"LOOM_TEST_AMP", setting.amp}};
    const std::vector<RankResult> results = spawn_ranks("elastic_phase", phase.world, options);
    for (const RankResult& result : results) {
      // A SIGTERM stop exits the scenario normally: fit() returns with the signal noted.
      REQUIRE_MESSAGE(result.ok(), result.describe());
    }
    outputs.push_back(results[0].output);
  }
  return outputs;
}

namespace {

// Every "epoch row" line of every samples.*.log in `dir`, per epoch.
std::map<int64_t, std::vector<int64_t>> samples_per_epoch(const fs::path& dir) {
  std::map<int64_t, std::vector<int64_t>> rows;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!entry.path().filename().string().starts_with("samples.")) continue;
    std::ifstream in(entry.path());
    int64_t epoch = 0, row = 0;
    while (in >> epoch >> row) rows[epoch].push_back(row);
  }
  return rows;
}

}  // namespace

std::map<int64_t, StepLoss> losses_in(const fs::path& dir) {
  std::map<int64_t, StepLoss> losses;
  std::ifstream in(dir / "losses.log");
  int64_t step = 0;
  StepLoss entry;
  while (in >> step >> entry.world >> entry.loss) {
    REQUIRE_MESSAGE(!losses.count(step), "step ", step, " was trained twice");
    losses[step] = entry;
  }
  return losses;
}

std::vector<double> final_parameters(const fs::path& dir, int world) {
  const nn::Checkpoint checkpoint = nn::load_checkpoint(dir / str(world, "GPU_", kElasticEpochs, "epoch.checkpoint"));
  std::vector<double> values;
  for (const auto& [name, tensor] : checkpoint.model)
    for (double v : tensor.to(DType::f64).to_vector<double>()) values.push_back(v);
  return values;
}

double largest_difference(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double largest = 0;
  for (size_t i = 0; i < a.size(); ++i) largest = std::max(largest, std::abs(a[i] - b[i]));
  return largest;
}

void check_each_epoch_once(const fs::path& dir) {
  const std::map<int64_t, std::vector<int64_t>> rows = samples_per_epoch(dir);
  REQUIRE(rows.size() == static_cast<size_t>(kElasticEpochs));
  std::vector<int64_t> dataset(kElasticRows);
  for (int64_t i = 0; i < kElasticRows; ++i) dataset[i] = i;
  for (auto [epoch, seen] : rows) {
    std::sort(seen.begin(), seen.end());
    CHECK_MESSAGE(seen == dataset, "epoch ", epoch, ": ", seen.size(), " samples, not each of the ", kElasticRows,
                  " once");
  }
}

void expect_world_changes_as_uninterrupted(const ElasticSetting& setting, const ElasticTolerance& limits) {
  INFO(setting.describe());
  // Global batch 6: 3, 6 and 2 per process at worlds 2, 1 and 3; 6 steps per epoch at any world.
  const std::string batch = "LOOM_TEST_GLOBAL_BATCH";
  // Uninterrupted runs at each world size: a run at one world size repeats
  // bit for bit, so the only run-to-run noise is how the gradient sums are
  // split over ranks; their spread is the tolerance's base.
  std::map<int, std::vector<double>> uninterrupted;
  std::map<int, std::map<int64_t, StepLoss>> uninterrupted_losses;
  for (int world : {1, 2, 3}) {
    loom::testing::TempDir dir;
    run_phases(dir.path(), {{world}}, batch, 6, setting);
    uninterrupted[world] = final_parameters(dir.path(), world);
    uninterrupted_losses[world] = losses_in(dir.path());
    REQUIRE(uninterrupted_losses[world].size() == 12);
  }
  const double noise = std::max(largest_difference(uninterrupted[1], uninterrupted[2]),
                                largest_difference(uninterrupted[3], uninterrupted[2]));
  const double tolerance = std::max(limits.noise_factor * noise, limits.floor);
  MESSAGE(setting.describe(), ": largest parameter difference between uninterrupted runs at worlds 1, 2, 3: ", noise);
  CHECK(noise < limits.noise_limit);

  loom::testing::TempDir dir;
  // 2 steps at world 2 (12 samples), to step 4 at world 1 stopped by SIGTERM
  // (24), the rest of epoch 1 and all of epoch 2 at world 3.
  const std::vector<std::string> outputs = run_phases(dir.path(), {{2, 2, 0}, {1, 0, 4}, {3, 0, 0}}, batch, 6, setting);
  CHECK_MESSAGE(contains(outputs[1], "(written by 2 processes) at epoch 1, sample 12, on 1 process, batch 2 (step 2)"),
                outputs[1]);
  CHECK_MESSAGE(contains(outputs[2], "(written by 1 process) at epoch 1, sample 24, on 3 processes, batch 4 (step 4)"),
                outputs[2]);
  CHECK_MESSAGE(!contains(outputs[2], "note: the global batch"), outputs[2]);
  check_each_epoch_once(dir.path());
  // Losses continue: rank 0 of world W at step s trains on the same samples
  // as rank 0 of an uninterrupted run at world W (positions 6 s + j W).
  const std::map<int64_t, StepLoss> losses = losses_in(dir.path());
  REQUIRE(losses.size() == 12);
  for (auto [step, entry] : losses) {
    const double expected = uninterrupted_losses[entry.world][step].loss;
    CHECK_MESSAGE(std::abs(entry.loss - expected) <= tolerance * 10, "step ", step, " at world ", entry.world,
                  ": loss ", entry.loss, ", uninterrupted ", expected);
  }
  const double difference = largest_difference(final_parameters(dir.path(), 3), uninterrupted[2]);
  MESSAGE(setting.describe(), ": largest parameter difference, elastic 2 -> 1 -> 3 against uninterrupted world 2: ",
          difference);
  CHECK(difference <= tolerance);

  // Stopped and resumed at the same world size: bit for bit the uninterrupted run.
  loom::testing::TempDir same;
  run_phases(same.path(), {{2, 5, 0}, {2, 0, 0}}, batch, 6, setting);
  check_each_epoch_once(same.path());
  CHECK(final_parameters(same.path(), 2) == uninterrupted[2]);
  CHECK(losses_in(same.path()) == uninterrupted_losses[2]);
}

}  // namespace loom::dist::testing
