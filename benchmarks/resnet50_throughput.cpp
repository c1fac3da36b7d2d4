// ResNet-50 training throughput on the CPU or a GPU, the shape of
// benchmarks/peers/torch_resnet50_cifar.py (and, on a GPU, of
// ../shared/peers/torch_resnet_gpu.py): torchvision's ResNet-50 (ImageNet stem, or the CIFAR stem with --stem
// cifar; 10 classes), or with --arch another of the apps' --model names (VGG, MobileNet, EfficientNet, RegNet,
// ConvNeXt; benchmarks/run_models.sh), on one fixed batch of random images (--size, 32 by default), SGD with
// momentum, in f32 or one of apex's opt levels (--amp, as the apps). Validates that every loss is finite and that
// the loss on the repeated batch fell (the mean of the last half of the steps below the first half's), then prints
// one JSON line: images/s, ms per step over --repeats runs of --steps (median, min, max;
// benchmarks/step_timing.h: CUDA events on a GPU), launches and host waits per step, peak RSS and GPU memory. The
// losses are read after the timed steps.
// With --cuda-graph (a GPU) the timed steps are replays of one captured step (core/cuda/graph.h).
//   resnet50_throughput --batch 32 --steps 10 --threads 2 [--stem cifar] [--device cuda --amp O2 --repeats 3]
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <optional>

#include "apps/app_common.h"
#include "apps/training.h"
#include <loom/train/monitor.h>
#include <loom/core/generator.h>
#include "benchmarks/gemm_peak.h"
#include "benchmarks/step_timing.h"
#include <loom/core/cuda/graph.h>
#include <loom/core/cuda/runtime.h>
#include <loom/core/profiler.h>
#include <loom/core/parallel.h>
#include <loom/nn/resnet.h>
#include <loom/ops/loss.h>
#include <loom/optim/amp.h>
#include <loom/optim/optimizer.h>

using namespace loom;

int main(int argc, char** argv) {
  CLI::App app{"loom ResNet-50 training throughput (CIFAR-shaped input)"};
  int64_t steps = 10, warmup = 2, batch = 32, size = 32, repeats = 1;
  bool profile_one_step = false;
  int threads = 2;
  std::string arch = "resnet50", stem = "imagenet", device_name = "cpu", amp_name = "O0";
  int64_t profile_steps = 0;
  double lr = 0;  // 0: the stem's default
  app.add_option("--lr", lr, "SGD learning rate (default 0.01 with the imagenet stem, 0.001 with the cifar stem)")
      ->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "measured steps")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "steps before timing")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--batch", batch, "images per step")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--size", size, "image height and width (224: ImageNet's)")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--repeats", repeats, "timed runs of --steps steps each (median, min and max reported)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_flag("--cuda-profile-step", profile_one_step,
               "on a GPU, after the timed runs, one more step between cudaProfilerStart and cudaProfilerStop "
               "(for ncu --profile-from-start off)");
  app.add_option("--threads", threads, "CPU threads")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--arch", arch, "resnet18 .. resnet152, or another of the apps' --model names (vgg16_bn, ...)")
      ->capture_default_str();
  app.add_option("--stem", stem, "imagenet (7x7/2 conv + maxpool) or cifar (3x3/1 conv, no maxpool)")
      ->capture_default_str()->check(CLI::IsMember({"imagenet", "cifar"}));
  app.add_option("--device", device_name, "cpu, cuda or cuda:N")->capture_default_str();
  app.add_option("--amp", amp_name, "O0 (f32), O1, O2, O3 or bf16, as the apps' --amp")
      ->capture_default_str()
      ->check(CLI::IsMember({"O0", "O1", "O2", "O3", "bf16"}));
  bool channels_last = false;
  app.add_flag("--channels-last", channels_last,
               "the model's weights and the images channels-last (NHWC), as the apps' --channels-last");
  bool cuda_graph = false;
  app.add_flag("--cuda-graph", cuda_graph,
               "on a GPU: after the warm-up, capture one training step as a CUDA graph and time its replays (the "
               "loss scale kept on the GPU; not yet run on a GPU)");
  app.add_option("--profile", profile_steps, "after the timed steps, profile this many more per op and layer (stderr)")
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    set_num_threads(threads);
    manual_seed(0);
    const Device device = parse_device(device_name);
    if (device.is_cuda()) cuda::set_device(device.index);
    LOOM_CHECK(!cuda_graph || device.is_cuda(), "--cuda-graph needs a GPU (--device cuda), not ", device.str());
    LOOM_CHECK(!cuda_graph || warmup >= 1, "--cuda-graph needs --warmup of at least 1: the eager steps make the "
               "optimizer's state and cuDNN's plans, which a capture cannot");
    auto model = apps::make_model(arch, 10, 3, nn::parse_resnet_stem(stem));
    model->to(device);
    const MemoryFormat format = channels_last ? MemoryFormat::nhwc : MemoryFormat::nchw;
    model->to(format);  // before the optimizer takes the parameters
    // With the CIFAR stem at 0.01 the loss on the repeated batch climbs for
    // about 10 steps (to ~9, PyTorch 2.15's as loom's) before it falls, so
    // whether it is below the first loss after 20 steps is chance; at 0.001
    // it falls from the start. The peer uses the same defaults.
    if (lr == 0) lr = stem == "cifar" ? 0.001 : 0.01;
    // apex's amp.initialize: the model in the level's dtypes, SGD over what it steps (f32 masters where needed).
    const amp::OptLevel amp_level = amp::parse_opt_level(amp_name);
    std::unique_ptr<amp::MixedPrecisionOptimizer> optimizer = amp::initialize(
        *model,
        [lr](std::vector<Tensor> parameters) -> std::unique_ptr<optim::Optimizer> {
          return std::make_unique<optim::SGD>(std::move(parameters), optim::SGDOptions(lr).momentum(0.9));
        },
        amp_level);
    if (cuda_graph) optimizer->place_loss_scale(device);  // a captured step cannot read the overflow flag back
    // (batch, 3, size, size) standard-normal images and uniform labels, as the peer's randn / randint.
    Generator gen(1);
    Tensor images = Tensor::empty({batch, 3, size, size});
    gen.normal_(images, 0.0, 1.0);
    std::vector<int64_t> label_values(batch);
    for (auto& label : label_values) label = static_cast<int64_t>(gen.below(10));
    const Tensor labels = Tensor::from_vector(label_values, {batch}).to(device);
    images = in_memory_format(images.to(amp::input_dtype(amp_level)).to(device), format);
    // One step: the forward pass and loss under the level's autocast, the
    // scaled loss backward, the step (skipped on inf / NaN gradients at O2).
    const auto train_step = [&] {
      optimizer->zero_grad();
      Tensor loss;
      {
        profiler::Scope forward_scope("forward + loss (all)");
        auto autocast = optimizer->autocast();
        loss = cross_entropy((*model)(images), labels);
      }
      {
        profiler::Scope backward_scope("backward (all)");
        optimizer->scale_loss(loss).backward();
      }
      profiler::Scope optimizer_scope("optimizer step");
      optimizer->step();
      return loss;
    };

    // --cuda-graph: the warm-up eager, then one step captured, whose replays
    // are timed (each keeps a copy of the step's loss, read afterwards).
    std::optional<cuda::Graph> graph;
    Tensor captured_loss;
    if (cuda_graph) {
      for (int64_t step = 0; step < warmup; ++step) train_step();
      graph.emplace(device.index);
      graph->capture([&] { captured_loss = train_step(); });
    }
    const auto replay_step = [&] {
      graph->replay();
      return captured_loss.clone();
    };
    const auto [timing, losses] =
        cuda_graph ? bench::time_training(device, 0, repeats, steps, profile_one_step, replay_step)
                   : bench::time_training(device, warmup, repeats, steps, profile_one_step, train_step);
    const double seconds = timing.total_ms / 1000;
    // The same batch every step: SGD must bring its loss down. Compared as the
    // means of the first and the last half of the steps, since dropout and
    // stochastic depth (EfficientNet, ConvNeXt) make single steps' losses jump.
    const size_t half = losses.size() / 2;
    double first_half = 0, last_half = 0;
    for (size_t i = 0; i < half; ++i) {
      first_half += losses[i] / static_cast<double>(half);
      last_half += losses[losses.size() - 1 - i] / static_cast<double>(half);
    }
    if (!(last_half < first_half)) {
      std::string all;
      for (double l : losses) all += str(all.empty() ? "" : " ", l);
      throw Error(str("loss did not fall on the repeated batch: the mean of the first ", half, " steps is ",
                      first_half, ", of the last ", half, " ", last_half, " (every step: ", all, "; ",
                      optimizer->scaler().skipped_steps(), " steps skipped for inf / NaN gradients)"));
    }
    if (profile_steps > 0) {
      profiler::set_enabled(true);
      for (int64_t step = 0; step < profile_steps; ++step) {
        profiler::Scope step_scope("training step (all)");
        train_step();
      }
      profiler::set_enabled(false);
      std::fprintf(stderr, "profile of %lld steps (threads %d):\n%s", static_cast<long long>(profile_steps), threads,
                   profiler::report().c_str());
      std::fprintf(stderr, "machine f32 GEMM peak at %d threads: %s\n", threads,
                   bench::to_json(bench::measure_gemm_peak(threads)).c_str());
    }
    std::printf(
        "{\"bench\": \"loom %s train\", \"stem\": \"%s\", \"size\": %lld, \"device\": \"%s\", \"amp\": \"%s\", "
        "\"channels_last\": %s, \"cuda_graph\": %s, "
        "\"threads\": %d, \"batch\": %lld, \"steps\": %lld, \"warmup\": %lld, \"train_s\": %.3f, "
        "\"images_per_s\": %.1f, \"step_ms\": %.3f, \"lr\": %g, \"loss_first\": %.4f, \"loss_last\": %.4f, "
        "\"skipped_steps\": %lld, \"peak_rss_mb\": %.1f%s}\n",
        arch.c_str(), stem.c_str(), static_cast<long long>(size), device.str().c_str(), amp_name.c_str(),
        channels_last ? "true" : "false", cuda_graph ? "true" : "false", threads,
        static_cast<long long>(batch), static_cast<long long>(steps), static_cast<long long>(warmup), seconds,
        static_cast<double>(batch) * 1000.0 / timing.median_ms(), timing.median_ms(), lr, losses.front(),
        losses.back(), static_cast<long long>(optimizer->scaler().skipped_steps()),
        static_cast<double>(train::peak_rss_bytes()) / (1 << 20), bench::step_timing_json(timing, device).c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "resnet50_throughput: %s\n", e.what());
    return 1;
  }
}
