// train_resnet50_cifar: the SLURM tutorial's ResNet-50 on CIFAR-10, one
// process per rank (srun, torchrun/loomrun or mpirun set the rank variables;
// a plain start is one process).
//   train_resnet50_cifar -b 128 -e 2 [-c ./checkpoint/1GPU_1epoch.checkpoint] [--amp O2] [--sync-bn]
// Rank 0 prints ">>> Training on N ...", a loss line with data-load and
// training milliseconds every 10 steps, saves
// ./checkpoint/{world}GPU_{epoch}epoch.checkpoint after each epoch, then
// ">>> Training complete in: h:mm:ss.ffffff" and the test accuracy, counted
// over every test image exactly once (each rank its shard, then summed).
// --checkpoint-every N adds step checkpoints; --resume auto (the default after
// a launcher's restart) continues from the newest valid one, mid-epoch
// included; SIGTERM, --checkpoint-signal (USR1) and SIGINT stop every rank
// after the same step with a checkpoint (exit code 128 + signal).
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include "apps/app_common.h"
#include "apps/training.h"
#include <loom/core/autograd.h>
#include <loom/core/cuda/runtime.h>
#include <loom/core/generator.h>
#include <loom/core/parallel.h>
#include <loom/data/cifar10.h>
#include <loom/data/loader.h>
#include <loom/data/selection.h>
#include <loom/dist/ddp.h>
#include <loom/dist/environment.h>
#include <loom/dist/metrics.h>
#include <loom/dist/process_group.h>
#include <loom/dist/sync_batch_norm.h>
#include <loom/nn/checkpoint.h>
#include <loom/nn/resnet.h>
#include <loom/ops/loss.h>
#include <loom/optim/amp.h>
#include <loom/optim/lr_scheduler.h>
#include <loom/optim/optimizer.h>
#include <loom/train/monitor.h>
#include <loom/train/stop.h>
#include <loom/train/trainer.h>

namespace fs = std::filesystem;
using namespace loom;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kCifarUrl = "https://www.cs.toronto.edu/~kriz/cifar.html";

struct Flags {
  int64_t batch_size = 128;  // global: split across the ranks
  int epochs = 2;
  apps::CheckpointFlags checkpoints;  // --checkpoint-dir, --resume, --checkpoint-every, ...
  std::string data = "./data";
  bool synthetic = false;
  std::string dataset = "auto";  // cifar10, mnist, imagefolder, or inferred from --data
  int64_t image_size = 224;      // image folders
  int64_t synthetic_size = 50000;
  std::string model = "resnet50";
  std::string stem = "imagenet";
  // SGD learning rate; without --lr, 0.1 per 128 images of the global batch
  // (Goyal et al.'s linear scaling rule: 0.1 at the default batch, 0.025 at
  // 32). lr 0.1 at small batches made short runs blow up (loss > 10) in
  // loom and in PyTorch alike.
  std::optional<double> lr;
  double momentum = 0.9;
  double weight_decay = 5e-4;
  std::string schedule = "cosine";
  // Linear warm-up over the first epoch (Goyal et al., "Accurate, Large
  // Minibatch SGD"): lr 0.1 with momentum 0.9 from the first step throws a
  // freshly initialised ResNet-50 far off (batch 128: loss 2.8 -> 21 at step 2,
  // and the same in PyTorch with torchvision's resnet50).
  double warmup_epochs = 1;
  int64_t max_steps = 0;  // per epoch; 0 = full epochs
  apps::CommonFlags common;  // --device, --backend, --amp, --workers, --log-interval, ...
};

// --dataset (auto: inferred from --data, else CIFAR-10): CIFAR-10 from DIR
// holding the batches (binary or python version) or its parent holding
// cifar-10-batches-bin/ or cifar-10-batches-py/ (torchvision's root); MNIST
// IDX files; or image folders DIR/train/<class>/ and DIR/val/ at --image-size.
data::LoadedData load_data(const Flags& flags) {
  if (flags.synthetic) {
    // One draw split in two: synthetic_cifar10 picks the class colours from its
    // seed, so the test images must come from the same call as the training ones.
    const int64_t train_size = flags.synthetic_size, test_size = std::max<int64_t>(1, flags.synthetic_size / 5);
    const data::ImageDataset all = data::synthetic_cifar10(train_size + test_size, flags.common.seed + 1);
    std::vector<uint8_t> test_pixels(all.image(train_size), all.image(train_size) + test_size * all.image_bytes());
    std::vector<int64_t> test_labels;
    for (int64_t i = train_size; i < train_size + test_size; ++i) test_labels.push_back(all.label(i));
    data::LoadedData loaded;
    loaded.kind = data::DatasetKind::cifar10;
    loaded.description = "Synthetic CIFAR-10";
    loaded.num_classes = data::cifar10_classes;
    loaded.memory = {all.subset(train_size),
                     data::ImageDataset(all.channels(), all.height(), all.width(), std::move(test_pixels),
                                        std::move(test_labels), "synthetic CIFAR-10 test")};
    return loaded;
  }
  const fs::path dir = flags.data;
  std::optional<data::DatasetKind> kind = data::parse_dataset_kind(flags.dataset);
  if (!kind && fs::is_directory(dir)) kind = data::infer_dataset_kind(dir);
  if (!kind) kind = data::DatasetKind::cifar10;
  if (*kind == data::DatasetKind::cifar10 && !data::find_cifar10(dir)) {
    try {
      data::load_cifar10(dir);  // throws the message that lists both layouts and where it looked
    } catch (const Error& error) {
      throw Error(str(error.what(), ". Download cifar-10-binary.tar.gz or cifar-10-python.tar.gz from ", kCifarUrl,
                      " and unpack it into DIR, pass --data DIR, or use --synthetic"));
    }
  }
  const data::ImageFolderOptions train_folder{data::ColorMode::rgb, data::imagenet_train_transforms(flags.image_size)};
  const data::ImageFolderOptions test_folder{data::ColorMode::rgb, data::imagenet_test_transforms(flags.image_size)};
  return data::load_dataset(*kind, dir, train_folder, test_folder);
}

std::unique_ptr<optim::LRScheduler> make_scheduler(const Flags& flags, optim::Optimizer& optimizer) {
  if (flags.schedule == "cosine") return std::make_unique<optim::CosineAnnealingLR>(optimizer, std::max(1, flags.epochs));
  // step: x0.1 after every third of the run.
  if (flags.schedule == "step") return std::make_unique<optim::StepLR>(optimizer, std::max(1, flags.epochs / 3), 0.1);
  return nullptr;
}

double learning_rate(const Flags& flags) {
  return flags.lr ? *flags.lr : 0.1 * static_cast<double>(flags.batch_size) / 128.0;
}

std::string host_name() {
  char name[256] = {};
  return ::gethostname(name, sizeof(name) - 1) == 0 ? std::string(name) : std::string("localhost");
}

// The run's settings, stored in the checkpoint so a resume can say what changed.
nn::Metadata run_settings(const Flags& flags, int world_size) {
  return {{"model", flags.model},
          {"stem", flags.stem},
          {"world_size", std::to_string(world_size)},
          {"batch_size", std::to_string(flags.batch_size)},
          {"epochs", std::to_string(flags.epochs)},
          {"lr", str(learning_rate(flags))},
          {"schedule", flags.schedule},
          {"warmup_epochs", str(flags.warmup_epochs)},
          {"sync_bn", flags.common.sync_bn ? "true" : "false"},
          {"seed", std::to_string(flags.common.seed)}};
}

int run(const Flags& flags, int argc, char** argv) {
  train::StopSignals::install(train::parse_signal_name(flags.checkpoints.signal));
  const apps::CommonFlags& common = flags.common;
  // Who this process is: srun's SLURM_*, torchrun's RANK / WORLD_SIZE, or one process.
  const dist::LaunchEnvironment launch = dist::resolve_launch_environment();
  const int rank = launch.rank, world = launch.world_size;
  apps::set_threads(common, world);
  // --device cuda / auto: this rank's GPU (cuda:LOCAL_RANK), the one its NCCL group drives.
  const Device device = apps::resolve_training_device(common.device, launch.local_rank);
  const std::string backend = apps::choose_backend(common.backend, device);
  const nn::ResNetStem stem = nn::parse_resnet_stem(flags.stem);
  LOOM_CHECK(flags.batch_size % world == 0, "--batch-size ", flags.batch_size,
             " is the global batch and must divide evenly across the ", world, " processes");
  const int64_t batch_per_rank = flags.batch_size / world;
  const bool leader = rank == 0;
  const data::LoadedData loaded = load_data(flags);
  const char* synthetic_note = flags.synthetic ? " (synthetic data)" : "";

  // init_process_group reads the same launch variables and meets the other
  // ranks at MASTER_ADDR:MASTER_PORT; nccl works on the training device.
  std::shared_ptr<dist::ProcessGroup> group = apps::make_process_group(common, backend, device, world);
  manual_seed(common.seed);
  std::shared_ptr<nn::ResNet> model = nn::make_resnet(flags.model, nn::ResNetOptions()
                                                                          .num_classes(loaded.num_classes)
                                                                          .in_channels(loaded.sample_shape().channels)
                                                                          .stem(stem));
  model->to(device);  // before the optimizer and DDP take the parameters
  // --sync-bn: every BatchNorm2d becomes a SyncBatchNorm over the group (same
  // names and tensors, so checkpoints are unchanged); with one process it
  // computes what BatchNorm2d does.
  if (common.sync_bn) dist::convert_sync_batchnorm(model, group);
  // apex's amp.initialize: the model in the level's dtypes (--amp O2: f16 but
  // batch norm), SGD over what it must step (f32 master weights at O2 / O3 / bf16).
  const double lr = learning_rate(flags);
  std::shared_ptr<amp::MixedPrecisionOptimizer> optimizer = amp::initialize(
      *model,
      [&](std::vector<Tensor> parameters) -> std::unique_ptr<optim::Optimizer> {
        return std::make_unique<optim::SGD>(
            std::move(parameters), optim::SGDOptions(lr).momentum(flags.momentum).weight_decay(flags.weight_decay));
      },
      amp::parse_opt_level(common.amp));

  if (leader) {
    std::printf(">>> Training on %d %s, master node is %s\n", world, device.is_cpu() ? "CPU processes" : "GPUs",
                launch.launcher == dist::Launcher::none ? host_name().c_str() : launch.master_addr.c_str());
  }
  std::printf("- Process %d is local rank %d on node %d (%s)\n", rank, launch.local_rank, launch.node_rank,
              device.str().c_str());
  if (leader) {
    std::printf("%s%s: %lld training, %lld test images; %s (%s stem), global batch %lld (%lld per process)\n",
                loaded.description.c_str(), synthetic_note, static_cast<long long>(loaded.train_size()),
                static_cast<long long>(loaded.test_size()), flags.model.c_str(), flags.stem.c_str(),
                static_cast<long long>(flags.batch_size), static_cast<long long>(batch_per_rank));
    if (world > 1) {
      std::printf("Distributed: %d processes (%s), backend %s%s\n", world, dist::launcher_name(launch.launcher),
                  group->backend_name(), common.sync_bn ? ", SyncBatchNorm" : "");
    } else if (common.sync_bn) {
      std::printf("note: --sync-bn with one process: SyncBatchNorm computes what BatchNorm2d does\n");
    }
  }
  // In-memory data (CIFAR-10, MNIST); image folders bring their own (--image-size).
  const bool cifar = loaded.kind == data::DatasetKind::cifar10;
  const data::Normalize normalize = cifar ? data::cifar10_normalize() : data::mnist_normalize();
  const int64_t side = loaded.sample_shape().height;
  const data::Compose train_transforms(
      {data::RandomCrop(side, cifar ? 4 : 0), data::RandomHorizontalFlip{cifar ? 0.5 : 0.0}, data::ToTensor{},
       normalize});
  data::DataLoader train_loader = loaded.loader(
      true, train_transforms, apps::loader_options(common, batch_per_rank, device),
      std::make_shared<data::DistributedSampler>(loaded.train_size(), world, rank, /*shuffle=*/true, common.seed));
  // Rank r tests images r, r + world, ...: every test image once, no padding.
  data::DataLoader test_loader =
      loaded.loader(false, data::Compose({data::ToTensor{}, normalize}), apps::loader_options(common, batch_per_rank, device),
                    std::make_shared<dist::ShardSampler>(loaded.test_size(), world, rank));
  const int64_t batches = train_loader.num_batches();
  const int64_t steps_per_epoch = flags.max_steps > 0 ? std::min(batches, flags.max_steps) : batches;
  // Counted in optimizer steps from the start of the run, so a resumed run
  // (its step from the checkpoint) warms up exactly as an uninterrupted one.
  const int64_t warmup_steps = std::llround(flags.warmup_epochs * static_cast<double>(steps_per_epoch));
  if (leader) {
    std::printf("SGD lr %g%s, momentum %g, weight decay %g, schedule %s, linear warm-up over %lld steps\n", lr,
                flags.lr ? "" : str(" (0.1 x batch ", flags.batch_size, " / 128)").c_str(), flags.momentum,
                flags.weight_decay, flags.schedule.c_str(), static_cast<long long>(warmup_steps));
  }
  std::fflush(stdout);

  train::Trainer trainer(model, optimizer,
                         apps::trainer_options("train_resnet50_cifar", argc, argv, common, flags.checkpoints, group)
                             .epochs(flags.epochs)
                             .max_steps_per_epoch(flags.max_steps)
                             .warmup_steps(warmup_steps)
                             .settings(run_settings(flags, world)));
  trainer.scheduler(make_scheduler(flags, optimizer->optimizer()));
  trainer.on_log([](const train::StepInfo& step, double loss) {
    std::printf("Epoch[%lld/%lld], Step[%lld/%lld], Loss: %.4f, Time dataload: %.3f ms, Time training: %.3f ms\n",
                static_cast<long long>(step.epoch + 1), static_cast<long long>(step.epochs),
                static_cast<long long>(step.epoch_step), static_cast<long long>(step.steps_per_epoch), loss,
                1000.0 * step.data_wait_seconds, 1000.0 * step.step_seconds);
  });
  trainer.after_training([&](const train::FitResult& result) {
    std::printf(">>> Training complete in: %s\n", train::format_duration(result.elapsed).c_str());
    apps::print_loss_scaling(*optimizer, common.amp);
  });
  trainer.after_evaluation([&](const train::FitResult& result) {
    std::printf(">>> Test accuracy%s: %.4f (%lld/%lld)\n", synthetic_note, result.accuracy->accuracy(),
                static_cast<long long>(result.accuracy->correct), static_cast<long long>(result.accuracy->total));
  });
  return trainer.fit(train_loader, &test_loader).exit_code();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train a ResNet on CIFAR-10 with loom (the SLURM DDP tutorial)"};
  apps::argparse_option_rules(app);
  Flags flags;
  apps::add_count(app, "-b,--batch-size", flags.batch_size, "global batch size, split evenly across the processes", 1);
  apps::add_count(app, "-e,--epochs", flags.epochs, "total epochs to run", 0);
  apps::add_checkpoint_flags(app, flags.checkpoints);
  app.add_option("--data", flags.data, "CIFAR-10, binary or python version: DIR/cifar-10-batches-bin/, DIR/cifar-10-batches-py/ (torchvision's root) or DIR itself")->capture_default_str();
  apps::add_choice(app, "--dataset", flags.dataset,
                   "cifar10, mnist, imagefolder (DIR/train/<class>/*.jpg|png and DIR/val/), or auto: what --data holds",
                   {"auto", "cifar10", "mnist", "imagefolder"});
  apps::add_count(app, "--image-size", flags.image_size,
                  "image folders: RandomResizedCrop size for training, Resize(size * 8 / 7) + CenterCrop(size) "
                  "for testing",
                  8);
  app.add_flag("--synthetic", flags.synthetic, "train on generated CIFAR-shaped images instead of CIFAR-10");
  apps::add_count(app, "--synthetic-size", flags.synthetic_size,
                  "synthetic training images (test: a fifth as many)", 1);
  apps::add_choice(app, "--model", flags.model, "resnet18, resnet34, resnet50, resnet101 or resnet152",
                   {"resnet18", "resnet34", "resnet50", "resnet101", "resnet152"});
  apps::add_choice(app, "--stem", flags.stem, "imagenet (7x7/2 conv + maxpool, torchvision) or cifar (3x3/1 conv)",
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
  return apps::run_app(app, "train_resnet50_cifar", std::vector<std::string>(argv, argv + argc), [&] { return run(flags, argc, argv); });
}
