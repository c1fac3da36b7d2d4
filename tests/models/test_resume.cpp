// Resuming from a checkpoint: training 2 epochs straight equals training 1,
// saving, restoring into a freshly built (differently initialised) run and
// training the 2nd — bit for bit, on the CPU with the same seed. Leaving out
// any piece of the training state (optimizer moments, LR schedule position,
// batch-norm buffers) breaks the equality, so each piece is shown to matter.
#include <doctest/doctest.h>

#include <loom/core/generator.h>
#include <loom/data/cifar10.h>
#include <loom/data/loader.h>
#include <loom/nn/checkpoint.h>
#include <loom/nn/resnet.h>
#include <loom/ops/loss.h>
#include <loom/optim/lr_scheduler.h>
#include <loom/optim/optimizer.h>
#include "tests/models/helpers.h"
#include "tests/support/gradcheck.h"

using namespace loom;
using loom::testing::TempDir;

namespace {

constexpr int64_t kEpochs = 2;

// The pieces of train_resnet50_cifar's loop at toy size: ResNet-18 with the
// CIFAR stem at width 8, 24 synthetic images, batch 8, augmentation, SGD with
// momentum and weight decay, cosine schedule.
struct Run {
  std::shared_ptr<nn::ResNet> model;
  std::unique_ptr<optim::SGD> optimizer;
  std::unique_ptr<optim::CosineAnnealingLR> scheduler;
  std::unique_ptr<data::DataLoader> loader;
  int64_t step = 0;

  explicit Run(uint64_t init_seed) {
    manual_seed(init_seed);
    model = nn::resnet18(nn::ResNetOptions().num_classes(10).stem(nn::ResNetStem::cifar).width(8));
    optimizer = std::make_unique<optim::SGD>(model->parameters(),
                                             optim::SGDOptions(0.05).momentum(0.9).weight_decay(5e-4));
    scheduler = std::make_unique<optim::CosineAnnealingLR>(*optimizer, kEpochs);
    const data::ImageDataset images = data::synthetic_cifar10(24, 5);
    loader = std::make_unique<data::DataLoader>(
        images,
        data::Compose({data::RandomCrop(32, 4), data::RandomHorizontalFlip{}, data::ToTensor{},
                       data::cifar10_normalize()}),
        data::DataLoaderOptions().batch_size(8).num_workers(1).seed(13),
        std::make_shared<data::DistributedSampler>(images.size(), 1, 0, true, 11));
  }

  void train_epoch(int64_t epoch) {
    loader->start_epoch(epoch);
    while (auto batch = loader->next()) {
      Tensor loss = cross_entropy((*model)(batch->images), batch->labels);
      optimizer->zero_grad();
      loss.backward();
      optimizer->step();
      ++step;
    }
    scheduler->step();
  }

  nn::Checkpoint checkpoint(int64_t epochs_done) {
    nn::TrainingState state;
    state.epoch = epochs_done;
    state.step = step;
    state.optimizer = optimizer->state();
    state.scheduler_last_epoch = scheduler->last_epoch();
    state.sampler_epoch = loader->sampler().epoch();
    state.generators["default"] = {default_generator().seed(), default_generator().counter()};
    return {model->state_dict(), state};
  }
};

enum class Omit { nothing, optimizer, scheduler, buffers };

// Loads `path` into a run initialised from another seed, leaving out `omit`,
// and trains the remaining epochs.
Run resumed(const std::filesystem::path& path, Omit omit) {
  Run run(999);
  nn::Checkpoint checkpoint = nn::load_checkpoint(path);
  REQUIRE(checkpoint.training.has_value());
  const nn::TrainingState& state = *checkpoint.training;
  if (omit == Omit::buffers) {
    nn::NamedTensors parameters;
    for (auto& [name, t] : checkpoint.model) {
      if (name.find("running_") == std::string::npos && name.find("num_batches") == std::string::npos) {
        parameters.emplace_back(name, t);
      }
    }
    run.model->load_state_dict(parameters, /*strict=*/false);
  } else {
    nn::load_model_state(*run.model, checkpoint.model);
  }
  if (omit != Omit::optimizer) run.optimizer->load_state(state.optimizer);
  if (omit != Omit::scheduler) run.scheduler->set_last_epoch(*state.scheduler_last_epoch);
  default_generator().set_state(state.generators.at("default").seed, state.generators.at("default").counter);
  run.step = state.step;
  CHECK(*state.sampler_epoch == state.epoch - 1);
  for (int64_t epoch = state.epoch; epoch < kEpochs; ++epoch) run.train_epoch(epoch);
  return run;
}

double max_difference(const nn::NamedTensors& a, const nn::NamedTensors& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].first == b[i].first);
    worst = std::max(worst, loom::testing::max_abs_diff(a[i].second, b[i].second));
  }
  return worst;
}

}  // namespace

TEST_SUITE("resume") {
  TEST_CASE("a resumed run equals an uninterrupted one exactly") {
    TempDir dir;
    Run straight(1);
    for (int64_t epoch = 0; epoch < kEpochs; ++epoch) straight.train_epoch(epoch);

    Run interrupted(1);
    interrupted.train_epoch(0);
    const auto path = dir / "1GPU_1epoch.checkpoint";
    nn::save_checkpoint(path, interrupted.checkpoint(1));
    // The state after epoch 1 differs from the final one: there is something to resume.
    REQUIRE(max_difference(interrupted.model->state_dict(), straight.model->state_dict()) > 1e-4);

    Run resumed_run = resumed(path, Omit::nothing);
    CHECK(resumed_run.step == straight.step);
    CHECK(max_difference(resumed_run.model->state_dict(), straight.model->state_dict()) == 0);
    CHECK(max_difference(resumed_run.optimizer->state(), straight.optimizer->state()) == 0);
    CHECK(resumed_run.optimizer->lr() == straight.optimizer->lr());

    // Each piece of the training state matters.
    for (Omit omit : {Omit::optimizer, Omit::scheduler, Omit::buffers}) {
      INFO("omitting piece ", static_cast<int>(omit));
      Run partial = resumed(path, omit);
      CHECK(max_difference(partial.model->state_dict(), straight.model->state_dict()) > 1e-6);
    }
  }
}
