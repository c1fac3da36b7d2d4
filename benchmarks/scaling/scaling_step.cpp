// One rank of the scaling benchmark: DistributedDataParallel training steps of
// a ConvNet or ResNet with every phase and every gradient bucket timestamped,
// written as one JSON document per rank for benchmarks/scaling/scaling.py.
// Started once per rank by a launcher (scaling.py, loomrun, torchrun, srun);
// alone it is world 1. Validates the run (finite, falling loss; identical
// parameters on every rank) before it writes anything.
//   scaling_step --model convnet --batch-size 100 --steps 40 --output 'out/rank{rank}.json'
//   scaling_step --model resnet18 --batch-size 32 --compare-bare   # world 1: DDP against the bare model
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <loom/core/autograd.h>
#include <loom/core/generator.h>
#include <loom/core/parallel.h>
#include <loom/data/idx.h>
#include <loom/data/loader.h>
#include <loom/data/sampler.h>
#include <loom/data/transforms.h>
#include <loom/dist/ddp.h>
#include <loom/dist/environment.h>
#include <loom/dist/process_group.h>
#include <loom/nn/convnet.h>
#include <loom/nn/resnet.h>
#include <loom/ops/loss.h>
#include <loom/optim/optimizer.h>
#include "benchmarks/scaling/rank_result.h"

using namespace loom;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

namespace {

struct Flags {
  std::string model = "convnet";
  int64_t batch_size = 100;  // per rank
  int64_t steps = 40;
  int64_t warmup = 5;
  int threads = 1;
  std::string data = "/usr/share/datasets/fashion-mnist";  // or "synthetic"
  int64_t image_size = 32;                                  // ResNets (synthetic)
  int64_t classes = 10;
  double first_bucket_mb = 1;
  double bucket_mb = 25;
  bool compare_bare = false;
  int64_t block = 5;  // steps per interleaved block with --compare-bare
  std::string device = "cpu";
  std::string backend = "auto";
  std::string output;  // "{rank}" is replaced by the rank; empty: rank 0 prints to stdout
  double timeout_s = 300;  // per collective and for the rendezvous
};

double ms_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

// Milliseconds from `origin`, or null for a time point that never happened.
json ms_or_null(Clock::time_point origin, Clock::time_point t) {
  if (t == Clock::time_point{}) return nullptr;
  return ms_between(origin, t);
}

std::shared_ptr<nn::Module> make_model(const Flags& flags) {
  manual_seed(0);  // the same initial parameters in every process (DDP would copy rank 0's anyway)
  if (flags.model == "convnet") return std::make_shared<nn::ConvNet>(flags.classes);
  return nn::make_resnet(flags.model, nn::ResNetOptions().num_classes(flags.classes));
}

// This rank's batches: Fashion-MNIST through a DistributedSampler for the
// ConvNet, a fixed random batch per rank for the ResNets (or --data synthetic).
// Built up front and cycled, so that the loader takes no time from the step.
std::vector<data::Batch> make_batches(const Flags& flags, int world, int rank, Device device) {
  std::vector<data::Batch> batches;
  if (flags.model == "convnet" && flags.data != "synthetic") {
    data::TrainTestSplit split = data::load_mnist(flags.data);
    data::DistributedSampler sampler(split.train.size(), world, rank, /*shuffle=*/true, /*seed=*/0);
    sampler.set_epoch(0);
    const std::vector<int64_t> order = sampler.indices();
    const int64_t available = static_cast<int64_t>(order.size()) / flags.batch_size;
    LOOM_CHECK(available > 0, "scaling_step: --batch-size ", flags.batch_size, " exceeds the ", order.size(),
               " images of this rank's shard");
    const int64_t count = std::min<int64_t>(available, std::min<int64_t>(flags.warmup + flags.steps, 64));
    data::Compose transforms({data::ToTensor{}});
    data::FusedTransform fused(transforms, split.train.channels(), split.train.height(), split.train.width());
    auto options = data::DataLoaderOptions().batch_size(flags.batch_size);
    for (int64_t b = 0; b < count; ++b) {
      batches.push_back(data::build_batch(split.train, fused, options, 0, order.data() + b * flags.batch_size,
                                          flags.batch_size, b));
    }
  } else {
    const int64_t channels = flags.model == "convnet" ? 1 : 3;
    const int64_t size = flags.model == "convnet" ? 28 : flags.image_size;
    Generator generator(Generator::mix(1, static_cast<uint64_t>(rank)));
    data::Batch batch;
    batch.images = Tensor::empty({flags.batch_size, channels, size, size});  // (B, C, H, W)
    generator.normal_(batch.images, 0.0, 1.0);
    std::vector<int64_t> labels(flags.batch_size);
    for (auto& label : labels) label = static_cast<int64_t>(generator.below(flags.classes));
    batch.labels = Tensor::from_vector(labels, {flags.batch_size});
    batches.push_back(std::move(batch));
  }
  if (device.is_cuda()) {
    for (auto& batch : batches) {
      batch.images = batch.images.to(device);
      batch.labels = batch.labels.to(device);
    }
  }
  return batches;
}

// Waits for the device: reading one value back orders the host after every
// kernel queued on the compute stream. A no-op on the CPU.
void synchronize(const std::vector<Tensor>& parameters, Device device) {
  if (device.is_cuda()) static_cast<void>(parameters.back().flatten().slice(0, 0, 1).to(Device::cpu()));
}

// When a step's phases began and ended.
struct StepTimes {
  Clock::time_point start, backward_start, backward_end, reduced, optimizer_start, end;
};

// A step's phases in milliseconds, from its start (the optimizer's from its own).
json phase_times(const StepTimes& t) {
  return {{"step_ms", ms_between(t.start, t.end)},
          {"forward_ms", ms_between(t.start, t.backward_start)},
          {"backward_start_ms", ms_between(t.start, t.backward_start)},
          {"backward_end_ms", ms_between(t.start, t.backward_end)},
          {"reduced_ms", ms_between(t.start, t.reduced)},
          {"optimizer_ms", ms_between(t.optimizer_start, t.end)}};
}

// One timed training step of a DDP-wrapped model.
json ddp_step(dist::DistributedDataParallel& ddp, optim::Optimizer& optimizer, const data::Batch& batch,
              const std::vector<Tensor>& parameters, Device device, double& loss_value) {
  const Clock::time_point start = Clock::now();
  optimizer.zero_grad();
  Tensor loss = cross_entropy(ddp(batch.images), batch.labels);
  const Clock::time_point backward_start = Clock::now();
  loss.backward();  // returns with the gradients averaged (DDP's end-of-backward callback)
  const Clock::time_point optimizer_start = Clock::now();
  optimizer.step();
  synchronize(parameters, device);
  const Clock::time_point end = Clock::now();
  loss_value = loss.item();

  const dist::IterationTiming timing = ddp.last_iteration_timing();
  json buckets = json::array();
  for (const auto& b : timing.buckets) {
    buckets.push_back({{"bytes", b.bytes},
                       {"wire_bytes", b.wire_bytes},
                       {"ready_ms", ms_or_null(start, b.ready)},
                       {"launched_ms", ms_or_null(start, b.launched)},
                       {"started_ms", ms_or_null(start, b.started)},
                       {"done_ms", ms_or_null(start, b.done)}});
  }
  // Without a backward_end stamp (no end-of-backward callback ran) backward
  // is taken to end when the last bucket became ready.
  Clock::time_point backward_end = timing.backward_end;
  if (backward_end == Clock::time_point{}) {
    for (const auto& b : timing.buckets) backward_end = std::max(backward_end, b.ready);
  }
  const Clock::time_point reduced = timing.reduced != Clock::time_point{} ? timing.reduced : optimizer_start;
  json record = phase_times({start, backward_start, backward_end, reduced, optimizer_start, end});
  record["loss"] = loss_value;
  record["buckets"] = std::move(buckets);
  return record;
}

// The bare model's step, the same work without the reducer. Each
// parameter's gradient-ready time (after backward start) goes to `ready_ms`.
json bare_step(nn::Module& model, optim::Optimizer& optimizer, const data::Batch& batch,
               const std::vector<Tensor>& parameters, Device device, std::vector<Clock::time_point>& ready,
               std::vector<double>& ready_ms) {
  const Clock::time_point start = Clock::now();
  optimizer.zero_grad();
  Tensor loss = cross_entropy(model(batch.images), batch.labels);
  const Clock::time_point backward_start = Clock::now();
  loss.backward();
  const Clock::time_point optimizer_start = Clock::now();
  optimizer.step();
  synchronize(parameters, device);
  const Clock::time_point end = Clock::now();
  ready_ms.resize(ready.size());
  for (size_t i = 0; i < ready.size(); ++i) ready_ms[i] = ms_between(backward_start, ready[i]);
  // Without a reducer, backward ends with the gradients final.
  json record = phase_times({start, backward_start, optimizer_start, optimizer_start, optimizer_start, end});
  record["loss"] = loss.item();
  return record;
}

// Sum and sum of squares of every parameter, in f64.
std::vector<double> fingerprint(const std::vector<Tensor>& parameters) {
  double sum = 0, squares = 0;
  for (const Tensor& p : parameters) {
    for (double v : p.to_vector<double>()) {
      sum += v;
      squares += v * v;
    }
  }
  return {sum, squares};
}

// Throws unless the losses are finite and, over enough steps, falling; and
// unless every rank holds the same parameters (DDP kept them in step). The
// fingerprints are all-reduced on `device`, the group's (nccl: the rank's GPU).
json validate(const std::vector<double>& losses, const std::vector<Tensor>& parameters, dist::ProcessGroup& group,
              Device device) {
  for (double l : losses) LOOM_CHECK(std::isfinite(l), "scaling_step: a loss is not finite (", l, ")");
  json result;
  const size_t window = std::min<size_t>(5, losses.size() / 4);
  if (window > 0) {
    double first = 0, last = 0;
    for (size_t i = 0; i < window; ++i) {
      first += losses[i] / window;
      last += losses[losses.size() - 1 - i] / window;
    }
    LOOM_CHECK(last < first, "scaling_step: the loss did not fall (first ", window, " steps ", first, ", last ", last,
               ")");
    result["loss_first"] = first;
    result["loss_last"] = last;
  }
  const std::vector<double> mine = fingerprint(parameters);
  Tensor all = Tensor::zeros({group.size(), 2}, DType::f64, device);
  all.slice(0, group.rank(), group.rank() + 1).copy_(Tensor::from_vector(mine, {1, 2}));
  group.all_reduce(all, dist::ReduceOp::sum)->wait();
  const std::vector<double> every = all.to_vector<double>();
  for (int r = 0; r < group.size(); ++r) {
    for (int k = 0; k < 2; ++k) {
      const double a = every[2 * r + k], b = mine[k];
      LOOM_CHECK(std::abs(a - b) <= 1e-9 * std::max(1.0, std::abs(b)), "scaling_step: rank ", r,
                 " holds different parameters after training (fingerprint ", a, " against ", b,
                 " here): gradients were not averaged identically");
    }
  }
  result["parameters_equal_across_ranks"] = true;
  return result;
}

int run(const Flags& flags) {
  LOOM_CHECK(flags.model == "convnet" || nn::is_resnet_name(flags.model), "scaling_step: --model must be convnet, ",
             "resnet18, resnet34, resnet50, resnet101 or resnet152, got '", flags.model, "'");
  set_num_threads(flags.threads);
  const dist::LaunchEnvironment launch = dist::resolve_launch_environment();
  const Device device = flags.device == "cpu" ? Device::cpu()
                        : flags.device == "cuda" ? Device::cuda(launch.local_rank)
                                                 : parse_device(flags.device);
  // auto: nccl for CUDA devices; for the CPU, init_process_group picks shm when
  // every rank is on this host, gloo otherwise.
  const std::string backend = flags.backend != "auto" ? flags.backend : device.is_cuda() ? "nccl" : "auto";
  const auto timeout = std::chrono::duration_cast<dist::Milliseconds>(std::chrono::duration<double>(flags.timeout_s));
  auto group = dist::init_process_group(
      dist::InitOptions().backend(dist::parse_backend(backend)).init_method("env://").timeout(timeout));
  const int world = group->size(), rank = group->rank();
  LOOM_CHECK(!flags.compare_bare || world == 1, "scaling_step: --compare-bare measures the reducer alone; run it at ",
             "world 1, not ", world);

  std::vector<data::Batch> batches = make_batches(flags, world, rank, device);
  std::shared_ptr<nn::Module> model = make_model(flags);
  model->to(device);
  const auto options = dist::DistributedDataParallelOptions()
                           .first_bucket_bytes_cap(static_cast<size_t>(flags.first_bucket_mb * (1 << 20)))
                           .bucket_bytes_cap(static_cast<size_t>(flags.bucket_mb * (1 << 20)));
  dist::DistributedDataParallel ddp(model, group, options);
  const std::vector<Tensor> parameters = model->parameters();
  optim::SGD optimizer(parameters, optim::SGDOptions(0.01).momentum(0.9));

  // The bare model (same initial parameters) and the hooks that time its gradients.
  std::shared_ptr<nn::Module> bare;
  std::vector<Tensor> bare_parameters;
  std::optional<optim::SGD> bare_optimizer;
  std::vector<Clock::time_point> bare_ready;
  if (flags.compare_bare) {
    bare = make_model(flags);
    bare->to(device);
    bare_parameters = bare->parameters();
    bare_optimizer.emplace(bare_parameters, optim::SGDOptions(0.01).momentum(0.9));
    bare_ready.resize(bare_parameters.size());
    for (size_t i = 0; i < bare_parameters.size(); ++i) {
      bare_parameters[i].register_post_accumulate_grad_hook(
          [&bare_ready, i](Tensor&) { bare_ready[i] = Clock::now(); });
    }
  }

  json steps = json::array(), bare_steps = json::array(), ready_samples = json::array();
  std::vector<double> losses, bare_losses;
  std::vector<double> ready_ms;
  const int64_t total = flags.warmup + flags.steps;
  int64_t ddp_done = 0, bare_done = 0, block_index = 0;
  auto ddp_steps = [&](int64_t count) {
    for (; count > 0 && ddp_done < total; --count) {
      double loss = 0;
      json record = ddp_step(ddp, optimizer, batches[ddp_done % batches.size()], parameters, device, loss);
      losses.push_back(loss);
      if (ddp_done++ < flags.warmup) continue;
      record["block"] = block_index;
      steps.push_back(std::move(record));
    }
  };
  auto bare_steps_run = [&](int64_t count) {
    for (; count > 0 && bare_done < total; --count) {
      json record = bare_step(*bare, *bare_optimizer, batches[bare_done % batches.size()], bare_parameters, device,
                              bare_ready, ready_ms);
      bare_losses.push_back(record["loss"]);
      if (bare_done++ < flags.warmup) continue;
      record["block"] = block_index;
      bare_steps.push_back(std::move(record));
      ready_samples.push_back(ready_ms);
    }
  };
  if (!flags.compare_bare) {
    ddp_steps(total);
  } else {
    // Both models warm up first (allocator caches, page faults); then blocks
    // of measured DDP and bare steps alternate, the order flipping every
    // block, so that both see the same machine load.
    ddp_steps(flags.warmup);
    bare_steps_run(flags.warmup);
    while (ddp_done < total || bare_done < total) {  // the step functions count ddp_done and bare_done
      if (block_index % 2 == 0) {
        ddp_steps(flags.block);
        bare_steps_run(flags.block);
      } else {
        bare_steps_run(flags.block);
        ddp_steps(flags.block);
      }
      ++block_index;
    }
  }

  json validation = validate(losses, parameters, *group, device);
  json out = {{"program", "loom scaling_step"},
              {"model", flags.model},
              {"rank", rank},
              {"world", world},
              {"batch_per_rank", flags.batch_size},
              {"threads", flags.threads},
              {"device", device.str()},
              {"backend", group->backend_name()},
              {"data", flags.model == "convnet" && flags.data != "synthetic" ? "fashion-mnist" : "synthetic"},
              {"image_size", flags.model == "convnet" ? 28 : flags.image_size},
              {"first_bucket_bytes_cap", options.first_bucket_bytes_cap()},
              {"bucket_bytes_cap", options.bucket_bytes_cap()},
              {"warmup", flags.warmup},
              {"validation", validation}};
  json params = json::array();
  for (const auto& [name, tensor] : model->named_parameters()) {
    params.push_back({{"name", name}, {"bytes", tensor.nbytes()}});
  }
  out["parameters"] = std::move(params);
  size_t buffer_bytes = 0;
  for (const auto& [name, tensor] : model->named_buffers()) buffer_bytes += tensor.nbytes();
  out["buffer_bytes"] = buffer_bytes;
  out["buckets"] = ddp.bucket_parameter_names();
  out["steps"] = std::move(steps);
  if (flags.compare_bare) {
    for (double l : bare_losses) LOOM_CHECK(std::isfinite(l), "scaling_step: a bare-model loss is not finite");
    out["bare_steps"] = std::move(bare_steps);
    out["parameter_ready_ms"] = std::move(ready_samples);  // per measured bare step, in parameter order
  }

  benchmarks::write_result_and_finish(*group, out, flags.output, "scaling_step");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loom scaling benchmark: one rank's timed DDP training steps (JSON)"};
  Flags flags;
  app.add_option("--model", flags.model, "convnet, resnet18, resnet34, resnet50, ...")->capture_default_str();
  app.add_option("--batch-size", flags.batch_size, "images per rank and step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--steps", flags.steps, "measured steps")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--warmup", flags.warmup, "steps before measuring")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--threads", flags.threads, "CPU threads per rank")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--data", flags.data, "Fashion-MNIST directory for the ConvNet, or 'synthetic'")->capture_default_str();
  app.add_option("--image-size", flags.image_size, "ResNet input height and width (synthetic images)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--first-bucket-mb", flags.first_bucket_mb, "DDP first_bucket_bytes_cap in MiB")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--bucket-mb", flags.bucket_mb, "DDP bucket_bytes_cap in MiB")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag("--compare-bare", flags.compare_bare,
               "world 1: interleave steps of the bare model (same initial parameters) with the DDP steps");
  app.add_option("--block", flags.block, "steps per interleaved block with --compare-bare")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--device", flags.device, "cpu, cuda (the local rank's GPU) or cuda:N")->capture_default_str();
  app.add_option("--backend", flags.backend, "gloo, shm, nccl or auto (nccl for CUDA; shm for CPU ranks on one host, else gloo)")->capture_default_str();
  app.add_option("--output", flags.output, "JSON file per rank ('{rank}' is replaced); default: rank 0 to stdout");
  app.add_option("--timeout", flags.timeout_s, "seconds a collective may wait for the other ranks")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    return run(flags);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "scaling_step: %s\n", e.what());
    return 1;
  }
}
