// train_mnist: the tutorials' ConvNet (or a 1-channel ResNet, --model) on MNIST / Fashion-MNIST.
//   train_mnist --epochs 2 --batch-size 100 --lr 0.01
//   train_mnist --amp O2     (mixed precision: apex's amp.initialize(model, optimizer, opt_level='O2'))
//   train_mnist -n 1 -g 2 -nr 0        (spawns 2 local ranks, like the tutorial's mp.spawn)
//   loomrun --nproc_per_node=2 train_mnist   (or srun: the ranks come from the launcher)
// Rank 0 prints "Epoch [e/E], Step [i/N], Loss: x" every --log-interval steps,
// "Training complete in: h:mm:ss.ffffff" and the test accuracy, evaluated on
// every rank's shard of the test set and summed over ranks. Checkpoints, exact
// mid-epoch resume and the stop on SIGTERM / SIGUSR1 / SIGINT work as in
// train_resnet50_cifar (apps/app_common.h); --save PATH writes the final model.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <vector>

#include "apps/app_common.h"
#include "apps/training.h"
#include <loom/core/autograd.h>
#include <loom/core/cuda/runtime.h>
#include <loom/core/generator.h>
#include <loom/core/parallel.h>
#include <loom/data/idx.h>
#include <loom/data/loader.h>
#include <loom/data/selection.h>
#include <loom/dist/ddp.h>
#include <loom/dist/environment.h>
#include <loom/dist/launcher.h>
#include <loom/dist/metrics.h>
#include <loom/dist/process_group.h>
#include <loom/dist/sync_batch_norm.h>
#include <loom/nn/checkpoint.h>
#include <loom/nn/convnet.h>
#include <loom/nn/resnet.h>
#include <loom/ops/loss.h>
#include <loom/optim/amp.h>
#include <loom/optim/optimizer.h>
#include <loom/train/monitor.h>
#include <loom/train/stop.h>
#include <loom/train/trainer.h>

namespace fs = std::filesystem;
using namespace loom;

namespace {

struct Flags {
  int epochs = 2;
  int64_t batch_size = 100;
  double lr = 0.01;
  double momentum = 0.9;
  std::string optimizer = "sgd";
  std::string model = "convnet";
  std::string data;
  std::string dataset = "auto";  // mnist, cifar10, imagefolder, or inferred from --data
  int64_t image_size = 28;       // image folders
  int64_t max_steps = 0;
  bool verbose = false;
  apps::CommonFlags common;  // --device, --backend, --amp, --workers, --log-interval, ...
  // Distributed (the tutorial's -n / -g / -nr): nodes, processes per node, this node's rank.
  int nodes = 1;
  int gpus = 1;
  int node_rank = 0;
  apps::CheckpointFlags checkpoints;  // --checkpoint-dir, --resume, --checkpoint-every, ...
  std::string save;  // the final model as safetensors (torch.save(net.state_dict(), ...))
};

// --data (the IDX files' directory, or torchvision's root holding MNIST/raw/),
// else torchvision's roots ./data and . (the tutorials' ./data/MNIST/raw and
// ./MNIST/raw), else Debian's Fashion-MNIST.
fs::path resolve_data_dir(const std::string& flag) {
  if (!flag.empty()) {
    if (!fs::is_directory(flag)) throw Error("--data " + flag + ": no such directory");
    return flag;
  }
  for (const char* root : {"./data", "."}) {
    if (std::optional<fs::path> found = data::find_mnist(root)) return *found;
  }
  if (fs::is_directory("/usr/share/datasets/fashion-mnist")) return "/usr/share/datasets/fashion-mnist";
  throw Error(
      "no training data: pass --data DIR with the MNIST IDX files (or torchvision's root holding MNIST/raw/), put "
      "them in ./data/MNIST/raw or ./MNIST/raw, or install Fashion-MNIST with `apt-get install dataset-fashion-mnist`");
}

// The parent of `-g N` (mp.spawn): starts N local ranks of this program, which
// see RANK / WORLD_SIZE and train; waits, forwarding SIGINT / SIGTERM, and ends
// them all when one fails.
int spawn_local_ranks(const Flags& flags, int argc, char** argv) {
  LOOM_CHECK(flags.node_rank < flags.nodes, "-nr ", flags.node_rank, " must be smaller than -n ", flags.nodes,
             " (node ranks are 0 to nodes - 1)");
  dist::WorkerGroupSpec spec;
  spec.name = "train_mnist";
  spec.command.push_back("/proc/self/exe");
  for (int i = 1; i < argc; ++i) spec.command.push_back(argv[i]);
  spec.nproc_per_node = flags.gpus;
  spec.nnodes = flags.nodes;
  spec.node_rank = flags.node_rank;
  // MASTER_ADDR / MASTER_PORT from the environment (the tutorial sets them), else 127.0.0.1:29500.
  LOOM_CHECK(flags.nodes == 1 || std::getenv("MASTER_ADDR") != nullptr, "-n ", flags.nodes,
             ": set MASTER_ADDR (and MASTER_PORT, default ", dist::kDefaultMasterPort,
             ") to the address of node 0, the same on every node");
  const dist::LaunchEnvironment environment = dist::resolve_launch_environment();
  spec.master_addr = environment.master_addr;
  spec.master_port = environment.master_port;
  spec.environment["LOOM_SPAWNED_BY"] = "train_mnist";  // the ranks ignore -n / -g / -nr silently
  const dist::WorkerGroupResult result = dist::run_worker_group(spec);
  if (!result.succeeded && result.first_failure && result.received_signal == 0)
    std::fprintf(stderr, "train_mnist: failed: %s\n", result.first_failure->describe().c_str());
  return result.exit_code();
}

int run(const Flags& flags, int argc, char** argv) {
  // Started by a launcher (loomrun / torchrun, srun, mpirun): this process is
  // one rank. Otherwise -g > 1 or -n > 1 makes this process the spawner.
  const dist::Launcher launcher = dist::detect_launcher();
  if (launcher == dist::Launcher::none && flags.nodes * flags.gpus > 1) return spawn_local_ranks(flags, argc, argv);
  train::StopSignals::install(train::parse_signal_name(flags.checkpoints.signal));
  const dist::LaunchEnvironment launch = dist::resolve_launch_environment();
  const int world = launch.world_size;
  const bool leader = launch.rank == 0;
  const apps::CommonFlags& common = flags.common;
  apps::set_threads(common, world);
  const Device device = apps::resolve_training_device(common.device, launch.local_rank);
  const std::string backend = apps::choose_backend(common.backend, device);
  if (leader && !flags.save.empty()) {
    const fs::path parent = fs::path(flags.save).has_parent_path() ? fs::path(flags.save).parent_path() : ".";
    LOOM_CHECK(fs::is_directory(parent), "--save ", flags.save, ": directory ", parent.string(), " does not exist");
  }
  const fs::path dir = resolve_data_dir(flags.data);
  std::optional<data::DatasetKind> kind = data::parse_dataset_kind(flags.dataset);
  if (!kind) kind = data::infer_dataset_kind(dir).value_or(data::DatasetKind::mnist);
  // Image folders in grayscale at --image-size: Resize(size) + CenterCrop(size), as MNIST's 28x28.
  const std::vector<data::ImageTransform> folder_transforms = {
      data::Resize{flags.image_size}, data::CenterCrop{flags.image_size}, data::ToTensor{}, data::Normalize{{0.5}, {0.5}}};
  const data::ImageFolderOptions folder_options{data::ColorMode::grayscale, folder_transforms};
  const data::LoadedData loaded = data::load_dataset(*kind, dir, folder_options, folder_options);
  const data::SampleShape shape = loaded.sample_shape();
  if (leader) {
    std::printf("Training on %s (%lld training, %lld test images) from %s\n", loaded.description.c_str(),
                static_cast<long long>(loaded.train_size()), static_cast<long long>(loaded.test_size()), dir.c_str());
  }
  if (flags.model == "convnet" && (shape.channels != 1 || shape.height != 28 || shape.width != 28)) {
    throw Error(str("--model convnet takes 1x28x28 images; ", loaded.description, " gives ", shape.channels, "x",
                    shape.height, "x", shape.width, ": use --model resnet18", loaded.kind == data::DatasetKind::imagefolder ? " or --image-size 28" : ""));
  }

  manual_seed(common.seed);
  // The ResNets take 1-channel 28x28 images with the ImageNet stem (the ResNet-101 tutorial).
  std::shared_ptr<nn::Module> model;
  if (flags.model == "convnet") {
    model = std::make_shared<nn::ConvNet>(loaded.num_classes);
  } else {
    model = nn::make_resnet(flags.model, nn::ResNetOptions().num_classes(loaded.num_classes).in_channels(shape.channels));
  }
  model->to(device);  // before DDP and the optimizer take the parameters
  std::shared_ptr<dist::ProcessGroup> group = apps::make_process_group(common, backend, device, world);
  if (common.sync_bn) model = dist::convert_sync_batchnorm(model, group);
  // apex's amp.initialize: the model in the level's dtypes (--amp O2: f16 but
  // batch norm) and the optimizer over what it must step (f32 master weights
  // at O2 / O3 / bf16); after SyncBatchNorm replaced the batch norms, before
  // the Trainer wraps the model in DDP.
  std::shared_ptr<amp::MixedPrecisionOptimizer> optimizer = amp::initialize(
      *model,
      [&](std::vector<Tensor> parameters) -> std::unique_ptr<optim::Optimizer> {
        if (flags.optimizer == "sgd") {
          return std::make_unique<optim::SGD>(std::move(parameters), optim::SGDOptions(flags.lr).momentum(flags.momentum));
        }
        return std::make_unique<optim::Adam>(std::move(parameters), optim::AdamOptions(flags.lr));
      },
      amp::parse_opt_level(common.amp));
  train::Trainer trainer(
      model, optimizer,
      apps::trainer_options("train_mnist", argc, argv, common, flags.checkpoints, group)
          .epochs(flags.epochs)
          .max_steps(flags.max_steps)
          .settings({{"model", flags.model}, {"world_size", std::to_string(world)},
                     {"batch_size", std::to_string(flags.batch_size)}, {"seed", std::to_string(common.seed)}}));
  const bool spawned = std::getenv("LOOM_SPAWNED_BY") != nullptr;
  if (leader && world > 1) {
    std::printf("Distributed: %d processes (%s), backend %s, batch %lld per process%s\n", world,
                spawned ? "spawned by train_mnist -g" : dist::launcher_name(launcher), group->backend_name(),
                static_cast<long long>(flags.batch_size), common.sync_bn ? ", SyncBatchNorm" : "");
  }
  if (leader && !spawned && launcher != dist::Launcher::none &&
      (flags.nodes != 1 || flags.gpus != 1 || flags.node_rank != 0)) {
    std::printf("note: started by a launcher (%s), so -n / -g / -nr are ignored\n", dist::launcher_name(launcher));
  }
  std::fflush(stdout);

  // Each rank takes every world-th image of the epoch's shared permutation
  // (DistributedSampler), --batch-size at a time; the test set in shards.
  const data::Compose transforms({data::ToTensor{}, loaded.kind == data::DatasetKind::cifar10
                                                          ? data::cifar10_normalize()
                                                          : data::mnist_normalize()});
  data::DataLoader train_loader = loaded.loader(
      true, transforms, apps::loader_options(common, flags.batch_size, device),
      std::make_shared<data::DistributedSampler>(loaded.train_size(), world, launch.rank, /*shuffle=*/true, common.seed));
  data::DataLoader test_loader = loaded.loader(false, transforms, apps::loader_options(common, 500, device),
                                               std::make_shared<dist::ShardSampler>(loaded.test_size(), world, launch.rank));
  trainer.after_training([&](const train::FitResult& result) {
    if (flags.verbose && device.is_cuda()) std::printf("CUDA memory: %s\n", cuda::memory_summary(device.index).c_str());
    std::printf("Training complete in: %s\n", train::format_duration(result.elapsed).c_str());
    apps::print_loss_scaling(*optimizer, common.amp);
    std::printf("Throughput: %.1f images/s (%d process%s), time waiting for data: %.3f s\n",
                result.images_per_second(), world, world == 1 ? "" : "es", result.data_wait_seconds);
  });
  trainer.after_evaluation([&](const train::FitResult& result) {
    std::printf("Test accuracy: %.4f (%lld/%lld)\n", result.accuracy->accuracy(),
                static_cast<long long>(result.accuracy->correct), static_cast<long long>(result.accuracy->total));
    if (!flags.save.empty()) {
      // The model's state_dict under PyTorch's names: torch's load_state_dict takes it.
      nn::save_checkpoint(flags.save, {model->state_dict(), std::nullopt});
      std::printf("Saved the model to %s\n", flags.save.c_str());
    }
  });
  return trainer.fit(train_loader, &test_loader).exit_code();
}

// argparse-style "-nr K" (a one-dash long flag, as in the tutorial) becomes
// "--nr K", which CLI11 understands.
std::vector<std::string> normalized_arguments(int argc, char** argv) {
  std::vector<std::string> arguments(argv, argv + argc);
  for (size_t i = 1; i < arguments.size(); ++i) {
    if (arguments[i] == "--") break;
    if (arguments[i] == "-nr" || arguments[i].rfind("-nr=", 0) == 0) arguments[i] = "-" + arguments[i];
  }
  return arguments;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train the tutorials' ConvNet on MNIST / Fashion-MNIST with loom"};
  apps::argparse_option_rules(app);
  Flags flags;
  apps::add_count(app, "--epochs", flags.epochs, "number of epochs", 0);
  apps::add_count(app, "--batch-size", flags.batch_size, "images per step", 1);
  app.add_option("--lr", flags.lr, "learning rate")->capture_default_str()->check(apps::at_least(0));
  app.add_option("--momentum", flags.momentum, "SGD momentum")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  apps::add_choice(app, "--model", flags.model, "convnet, resnet18, resnet50 or resnet101",
                   {"convnet", "resnet18", "resnet34", "resnet50", "resnet101", "resnet152"});
  apps::add_choice(app, "--optimizer", flags.optimizer, "sgd or adam", {"sgd", "adam"});
  apps::add_choice(app, "--dataset", flags.dataset,
                   "mnist, cifar10 (with --model resnet*), imagefolder (DIR/train/<class>/*.jpg|png and DIR/val/, "
                   "read in grayscale), or auto: what --data holds",
                   {"auto", "mnist", "cifar10", "imagefolder"});
  apps::add_count(app, "--image-size", flags.image_size, "image folders: Resize(size) + CenterCrop(size)", 8);
  app.add_option("--data", flags.data, "directory with the IDX files, or torchvision's root holding MNIST/raw/ (default ./data/MNIST/raw, else ./MNIST/raw, else /usr/share/datasets/fashion-mnist)");
  app.add_flag("--verbose", flags.verbose, "print the CUDA allocator's memory counters after training");
  apps::add_count(app, "--max-steps", flags.max_steps, "stop after this many steps (0 = full epochs)", 0);
  apps::add_count(app, "-n,--nodes", flags.nodes, "number of nodes (spawning mode, without a launcher)", 1);
  apps::add_count(app, "-g,--gpus", flags.gpus,
                  "processes per node to spawn: GPUs, or CPU processes with --device cpu", 1);
  apps::add_count(app, "--nr", flags.node_rank, "rank of this node, 0 .. nodes-1 (also -nr)", 0);
  apps::add_version_flag(app, "train_mnist");
  flags.common.log_interval = 100;
  apps::add_common_flags(app, flags.common);
  apps::add_checkpoint_flags(app, flags.checkpoints);
  app.add_option("--save", flags.save,
                 "after training, rank 0 writes the model's state_dict here as safetensors under PyTorch's names "
                 "(the tutorial's torch.save(net.state_dict(), PATH))");
  return apps::run_app(app, "train_mnist", normalized_arguments(argc, argv), [&] { return run(flags, argc, argv); });
}
