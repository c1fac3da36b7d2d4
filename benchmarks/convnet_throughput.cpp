// ConvNet training throughput on the CPU or a GPU: batch 100 SGD steps on
// Fashion-MNIST, images/s after warm-up and peak memory (RSS; the CUDA
// allocator's peaks on a GPU), as one JSON line, with the ms per step of
// --repeats runs (median, min, max; CUDA events on a GPU) and launches and
// host waits per step (benchmarks/step_timing.h). Validates that the loss is
// finite and falling before it reports. On a GPU the batches are copied from
// the loader to the device every step and losses are read after the timed
// steps, so the host never waits for the device inside the timing.
//   convnet_throughput --steps 200 --threads 2
//   convnet_throughput --device cuda --steps 500 [--repeats 3] [--channels-last] [--autocast f16] [--tf32]
// f32 on a GPU computes without TF32 unless --tf32 is given.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "apps/app_common.h"
#include <loom/train/monitor.h>
#include <loom/core/cuda/runtime.h>
#include <loom/core/generator.h>
#include <loom/core/parallel.h>
#include "benchmarks/gemm_peak.h"
#include "benchmarks/step_timing.h"
#include <loom/core/profiler.h>
#include <loom/data/idx.h>
#include <loom/data/loader.h>
#include <loom/nn/convnet.h>
#include <loom/ops/autocast.h>
#include <loom/ops/loss.h>
#include <loom/optim/optimizer.h>

using namespace loom;

int main(int argc, char** argv) {
  CLI::App app{"loom ConvNet training throughput"};
  int64_t steps = 200, warmup = 10, batch_size = 100, repeats = 1;
  bool profile_one_step = false;
  int threads = 1;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  bool profile = false;
  std::string device_name = "cpu";
  bool channels_last = false;
  bool tf32 = false;
  std::string autocast;
  app.add_option("--steps", steps, "measured steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "steps before timing")->check(CLI::NonNegativeNumber);
  app.add_option("--repeats", repeats, "timed runs of --steps steps each (median, min and max reported)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--cuda-profile-step", profile_one_step,
               "on a GPU, after the timed runs, one more step between cudaProfilerStart and cudaProfilerStop "
               "(for ncu --profile-from-start off)");
  app.add_option("--batch-size", batch_size)->check(CLI::PositiveNumber);
  app.add_option("--threads", threads)->check(CLI::PositiveNumber);
  app.add_option("--data", data_dir);
  app.add_option("--device", device_name, "cpu, cuda or cuda:N");
  app.add_flag("--channels-last", channels_last, "on a GPU, the model's weights and the images NHWC (channels-last)");
  app.add_flag("--tf32", tf32, "on a GPU, let f32 convolutions and matrix products use TF32 tensor cores");
  app.add_option("--autocast", autocast, "run the forward under autocast in f16 or bf16 (as torch.autocast)")
      ->check(CLI::IsMember({"f16", "bf16"}));
  app.add_flag("--profile", profile, "after the timed steps, profile 20 more per op and layer (stderr)");
  CLI11_PARSE(app, argc, argv);
  try {
    set_num_threads(threads);
    data::TrainTestSplit split = data::load_mnist(data_dir);
    manual_seed(0);
    const Device device = parse_device(device_name);
    if (device.is_cuda()) cuda::require_device(device.index);
    cuda::set_allow_tf32(tf32);
    // The batch as the model takes it: on the device, NHWC with --channels-last.
    const MemoryFormat format = channels_last && device.is_cuda() ? MemoryFormat::nhwc : MemoryFormat::nchw;
    auto to_device = [&](const Tensor& images) {
      if (!device.is_cuda()) return images;
      return in_memory_format(images.to(device), format);
    };
    nn::ConvNet model;
    model.to(device);
    model.to(format);  // before the optimizer takes the parameters
    optim::SGD optimizer(model.parameters(), optim::SGDOptions(0.01).momentum(0.9));
    data::DataLoader loader(split.train, data::Compose({data::ToTensor{}}),
                            data::DataLoaderOptions().batch_size(batch_size).num_workers(1),
                            std::make_shared<data::RandomSampler>(split.train.size(), 0));
    int64_t epoch = 0;
    loader.start_epoch(epoch);
    const auto next_batch = [&] {
      for (auto batch = loader.next();; batch = loader.next()) {
        if (batch) return std::move(*batch);
        loader.start_epoch(++epoch);
      }
    };
    const auto train_step = [&] {
      auto batch = next_batch();
      Tensor loss;
      {
        ops::AutocastGuard autocast_guard(!autocast.empty(), autocast.empty() ? DType::f16 : parse_dtype(autocast));
        loss = cross_entropy(model(to_device(batch.images)), batch.labels.to(device));
      }
      optimizer.zero_grad();
      loss.backward();
      optimizer.step();
      return loss.detach();
    };
    const auto [timing, losses] = bench::time_training(device, warmup, repeats, steps, profile_one_step, train_step);
    const double seconds = timing.total_ms / 1000;
    // Validate before reporting (time_training checked them finite): the last tenth lower than the first.
    const size_t tenth = std::max<size_t>(1, losses.size() / 10);
    double first = 0, last = 0;
    for (size_t i = 0; i < tenth; ++i) {
      first += losses[i];
      last += losses[losses.size() - 1 - i];
    }
    if (!(last < first)) throw Error(str("loss did not fall: first ", first / tenth, ", last ", last / tenth));
    if (profile) {
      profiler::set_enabled(true);
      for (int i = 0; i < 20; ++i) {
        auto batch = next_batch();
        profiler::Scope step_scope("training step (all)");
        Tensor loss;
        {
          profiler::Scope forward_scope("forward + loss (all)");
          loss = cross_entropy(model(to_device(batch.images)), batch.labels.to(device));
        }
        optimizer.zero_grad();
        {
          profiler::Scope backward_scope("backward (all)");
          loss.backward();
        }
        profiler::Scope optimizer_scope("optimizer step");
        optimizer.step();
      }
      profiler::set_enabled(false);
      std::fprintf(stderr, "profile of 20 steps (threads %d):\n%s", threads, profiler::report().c_str());
      std::fprintf(stderr, "machine f32 GEMM peak at %d threads: %s\n", threads,
                   bench::to_json(bench::measure_gemm_peak(threads)).c_str());
    }
    std::string gpu_memory;
    if (device.is_cuda()) {
      const cuda::MemoryStats m = bench::memory_since_start(timing, device.index);
      gpu_memory = str(", \"device\": \"", cuda::device_name(device.index), "\", \"channels_last\": ",
                       channels_last ? "true" : "false", ", \"tf32\": ", tf32 ? "true" : "false", ", \"autocast\": \"", autocast.empty() ? "none" : autocast,
                       "\", \"peak_allocated_mb\": ",
                       static_cast<double>(m.peak_allocated_bytes) / (1 << 20), ", \"peak_reserved_mb\": ",
                       static_cast<double>(m.peak_reserved_bytes) / (1 << 20));
    }
    gpu_memory += bench::step_timing_json(timing, device);
    std::printf(
        "{\"bench\": \"loom convnet train\", \"on\": \"%s\", \"threads\": %d, \"batch\": %lld, \"steps\": %lld, "
        "\"train_s\": %.3f, \"images_per_s\": %.1f, \"step_ms\": %.3f, \"loss_first\": %.4f, \"loss_last\": %.4f, "
        "\"peak_rss_mb\": %.1f%s}\n",
        device.str().c_str(), threads, static_cast<long long>(batch_size), static_cast<long long>(steps), seconds,
        static_cast<double>(batch_size) * 1000.0 / timing.median_ms(), timing.median_ms(),
        first / tenth, last / tenth, static_cast<double>(train::peak_rss_bytes()) / (1 << 20), gpu_memory.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "convnet_throughput: %s\n", e.what());
    return 1;
  }
}
