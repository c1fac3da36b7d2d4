// train_resnet50_cifar: the SLURM tutorial's ResNet-50 on CIFAR-10, one
// process per rank (srun, torchrun/loomrun or mpirun set the rank variables;
// a plain start is one process).
//   train_resnet50_cifar -b 128 -e 2 [-c ./checkpoint/1GPU_1epoch.checkpoint] [--amp O2] [--sync-bn]
// Setup only: loom::train's Trainer runs the loop (loss lines, checkpoints,
// resume, the stop on signals, the test accuracy over every rank's shard).
#include <CLI/CLI.hpp>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <optional>

#include "apps/app_common.h"
#include "apps/datasets.h"
#include "apps/training.h"
#include <loom/core/generator.h>
#include <loom/dist/launcher.h>
#include <loom/dist/sync_batch_norm.h>

using namespace loom;

namespace {

struct Flags {
  int64_t batch_size = 128, max_steps = 0, epochs = 2;  // global batch; steps per epoch at most (0 = all)
  std::string model = "resnet50", stem = "imagenet", schedule = "cosine";
  apps::DataFlags data;  // --data, --dataset, --image-size, --synthetic, --synthetic-size
  // Without --lr, 0.1 per 128 images (Goyal et al.'s linear scaling; 0.1 at small batches blew up, in PyTorch
  // too), with a linear warm-up over the first epoch (0.1 from step 1: loss 2.8 -> 21 at step 2 at batch 128).
  std::optional<double> lr;
  double momentum = 0.9, weight_decay = 5e-4, warmup_epochs = 1;
  apps::CommonFlags common;           // --device, --backend, --amp, --workers, --log-interval, ...
  apps::CheckpointFlags checkpoints;  // --checkpoint-dir, --resume, --checkpoint-every, ...
  double learning_rate() const { return lr ? *lr : 0.1 * static_cast<double>(batch_size) / 128.0; }
};

int run(const Flags& flags, int argc, char** argv) {
  const apps::CommonFlags& common = flags.common;
  const apps::RankContext rank = apps::start_rank(common, flags.checkpoints);
  LOOM_CHECK(flags.batch_size % rank.world == 0, "--batch-size ", flags.batch_size,
             " is the global batch and must divide evenly across the ", rank.world, " processes");
  const int64_t batch_per_rank = flags.batch_size / rank.world;
  const data::LoadedData loaded = apps::load_cifar_app_data(flags.data, common.seed + 1);
  const char* synthetic_note = flags.data.synthetic ? " (synthetic data)" : "";
  std::shared_ptr<dist::ProcessGroup> group = apps::make_process_group(common, rank.backend, rank.device, rank.world);
  manual_seed(common.seed);
  std::shared_ptr<nn::Module> model = apps::make_model(flags.model, loaded.num_classes, loaded.sample_shape().channels,
                                                      nn::parse_resnet_stem(flags.stem));
  apps::place_model(*model, common, rank.device);  // (--channels-last) before the optimizer and DDP take it
  if (common.sync_bn) model = dist::convert_sync_batchnorm(model, group);  // same tensors: checkpoints unchanged
  // apex's amp.initialize: the model in the level's dtypes, SGD over what it steps (f32 masters at O2 / O3 /
  // bf16), with --zero over this rank's shard.
  const double lr = flags.learning_rate();
  std::shared_ptr<amp::MixedPrecisionOptimizer> optimizer = apps::initialize_optimizer(
      *model, common, group, [&](std::vector<Tensor> parameters) -> std::unique_ptr<optim::Optimizer> {
        return std::make_unique<optim::SGD>(
            std::move(parameters), optim::SGDOptions(lr).momentum(flags.momentum).weight_decay(flags.weight_decay));
      });
  apps::print_launch_banner(rank);
  if (rank.leader) {
    std::printf("%s%s: %" PRId64 " training, %" PRId64 " test images; %s%s, global batch %" PRId64
                " (%" PRId64 " per process)\n", loaded.description.c_str(), synthetic_note, loaded.train_size(),
                loaded.test_size(), flags.model.c_str(),
                nn::is_resnet_name(flags.model) ? str(" (", flags.stem, " stem)").c_str() : "", flags.batch_size, batch_per_rank);
    if (!loaded.split.empty()) std::printf("%s\n", loaded.split.c_str());
    if (rank.world > 1) {
      std::printf("Distributed: %d processes (%s), backend %s%s\n", rank.world, dist::launcher_name(rank.launch.launcher),
                  group->backend_name(), common.sync_bn ? ", SyncBatchNorm" : "");
    } else if (common.sync_bn) {
      std::printf("note: --sync-bn with one process: SyncBatchNorm computes what BatchNorm2d does\n");
    }
  }
  // In-memory data (CIFAR-10, MNIST) is augmented here; image folders bring their own (--image-size).
  const bool cifar = loaded.kind == data::DatasetKind::cifar10;
  const data::Normalize normalize = cifar ? data::cifar10_normalize() : data::mnist_normalize();
  const data::Compose augment({apps::model_input_crop(flags.model, loaded.sample_shape(), cifar ? 4 : 0),
                               data::RandomHorizontalFlip{cifar ? 0.5 : 0.0}, data::ToTensor{}, normalize});
  const data::Compose test = apps::with_model_crop(flags.model, loaded.sample_shape(), {data::ToTensor{}, normalize});
  apps::Loaders loaders = apps::make_loaders(loaded, augment, test, common, rank, batch_per_rank, batch_per_rank);
  const int64_t batches = loaders.train.num_batches(),
                steps_per_epoch = flags.max_steps > 0 ? std::min(batches, flags.max_steps) : batches;
  // Counted in steps of the run, so a resumed run warms up exactly as an uninterrupted one.
  const int64_t warmup_steps = std::llround(flags.warmup_epochs * static_cast<double>(steps_per_epoch));
  if (rank.leader) {
    std::printf("SGD lr %g%s, momentum %g, weight decay %g, schedule %s, linear warm-up over %" PRId64 " steps\n", lr,
                flags.lr ? "" : str(" (0.1 x batch ", flags.batch_size, " / 128)").c_str(), flags.momentum,
                flags.weight_decay, flags.schedule.c_str(), warmup_steps);
  }
  std::fflush(stdout);
  // The run's settings, stored in the checkpoint so a resume can say what changed.
  const nn::Metadata settings = {{"model", flags.model}, {"stem", flags.stem}, {"world_size", str(rank.world)},
                                 {"batch_size", str(flags.batch_size)}, {"epochs", str(flags.epochs)}, {"lr", str(lr)},
                                 {"schedule", flags.schedule}, {"warmup_epochs", str(flags.warmup_epochs)},
                                 {"sync_bn", common.sync_bn ? "true" : "false"}, {"seed", str(common.seed)}};
  train::Trainer trainer(model, optimizer,
                         apps::trainer_options("train_resnet50_cifar", argc, argv, common, flags.checkpoints, group)
                             .epochs(flags.epochs)
                             .max_steps_per_epoch(flags.max_steps)
                             .warmup_steps(warmup_steps)
                             .settings(settings));
  trainer.scheduler(apps::make_epoch_schedule(flags.schedule, optimizer->optimizer(), flags.epochs));
  trainer.on_log([](const train::StepInfo& step, double loss) {
    std::printf("Epoch[%" PRId64 "/%" PRId64 "], Step[%" PRId64 "/%" PRId64 "], Loss: %.4f, Time dataload: %.3f ms, "
                "Time training: %.3f ms\n", step.epoch + 1, step.epochs, step.epoch_step, step.steps_per_epoch, loss,
                1000.0 * step.data_wait_seconds, 1000.0 * step.step_seconds);
  });
  trainer.after_training([&](auto& result) { apps::print_training_complete(">>> ", result, *optimizer, common.amp); });
  trainer.after_evaluation([&](const train::FitResult& result) {
    std::printf(">>> Test accuracy%s: %.4f (%" PRId64 "/%" PRId64 ")\n", synthetic_note, result.accuracy->accuracy(),
                result.accuracy->correct, result.accuracy->total);
  });
  return trainer.fit(loaders.train, &loaders.test).exit_code();
}

void add_flags(CLI::App& app, Flags& flags) {
  apps::add_count(app, "-b,--batch-size", flags.batch_size, "global batch size, split evenly across the processes", 1);
  apps::add_count(app, "-e,--epochs", flags.epochs, "total epochs to run", 0);
  apps::add_checkpoint_flags(app, flags.checkpoints);
  apps::add_cifar_data_flags(app, flags.data);
  apps::add_choice(app, "--model", flags.model, apps::join_names(apps::model_names()) + " (torchvision's)",
                   apps::model_names());
  apps::add_choice(app, "--stem", flags.stem, "the ResNets' imagenet (7x7/2 conv + maxpool) or cifar (3x3/1 conv)",
                   {"imagenet", "cifar"});
  app.add_option("--lr", flags.lr,
                 "SGD learning rate [default: 0.1 x batch-size / 128, the linear scaling rule; 0.1 at -b 128] "
                 "(the tutorial uses 1e-4 without momentum)")
      ->check(apps::at_least(0));
  app.add_option("--momentum", flags.momentum, "SGD momentum")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  app.add_option("--weight-decay", flags.weight_decay, "SGD weight decay")->capture_default_str()->check(apps::at_least(0));
  apps::add_choice(app, "--schedule", flags.schedule,
                   "learning-rate schedule per epoch: none, step (x0.1 every third of the run) or cosine",
                   {"none", "step", "cosine"});
  app.add_option("--warmup-epochs", flags.warmup_epochs,
                 "epochs (fractions allowed) over which the learning rate rises linearly from lr / steps to lr, "
                 "step by step (0 = no warm-up)")
      ->capture_default_str()
      ->check(apps::at_least(0));
  apps::add_count(app, "--max-steps", flags.max_steps, "end each epoch after this many steps (0 = full epochs)", 0);
  flags.common.log_interval = 10;
  apps::add_common_flags(app, flags.common);
  apps::add_version_flag(app, "train_resnet50_cifar");
}

}  // namespace

int main(int argc, char** argv) {
  return apps::run_app<Flags>("train_resnet50_cifar", "Train a ResNet on CIFAR-10 with loom (the SLURM DDP tutorial)",
                              {argv, argv + argc}, add_flags, [&](const Flags& flags) { return run(flags, argc, argv); });
}
