#include "apps/training.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <loom/core/autograd.h>
#include <loom/core/error.h>
#include <loom/core/generator.h>
#include <loom/core/log.h>
#include <loom/core/parallel.h>
#include <loom/dist/environment.h>
#include <loom/dist/host_staging.h>
#include <loom/dist/launcher.h>
#include <loom/dist/process_group_nccl.h>
#include <loom/dist/zero_redundancy_optimizer.h>
#include <loom/nn/convnet.h>
#include <loom/nn/convnext.h>
#include <loom/nn/efficientnet.h>
#include <loom/nn/mobilenet.h>
#include <loom/nn/regnet.h>
#include <loom/nn/vgg.h>
#include <loom/ops/cat.h>
#include <loom/ops/cpu/gemm.h>
#include <loom/train/monitor.h>
#include <loom/train/stop.h>
#include <loom/ops/loss.h>

namespace loom::apps {

namespace {

// A torchvision CNN fed 1-channel images: forward repeats the channel three
// times. It registers the model's own children under their names, so its
// state_dict (and a checkpoint) is the model's, torchvision's names included.
class RepeatChannels : public nn::Module {
 public:
  explicit RepeatChannels(std::shared_ptr<nn::Module> model) : model_(std::move(model)) {
    // Each child shared through the model's ownership (aliasing pointers).
    for (const auto& [name, child] : model_->named_children())
      register_module(name, std::shared_ptr<nn::Module>(model_, child));
  }
  Tensor forward(const Tensor& input) override { return model_->forward(cat({input, input, input}, 1)); }
  std::string type_name() const override { return model_->type_name(); }

 private:
  std::shared_ptr<nn::Module> model_;
};

template <class M>
std::shared_ptr<nn::Module> for_channels(const std::string& name, std::shared_ptr<M> model, int64_t in_channels) {
  LOOM_CHECK(in_channels == 1 || in_channels == 3, "--model ", name, " takes 3-channel (or 1-channel) images, not ",
             in_channels, "-channel ones");
  if (in_channels == 3) return model;
  return std::make_shared<RepeatChannels>(model);
}

}  // namespace

const std::vector<std::string>& model_names() {
  static const std::vector<std::string> names = {
      "resnet18",           "resnet34",           "resnet50",        "resnet101",      "resnet152",
      "vgg11_bn",           "vgg16_bn",           "mobilenet_v2",    "mobilenet_v3_small",
      "mobilenet_v3_large", "efficientnet_b0",    "regnet_y_400mf",  "convnext_tiny"};
  return names;
}

std::string join_names(const std::vector<std::string>& names) {
  std::string text;
  for (size_t i = 0; i < names.size(); ++i)
    text += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return text;
}

std::shared_ptr<nn::Module> make_model(const std::string& name, int64_t num_classes, int64_t in_channels,
                                       nn::ResNetStem stem) {
  if (name == "convnet") return std::make_shared<nn::ConvNet>(num_classes);  // train_mnist's 1x28x28 only
  if (nn::is_resnet_name(name))
    return nn::make_resnet(name, nn::ResNetOptions().num_classes(num_classes).in_channels(in_channels).stem(stem));
  LOOM_CHECK(std::find(model_names().begin(), model_names().end(), name) != model_names().end(), "--model: '", name,
             "' is not one of ", join_names(model_names()));
  LOOM_CHECK(stem == nn::ResNetStem::imagenet, "--stem cifar applies to the ResNets only; --model ", name,
             " keeps torchvision's first layers");
  if (name == "vgg11_bn") return for_channels(name, nn::vgg11_bn(nn::VGGOptions().num_classes(num_classes)), in_channels);
  if (name == "vgg16_bn") return for_channels(name, nn::vgg16_bn(nn::VGGOptions().num_classes(num_classes)), in_channels);
  if (name == "mobilenet_v2")
    return for_channels(name, nn::mobilenet_v2(nn::MobileNetV2Options().num_classes(num_classes)), in_channels);
  if (name == "mobilenet_v3_small")
    return for_channels(name, nn::mobilenet_v3_small(nn::MobileNetV3Options().num_classes(num_classes)), in_channels);
  if (name == "mobilenet_v3_large")
    return for_channels(name, nn::mobilenet_v3_large(nn::MobileNetV3Options().num_classes(num_classes)), in_channels);
  if (name == "efficientnet_b0")
    return for_channels(name, nn::efficientnet_b0(nn::EfficientNetOptions().num_classes(num_classes)), in_channels);
  if (name == "regnet_y_400mf")
    return for_channels(name, nn::regnet_y_400mf(nn::RegNetOptions().num_classes(num_classes)), in_channels);
  return for_channels(name, nn::convnext_tiny(nn::ConvNeXtOptions().num_classes(num_classes)), in_channels);
}

data::RandomCrop model_input_crop(const std::string& model, const data::SampleShape& shape, int64_t padding) {
  if (model == "convnet" || nn::is_resnet_name(model)) return data::RandomCrop(shape.height, shape.width, padding);
  const int64_t height = std::max<int64_t>(32, shape.height), width = std::max<int64_t>(32, shape.width);
  const int64_t needed = (std::max(height - shape.height, width - shape.width) + 1) / 2;
  return data::RandomCrop(height, width, std::max(padding, needed));
}

data::Compose with_model_crop(const std::string& model, const data::SampleShape& shape,
                              std::vector<data::Transform> transforms) {
  const data::RandomCrop crop = model_input_crop(model, shape, 0);
  if (crop.height != shape.height || crop.width != shape.width) transforms.insert(transforms.begin(), crop);
  return data::Compose(std::move(transforms));
}

void add_common_flags(CLI::App& app, CommonFlags& flags) {
  app.add_option("--device", flags.device, "cpu, cuda, cuda:N or auto")->capture_default_str();
  add_choice(app, "--backend", flags.backend,
             "nccl, gloo, shm or auto (nccl for CUDA devices; for the CPU shm when every rank is on this host, "
             "else gloo)",
             {"auto", "nccl", "gloo", "shm"});
  add_choice(app, "--amp", flags.amp,
             "mixed precision, apex's opt levels: O0 (f32), O1 (f16 convolutions, f32 weights), O2 (f16 weights "
             "but batch norm, f32 masters, loss scaling), O3 (pure f16), bf16 (bf16 weights, f32 masters)",
             {"O0", "O1", "O2", "O3", "bf16"});
  app.add_flag("--sync-bn", flags.sync_bn, "batch-norm statistics over all ranks (SyncBatchNorm)");
  add_count(app, "--workers", flags.workers, "data loader threads (0 = load in the training thread)", 0);
  add_count(app, "--threads", flags.threads,
            "CPU threads per process (0 = all cores, or 1 when several processes run)", 0);
  app.add_option("--seed", flags.seed, "initialisation, shuffling and augmentation seed")->capture_default_str();
  add_count(app, "--log-interval", flags.log_interval, "steps between loss lines", 1);
  add_number(app, "--timeout", flags.timeout_s,
             "seconds a collective may wait for the other processes before the run fails (0 = "
             "LOOM_COLLECTIVE_TIMEOUT, else 1800); starting up, they wait at least 300",
             0);
  add_choice(app, "--progress", flags.progress,
             "rank 0's progress on stderr: bar (step, images/s, loss, data wait, ETA; redrawn in place), lines "
             "(one per --log-interval steps), none, or auto: bar when stderr is a terminal, else lines",
             {"auto", "bar", "lines", "none"});
  app.add_option("--metrics", flags.metrics,
                 "rank 0 appends JSON Lines to FILE: a header, a record every --log-interval steps and one per epoch "
                 "with the test accuracy (schema: docs/metrics.md)");
  app.add_option("--tensorboard", flags.tensorboard,
                 "rank 0 writes the --metrics numbers as TensorBoard scalars into an event file in DIR "
                 "(tensorboard --logdir DIR)");
  add_trace_flag(app, flags.trace);
  add_number(app, "--clip-grad-norm", flags.clip_grad_norm,
             "clip the gradients' total 2-norm to this before each step (after the all-reduce and, with --amp, the "
             "unscale; 0 = off)",
             0);
  add_count(app, "--accumulate-steps", flags.accumulate_steps,
            "batches per optimizer step (gradient accumulation: the all-reduce on the last, each loss divided by "
            "their number; an epoch's leftover batches make one step)",
            1);
  app.add_flag("--zero", flags.zero,
               "shard the optimizer state (momentum, Adam moments) over the processes, ZeRO stage 1 as PyTorch's "
               "ZeroRedundancyOptimizer: each keeps about 1/world of it; the same updates, and checkpoints as "
               "without it (they resume with or without --zero); needs several processes");
  app.add_flag("--no-pad-last", flags.no_pad_last,
               "train on each sample once per epoch: no DistributedSampler padding (which repeats up to N-1 samples "
               "for N processes), so ranks may run one batch fewer, and the uneven end of each epoch runs inside "
               "Join (PyTorch's torch.distributed.algorithms.Join; gradients divided by the world size). No effect "
               "with one process; not with --sync-bn");
  app.add_flag("--channels-last", flags.channels_last,
               "channels-last (NHWC) memory format: the model's convolution weights and the loaders' batches, as "
               "PyTorch's model.to(memory_format=torch.channels_last); for f16 / bf16 on a GPU (tensor cores)");
  app.add_flag("--cuda-graph", flags.cuda_graph,
               "on a GPU, each training step the replay of one CUDA graph captured at the second step (one launch "
               "from the host; the epoch's smaller last batch runs eagerly); one process, without "
               "--accumulate-steps and --clip-grad-norm, else the steps run eagerly and rank 0 says why. Not yet "
               "run on a GPU");
  // Flags that exclude each other: a usage error, before -g spawns any rank.
  app.parse_complete_callback([&flags] {
    if (flags.no_pad_last && flags.sync_bn)
      throw CLI::ValidationError("--no-pad-last", "the uneven end of each epoch runs inside Join, where "
                                                  "SyncBatchNorm's all-reduces in forward cannot run: drop --sync-bn or --no-pad-last");
  });
}

RankContext start_rank(const CommonFlags& flags, const CheckpointFlags& checkpoints) {
  train::StopSignals::install(train::parse_signal_name(checkpoints.signal));
  RankContext context;
  // srun's SLURM_*, torchrun's / loomrun's RANK and WORLD_SIZE, mpirun's OMPI_*, or one process.
  context.launch = dist::resolve_launch_environment();
  context.rank = context.launch.rank;
  context.world = context.launch.world_size;
  context.leader = context.rank == 0;
  LOOM_CHECK(!flags.zero || context.world > 1,
             "--zero shards the optimizer state over several processes, but this run has one; start several "
             "(loomrun --nproc_per_node=2, srun -n 2, train_mnist -g 2) or leave --zero out");
  set_threads(flags, context.world);
  context.device = resolve_training_device(flags.device, context.launch.local_rank);
  LOOM_CHECK(!flags.cuda_graph || context.device.is_cuda(), "--cuda-graph captures each training step as a CUDA "
             "graph, which needs a GPU (--device cuda), not --device ", context.device.str());
  context.backend = choose_backend(flags.backend, context.device);
  return context;
}

Loaders make_loaders(const data::LoadedData& loaded, const data::Compose& train_transforms,
                     const data::Compose& test_transforms, const CommonFlags& flags, const RankContext& rank,
                     int64_t train_batch, int64_t test_batch) {
  return {loaded.loader(true, train_transforms, loader_options(flags, train_batch, rank.device),
                        std::make_shared<data::DistributedSampler>(
                            loaded.train_size(), rank.world, rank.rank, /*shuffle=*/true, flags.seed,
                            flags.no_pad_last ? data::Remainder::uneven : data::Remainder::pad)),
          loaded.loader(false, test_transforms, loader_options(flags, test_batch, rank.device),
                        std::make_shared<data::ShardSampler>(loaded.test_size(), rank.world, rank.rank))};
}

int spawn_local_ranks(const char* program, int nodes, int gpus, int node_rank, int argc, char** argv) {
  LOOM_CHECK(node_rank < nodes, "-nr ", node_rank, " must be smaller than -n ", nodes,
             " (node ranks are 0 to nodes - 1)");
  dist::WorkerGroupSpec spec;
  spec.name = program;
  spec.command.push_back("/proc/self/exe");
  for (int i = 1; i < argc; ++i) spec.command.push_back(argv[i]);
  spec.nproc_per_node = gpus;
  spec.nnodes = nodes;
  spec.node_rank = node_rank;
  // MASTER_ADDR / MASTER_PORT from the environment (the tutorial sets them), else 127.0.0.1:29500.
  LOOM_CHECK(nodes == 1 || std::getenv("MASTER_ADDR") != nullptr, "-n ", nodes,
             ": set MASTER_ADDR (and MASTER_PORT, default ", dist::kDefaultMasterPort,
             ") to the address of node 0, the same on every node");
  const dist::LaunchEnvironment environment = dist::resolve_launch_environment();
  spec.master_addr = environment.master_addr;
  spec.master_port = environment.master_port;
  spec.environment["LOOM_SPAWNED_BY"] = program;  // the ranks ignore -n / -g / -nr silently
  const dist::WorkerGroupResult result = dist::run_worker_group(spec);
  if (!result.succeeded && result.first_failure && result.received_signal == 0)
    std::fprintf(stderr, "%s: failed: %s\n", program, result.first_failure->describe().c_str());
  return result.exit_code();
}

void print_training_complete(const char* prefix, const train::FitResult& result,
                             const amp::MixedPrecisionOptimizer& optimizer, const std::string& amp) {
  std::printf("%sTraining complete in: %s\n", prefix, train::format_duration(result.elapsed).c_str());
  print_loss_scaling(optimizer, amp);
}

std::shared_ptr<optim::LRScheduler> make_epoch_schedule(const std::string& name, optim::Optimizer& optimizer,
                                                        int64_t epochs) {
  if (name == "cosine") return std::make_shared<optim::CosineAnnealingLR>(optimizer, std::max<int64_t>(1, epochs));
  if (name == "step") return std::make_shared<optim::StepLR>(optimizer, std::max<int64_t>(1, epochs / 3), 0.1);
  LOOM_CHECK(name == "none", "--schedule: '", name, "' is not none, step or cosine");
  return nullptr;
}

void print_launch_banner(const RankContext& rank) {
  if (rank.leader) {
    char host[256] = "localhost";
    if (rank.launch.launcher == dist::Launcher::none) ::gethostname(host, sizeof(host) - 1);
    std::printf(">>> Training on %d %s, master node is %s\n", rank.world, rank.device.is_cpu() ? "CPU processes" : "GPUs",
                rank.launch.launcher == dist::Launcher::none ? host : rank.launch.master_addr.c_str());
  }
  std::printf("- Process %d is local rank %d on node %d (%s)\n", rank.rank, rank.launch.local_rank,
              rank.launch.node_rank, rank.device.str().c_str());
}

void set_threads(const CommonFlags& flags, int world) {
  if (flags.threads > 0) {
    set_num_threads(flags.threads);
  } else if (world > 1) {
    set_num_threads(1);  // several ranks share this machine's cores
  }
}

std::string choose_backend(const std::string& flag, Device device) {
  const std::string backend = flag != "auto" ? flag : device.is_cuda() ? "nccl" : "auto";
  if (backend == "nccl") {
    dist::require_nccl();
    LOOM_CHECK(device.is_cuda(), "--backend nccl all-reduces CUDA tensors, but this run trains on ", device.str(),
               "; use --backend gloo (or auto) for CPU training, or --device cuda on a machine with a GPU");
  }
  return backend;
}

std::shared_ptr<dist::ProcessGroup> make_process_group(const CommonFlags& flags, const std::string& backend,
                                                       Device device, int world) {
  if (world <= 1) return nullptr;
  const dist::Milliseconds timeout =
      flags.timeout_s > 0 ? dist::Milliseconds(static_cast<int64_t>(flags.timeout_s * 1000))
                          : dist::collective_timeout_from_environment(dist::kDefaultCollectiveTimeout);
  std::shared_ptr<dist::ProcessGroup> group =
      dist::init_process_group(dist::InitOptions()
                                   .backend(dist::parse_backend(backend))
                                   .init_method("env://")
                                   .timeout(std::max<dist::Milliseconds>(timeout, std::chrono::minutes(5)))
                                   .device_index(device.is_cuda() ? device.index : -1));
  group->set_timeout(timeout);
  // --device cuda --backend gloo|shm: CUDA tensors staged through host memory.
  return dist::stage_through_host(group, device);
}

std::shared_ptr<amp::MixedPrecisionOptimizer> initialize_optimizer(nn::Module& model, const CommonFlags& flags,
                                                                   const std::shared_ptr<dist::ProcessGroup>& group,
                                                                   const amp::OptimizerFactory& make_optimizer) {
  const amp::OptLevel level = amp::parse_opt_level(flags.amp);
  if (!flags.zero) return amp::initialize(model, make_optimizer, level);
  LOOM_CHECK(group != nullptr, "--zero needs a process group (several processes)");
  const dist::ZeroRedundancyOptimizer* sharded = nullptr;
  std::shared_ptr<amp::MixedPrecisionOptimizer> optimizer = amp::initialize(
      model,
      [&](std::vector<Tensor> parameters) -> std::unique_ptr<optim::Optimizer> {
        auto zero = std::make_unique<dist::ZeroRedundancyOptimizer>(std::move(parameters), group, make_optimizer);
        sharded = zero.get();
        return zero;
      },
      level);
  if (group->rank() == 0) {
    const std::vector<Tensor>& all = sharded->group_params(0);
    int64_t total = 0, mine = 0;
    for (const Tensor& p : all) total += p.numel();
    for (size_t index : sharded->shard(0)) mine += all[index].numel();
    std::printf("--zero: the optimizer state is sharded over %d processes; rank 0 steps %zu of the %zu parameter "
                "tensors (%lld of %lld values)\n",
                group->size(), sharded->shard(0).size(), all.size(), static_cast<long long>(mine),
                static_cast<long long>(total));
  }
  return optimizer;
}

void place_model(nn::Module& model, const CommonFlags& flags, Device device) {
  model.to(device);
  if (flags.channels_last) model.to(MemoryFormat::nhwc);
}

data::DataLoaderOptions loader_options(const CommonFlags& flags, int64_t batch_size, Device device) {
  return data::DataLoaderOptions()
      .batch_size(batch_size)
      .num_workers(flags.workers)
      .seed(flags.seed)
      .dtype(amp::input_dtype(amp::parse_opt_level(flags.amp)))
      .memory_format(flags.memory_format())
      .pin_memory(device.is_cuda())
      .device(device);
}

train::TrainerOptions trainer_options(const char* program, int argc, char** argv, const CommonFlags& flags,
                                      const CheckpointFlags& checkpoints, std::shared_ptr<dist::ProcessGroup> group) {
  return train::TrainerOptions()
      .program(program)
      .command_line({argv, argv + argc})
      .log_interval(flags.log_interval)
      .progress(flags.progress)
      .metrics_path(flags.metrics)
      .tensorboard_dir(flags.tensorboard)
      .trace_path(flags.trace)
      .clip_grad_norm(flags.clip_grad_norm)
      .accumulate_steps(flags.accumulate_steps)
      .cuda_graph(flags.cuda_graph)
      .join(flags.no_pad_last ? std::optional(dist::JoinOptions()) : std::nullopt)
      .checkpoints(checkpoint_options(checkpoints))
      .stop_signal(train::parse_signal_name(checkpoints.signal))
      .process_group(std::move(group));
}

void print_loss_scaling(const amp::MixedPrecisionOptimizer& optimizer, const std::string& amp) {
  if (!optimizer.scaler().enabled()) return;
  std::printf("Mixed precision --amp %s: loss scale %g, %lld steps skipped for inf / NaN gradients\n", amp.c_str(),
              optimizer.scaler().get_scale(), static_cast<long long>(optimizer.scaler().skipped_steps()));
}

int run_app(CLI::App& app, const char* program, std::vector<std::string> arguments, const std::function<int()>& run) {
  try {
    std::vector<char*> pointers;
    for (auto& argument : arguments) pointers.push_back(argument.data());
    app.parse(static_cast<int>(pointers.size()), pointers.data());
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return report_usage_error(program, e);
  }
  try {
    log_level();  // a bad LOOM_LOG_LEVEL fails before any work, in one process as in many
    ops::cpu::gemm_kernel();  // and so does a bad LOOM_CPU_GEMM
    return run();
  } catch (const std::exception& e) {
    return report_fatal_error(program, e);  // names the rank when several run
  }
}

}  // namespace loom::apps
