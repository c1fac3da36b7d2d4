// train_mnist: the tutorials' ConvNet (or a 1-channel ResNet, --model) on MNIST / Fashion-MNIST.
//   train_mnist --epochs 2 --batch-size 100 --lr 0.01
//   train_mnist --amp O2     (mixed precision: apex's amp.initialize(model, optimizer, opt_level='O2'))
//   train_mnist -n 1 -g 2 -nr 0        (spawns 2 local ranks, like the tutorial's mp.spawn)
//   loomrun --nproc_per_node=2 train_mnist   (or srun: the ranks come from the launcher)
// Setup only: loom::train's Trainer runs the loop (loss lines, checkpoints,
// resume, the stop on signals, the test accuracy over every rank's shard).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "apps/app_common.h"
#include "apps/datasets.h"
#include "apps/training.h"
#include <loom/core/cuda/runtime.h>
#include <loom/core/generator.h>
#include <loom/dist/launcher.h>
#include <loom/dist/sync_batch_norm.h>

namespace fs = std::filesystem;
using namespace loom;

namespace {

struct Flags {
  int epochs = 2;
  int64_t batch_size = 100, max_steps = 0;  // per process; steps in all (0 = full epochs)
  double lr = 0.01, momentum = 0.9;
  std::string optimizer = "sgd", model = "convnet";
  apps::DataFlags data;  // --data, --dataset, --image-size
  bool verbose = false;
  int nodes = 1, gpus = 1, node_rank = 0;  // the tutorial's -n / -g / -nr (spawning without a launcher)
  std::string save;                         // the final model as safetensors (torch.save(net.state_dict(), ...))
  apps::CommonFlags common;                 // --device, --backend, --amp, --workers, --log-interval, ...
  apps::CheckpointFlags checkpoints;        // --checkpoint-dir, --resume, --checkpoint-every, ...
};

int run(const Flags& flags, int argc, char** argv) {
  // Without a launcher, -g > 1 or -n > 1 makes this process the spawner of the ranks.
  const dist::Launcher launcher = dist::detect_launcher();
  if (launcher == dist::Launcher::none && flags.nodes * flags.gpus > 1)
    return apps::spawn_local_ranks("train_mnist", flags.nodes, flags.gpus, flags.node_rank, argc, argv);
  const apps::CommonFlags& common = flags.common;
  const apps::RankContext rank = apps::start_rank(common, flags.checkpoints);
  const fs::path save_dir = fs::path(flags.save).has_parent_path() ? fs::path(flags.save).parent_path() : ".";
  LOOM_CHECK(!rank.leader || flags.save.empty() || fs::is_directory(save_dir), "--save ", flags.save, ": directory ",
             save_dir.string(), " does not exist");
  const fs::path dir = apps::mnist_data_dir(flags.data.data);
  const data::LoadedData loaded = apps::load_mnist_app_data(dir, flags.data.dataset, flags.data.image_size,
                                                            apps::image_folder_split(flags.data, common.seed));
  const data::SampleShape shape = loaded.sample_shape();
  if (rank.leader) {
    std::printf("Training on %s (%lld training, %lld test images) from %s\n", loaded.description.c_str(),
                static_cast<long long>(loaded.train_size()), static_cast<long long>(loaded.test_size()), dir.c_str());
    if (!loaded.split.empty()) std::printf("%s\n", loaded.split.c_str());
  }
  LOOM_CHECK(flags.model != "convnet" || (shape.channels == 1 && shape.height == 28 && shape.width == 28),
             "--model convnet takes 1x28x28 images; ", loaded.description, " gives ", shape.channels, "x",
             shape.height, "x", shape.width, ": use --model resnet18",
             loaded.kind == data::DatasetKind::imagefolder ? " or --image-size 28" : "");

  manual_seed(common.seed);
  // The ResNets take 1-channel images with the ImageNet stem (the ResNet-101 tutorial); the others repeat the channel.
  std::shared_ptr<nn::Module> model = apps::make_model(flags.model, loaded.num_classes, shape.channels);
  apps::place_model(*model, common, rank.device);  // (--channels-last) before the optimizer and DDP take it
  std::shared_ptr<dist::ProcessGroup> group = apps::make_process_group(common, rank.backend, rank.device, rank.world);
  if (common.sync_bn) model = dist::convert_sync_batchnorm(model, group);
  // apex's amp.initialize: the model in the level's dtypes (--amp O2: f16 but batch norm), the
  // optimizer over what it steps (f32 masters at O2 / O3 / bf16), with --zero over this rank's shard.
  std::shared_ptr<amp::MixedPrecisionOptimizer> optimizer = apps::initialize_optimizer(
      *model, common, group, [&](std::vector<Tensor> parameters) -> std::unique_ptr<optim::Optimizer> {
        if (flags.optimizer == "adam") return std::make_unique<optim::Adam>(std::move(parameters), optim::AdamOptions(flags.lr));
        return std::make_unique<optim::SGD>(std::move(parameters), optim::SGDOptions(flags.lr).momentum(flags.momentum));
      });
  train::Trainer trainer(model, optimizer,
                         apps::trainer_options("train_mnist", argc, argv, common, flags.checkpoints, group)
                             .epochs(flags.epochs)
                             .max_steps(flags.max_steps)
                             .settings({{"model", flags.model}, {"world_size", std::to_string(rank.world)},
                                        {"batch_size", std::to_string(flags.batch_size)},
                                        {"seed", std::to_string(common.seed)},
                                        {"epochs", std::to_string(flags.epochs)}}));
  const bool spawned = std::getenv("LOOM_SPAWNED_BY") != nullptr;
  if (rank.leader && rank.world > 1) {
    std::printf("Distributed: %d processes (%s), backend %s, batch %lld per process%s\n", rank.world,
                spawned ? "spawned by train_mnist -g" : dist::launcher_name(launcher), group->backend_name(),
                static_cast<long long>(flags.batch_size), common.sync_bn ? ", SyncBatchNorm" : "");
  }
  if (rank.leader && !spawned && launcher != dist::Launcher::none && (flags.nodes * flags.gpus != 1 || flags.node_rank))
    std::printf("note: started by a launcher (%s), so -n / -g / -nr are ignored\n", dist::launcher_name(launcher));
  std::fflush(stdout);
  const bool cifar = loaded.kind == data::DatasetKind::cifar10;  // 28x28 -> 32x32 but for the ConvNet and ResNets:
  const data::Compose transforms = apps::with_model_crop(
      flags.model, shape, {data::ToTensor{}, cifar ? data::cifar10_normalize() : data::mnist_normalize()});
  apps::Loaders loaders = apps::make_loaders(loaded, transforms, transforms, common, rank, flags.batch_size, 500);
  trainer.after_training([&](const train::FitResult& result) {
    if (flags.verbose && rank.device.is_cuda())
      std::printf("CUDA memory: %s\n", cuda::memory_summary(rank.device.index).c_str());
    apps::print_training_complete("", result, *optimizer, common.amp);
    std::printf("Throughput: %.1f images/s (%d process%s), time waiting for data: %.3f s\n",
                result.images_per_second(), rank.world, rank.world == 1 ? "" : "es", result.data_wait_seconds);
  });
  trainer.after_evaluation([&](const train::FitResult& result) {
    std::printf("Test accuracy: %.4f (%lld/%lld)\n", result.accuracy->accuracy(),
                static_cast<long long>(result.accuracy->correct), static_cast<long long>(result.accuracy->total));
    if (flags.save.empty()) return;
    nn::save_checkpoint(flags.save, {model->state_dict(), std::nullopt});  // PyTorch's names: load_state_dict takes it
    std::printf("Saved the model to %s\n", flags.save.c_str());
  });
  return trainer.fit(loaders.train, &loaders.test).exit_code();
}

void add_flags(CLI::App& app, Flags& flags) {
  apps::add_count(app, "--epochs", flags.epochs, "number of epochs", 0);
  apps::add_count(app, "--batch-size", flags.batch_size, "images per step", 1);
  app.add_option("--lr", flags.lr, "learning rate")->capture_default_str()->check(apps::at_least(0));
  app.add_option("--momentum", flags.momentum, "SGD momentum")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  std::vector<std::string> models = apps::model_names();
  models.insert(models.begin(), "convnet");
  apps::add_choice(app, "--model", flags.model,
                   apps::join_names(models) + " (the ResNets take 1 channel; the others repeat it to 3, 28x28 padded "
                   "to 32x32)", models);
  apps::add_choice(app, "--optimizer", flags.optimizer, "sgd or adam", {"sgd", "adam"});
  apps::add_mnist_data_flags(app, flags.data);
  app.add_flag("--verbose", flags.verbose, "print the CUDA allocator's memory counters after training");
  apps::add_count(app, "--max-steps", flags.max_steps, "stop after this many steps (0 = full epochs)", 0);
  apps::add_count(app, "-n,--nodes", flags.nodes, "number of nodes (spawning mode, without a launcher)", 1);
  apps::add_count(app, "-g,--gpus", flags.gpus, "processes per node to spawn: GPUs, or CPU processes with --device cpu", 1);
  apps::add_count(app, "--nr", flags.node_rank, "rank of this node, 0 .. nodes-1 (also -nr)", 0);
  apps::add_version_flag(app, "train_mnist");
  flags.common.log_interval = 100;
  apps::add_common_flags(app, flags.common);
  apps::add_checkpoint_flags(app, flags.checkpoints);
  app.add_option("--save", flags.save,
                 "after training, rank 0 writes the model's state_dict here as safetensors under PyTorch's names "
                 "(the tutorial's torch.save(net.state_dict(), PATH))");
}

}  // namespace

int main(int argc, char** argv) {
  return apps::run_app<Flags>("train_mnist", "Train the tutorials' ConvNet on MNIST / Fashion-MNIST with loom",
                              apps::one_dash_long_options(argc, argv, {"-nr"}), add_flags,
                              [&](const Flags& flags) { return run(flags, argc, argv); });
}
