// What train_mnist and train_resnet50_cifar share around loom::train's
// Trainer: the common flags (one definition, one help text, one check each)
// and the Trainer's options they give, thread, backend and process-group
// setup, the loaders' options and main()'s error handling. app_common.h holds
// the lower pieces (devices, validators, checkpoint flags).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "apps/app_common.h"
#include <loom/data/loader.h>
#include <loom/data/transforms.h>
#include <loom/nn/resnet.h>
#include <loom/data/selection.h>
#include <loom/dist/environment.h>
#include <loom/dist/process_group.h>
#include <loom/optim/amp.h>
#include <loom/optim/lr_scheduler.h>
#include <loom/train/trainer.h>

namespace loom::apps {

// The flags both training apps take, with the same meaning, help and checks.
// (--epochs, --batch-size and --max-steps differ between them, so each app
// declares its own.)
struct CommonFlags {
  std::string device = "cpu";     // cpu, cuda, cuda:N or auto
  std::string backend = "auto";   // nccl, gloo, shm or auto
  std::string amp = "O0";         // apex's opt level, or bf16
  bool sync_bn = false;
  int workers = 1;                // data loader threads
  int threads = 0;                // 0: all cores, or 1 when several processes run
  uint64_t seed = 0;
  int64_t log_interval = 100;     // steps between loss lines (the app sets its default)
  double timeout_s = 0;           // 0: LOOM_COLLECTIVE_TIMEOUT, else 30 minutes
  std::string progress = "auto";  // rank 0's progress display: auto, bar, lines or none
  std::string metrics;            // JSON Lines file rank 0 appends to; '' = none
  std::string tensorboard;        // TensorBoard log directory; '' = none
  std::string trace;              // Chrome trace file; '' = none
  double clip_grad_norm = 0;      // max total gradient 2-norm; 0 = no clipping
  int64_t accumulate_steps = 1;   // batches per optimizer step
  bool zero = false;              // the optimizer state sharded over the processes (ZeRO stage 1)
  bool no_pad_last = false;       // no DistributedSampler padding; uneven epoch ends inside dist::Join
  bool channels_last = false;     // the model's weights and the loaders' batches NHWC
  bool cuda_graph = false;        // each training step the replay of one CUDA graph (GPU)
  MemoryFormat memory_format() const { return channels_last ? MemoryFormat::nhwc : MemoryFormat::nchw; }
};

// Adds --device, --backend, --amp, --sync-bn, --workers, --threads, --seed,
// --log-interval, --timeout, --progress, --metrics, --tensorboard, --trace,
// --clip-grad-norm, --accumulate-steps, --zero, --no-pad-last, --channels-last and --cuda-graph, and rejects at
// parse time the flags that exclude each other (app's parse_complete_callback). Every
// flag both apps take is added here, so a new one is one line.
void add_common_flags(CLI::App& app, CommonFlags& flags);

// Who this process is and what it trains on.
struct RankContext {
  dist::LaunchEnvironment launch;  // the launcher's rank variables, or one process
  int rank = 0, world = 1;
  bool leader = true;              // rank 0, the one that prints and writes
  Device device;                   // --device for this rank (its GPU: cuda:LOCAL_RANK)
  std::string backend;             // what --backend asks the process group for
};

// The start of every app's run: the stop signals' handlers (SIGTERM, SIGINT
// and --checkpoint-signal), the launch environment, --threads, the training
// device (made current) and the backend, checked before any rendezvous
// (--zero needs several processes).
RankContext start_rank(const CommonFlags& flags, const CheckpointFlags& checkpoints);

// The training loader, this rank's share of each epoch's shuffle
// (DistributedSampler, --seed; padded to a multiple of the world, or with
// --no-pad-last each sample once, Remainder::uneven), and the test loader
// over its shard of the test set (ShardSampler: every test image once over
// the ranks).
struct Loaders {
  data::DataLoader train;
  data::DataLoader test;
};
Loaders make_loaders(const data::LoadedData& loaded, const data::Compose& train_transforms,
                     const data::Compose& test_transforms, const CommonFlags& flags, const RankContext& rank,
                     int64_t train_batch, int64_t test_batch);

// The parent of the tutorial's `-n NODES -g GPUS -nr NODE_RANK` (mp.spawn):
// starts GPUS local ranks of this program (argv again), which see RANK /
// WORLD_SIZE and train; waits, forwarding SIGINT / SIGTERM, and ends them all
// when one fails. Returns the exit code.
int spawn_local_ranks(const char* program, int nodes, int gpus, int node_rank, int argc, char** argv);

// "PROGRAM ... complete in: h:mm:ss.ffffff" as the tutorials print it
// (`prefix` before "Training"), then print_loss_scaling.
void print_training_complete(const char* prefix, const train::FitResult& result,
                             const amp::MixedPrecisionOptimizer& optimizer, const std::string& amp);

// --schedule: "cosine" (CosineAnnealingLR over `epochs`), "step" (x0.1 after
// every third of the run) or "none" (null), stepped once per epoch.
std::shared_ptr<optim::LRScheduler> make_epoch_schedule(const std::string& name, optim::Optimizer& optimizer,
                                                        int64_t epochs);

// The SLURM tutorial's banner: rank 0's ">>> Training on 2 GPUs, master
// node is HOST" and every rank's "- Process 1 is local rank 1 on node 0 (cuda:1)".
void print_launch_banner(const RankContext& rank);

// --threads N: N threads; 0: all cores, or 1 when several ranks share the machine.
void set_threads(const CommonFlags& flags, int world);

// The backend to ask for: --backend as given, or for auto nccl on a CUDA
// device and auto on the CPU (init_process_group then picks shm when every
// rank is on this host, gloo otherwise). --backend nccl says why it cannot
// run before any rendezvous, also in a world of one: no CUDA or NCCL in this
// build, no visible GPU, or CPU training.
std::string choose_backend(const std::string& flag, Device device);

// The process group of a world > 1 (null for one process): the rendezvous
// waits at least 5 minutes for the other processes (nodes are often started
// by hand, one after the other); collectives wait --timeout. nccl drives the
// training device.
std::shared_ptr<dist::ProcessGroup> make_process_group(const CommonFlags& flags, const std::string& backend,
                                                       Device device, int world);

// apex's amp.initialize at --amp's level with the optimizer `make_optimizer`
// builds over what amp steps (the f32 masters at O2 / O3 / bf16); with
// --zero that optimizer is built over this process's shard only, inside a
// dist::ZeroRedundancyOptimizer over `group`, and rank 0 says how the state
// is split.
std::shared_ptr<amp::MixedPrecisionOptimizer> initialize_optimizer(nn::Module& model, const CommonFlags& flags,
                                                                   const std::shared_ptr<dist::ProcessGroup>& group,
                                                                   const amp::OptimizerFactory& make_optimizer);

// The model on `device` and, with --channels-last, its 4-d parameters and
// buffers channels-last (Module::to(MemoryFormat)). Before DDP and the
// optimizer take the parameters.
void place_model(nn::Module& model, const CommonFlags& flags, Device device);

// The loaders' options: `batch_size` images, --workers threads, --seed, the
// input dtype of --amp, NHWC batches with --channels-last, batches delivered
// on `device` (CUDA: pinned staging, copies on the loader's own stream).
data::DataLoaderOptions loader_options(const CommonFlags& flags, int64_t batch_size, Device device);

// The Trainer's options from the flags both apps take, in one place:
// --log-interval, --progress, --metrics, --tensorboard, --trace,
// --clip-grad-norm, --accumulate-steps, --no-pad-last (TrainerOptions::join),
// the checkpoint flags, the process group, and the metrics header's program and
// command line. The app adds what is its own (epochs, step limits, warm-up, settings).
train::TrainerOptions trainer_options(const char* program, int argc, char** argv, const CommonFlags& flags,
                                      const CheckpointFlags& checkpoints, std::shared_ptr<dist::ProcessGroup> group);

// "Mixed precision --amp LEVEL: loss scale S, N steps skipped for inf / NaN
// gradients" when `optimizer` scaled the loss (`amp` is the --amp flag).
void print_loss_scaling(const amp::MixedPrecisionOptimizer& optimizer, const std::string& amp);

// --model in both apps: the ResNets and torchvision's other CNNs in nn/ (VGG,
// MobileNet V2 / V3, EfficientNet-B0, RegNetY-400MF, ConvNeXt-Tiny), under
// torchvision's names.
const std::vector<std::string>& model_names();
// "a, b, ... or z", for --help and the unknown-name error.
std::string join_names(const std::vector<std::string>& names);

// --model NAME (or train_mnist's "convnet") with `num_classes` outputs for `in_channels`-channel images.
// The ResNets take in_channels (1 or 3) and `stem`; the other models keep
// torchvision's 3-channel first convolution, and 1-channel images (MNIST)
// reach it with the channel repeated three times (the state_dict keeps
// torchvision's names). An unknown name is one error naming them all.
std::shared_ptr<nn::Module> make_model(const std::string& name, int64_t num_classes, int64_t in_channels,
                                       nn::ResNetStem stem = nn::ResNetStem::imagenet);

// The crop the transforms start with: a random height x width window of the
// images padded by `padding`, except that the non-ResNet models get images of
// at least 32x32 (VGG's five 2x2 pools and ConvNeXt's stride of 32 need them):
// MNIST's 28x28 is padded by 2 and cropped to 32x32.
data::RandomCrop model_input_crop(const std::string& model, const data::SampleShape& shape, int64_t padding);
// `transforms` after model_input_crop(model, shape, 0) when that crop changes the size.
data::Compose with_model_crop(const std::string& model, const data::SampleShape& shape,
                              std::vector<data::Transform> transforms);

// main() of a training app: parses `arguments` into `app` (--help and
// --version print and exit 0; a bad command line is report_usage_error's
// "PROGRAM: MESSAGE", exit 2), then runs `run`; an exception from it is
// report_fatal_error's "PROGRAM: rank N: MESSAGE" (the rank when several
// run), exit 1. Returns the exit code.
int run_app(CLI::App& app, const char* program, std::vector<std::string> arguments, const std::function<int()>& run);

// run_app for a command line built here: `description`'s CLI11 app with
// argparse's option rules (argparse_option_rules), given its options and
// their defaults in `Flags` by add_flags(app, flags); then run(flags).
template <class Flags>
int run_app(const char* program, const std::string& description, std::vector<std::string> arguments,
            const std::function<void(CLI::App&, Flags&)>& add_flags, const std::function<int(const Flags&)>& run) {
  CLI::App app{description};
  argparse_option_rules(app);
  Flags flags;
  add_flags(app, flags);
  return run_app(app, program, std::move(arguments), [&] { return run(flags); });
}

}  // namespace loom::apps
