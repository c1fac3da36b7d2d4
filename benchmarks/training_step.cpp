// One training step of a benchmark model, isolated for instruction counting:
// `warmup` steps (scratch buffers and allocator caches grow to size), then
// one step inside counted_training_step(), the function that
// benchmarks/callgrind_step.sh tells callgrind to count (--toggle-collect).
// The models and shapes are the throughput benchmarks': ResNet-50 with the
// ImageNet or CIFAR stem on (batch, 3, 32, 32), the MNIST ConvNet on
// (batch, 1, 28, 28); random images and labels, SGD with momentum. Checks
// that every loss is finite and prints them as one JSON line.
//   training_step --model resnet50 --stem cifar --batch 32 --threads 1
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <memory>

#include <loom/core/generator.h>
#include <loom/core/parallel.h>
#include <loom/ops/loss.h>
#include <loom/optim/optimizer.h>
#include "benchmarks/benchmark_model.h"

// Under valgrind --instr-atstart=no, instrumentation starts at the measured
// step, so the warm-up runs at valgrind's plain speed (no-ops otherwise, and
// without valgrind's headers).
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define LOOM_CALLGRIND_REQUESTS 1
#else
#define LOOM_CALLGRIND_REQUESTS 0
#define CALLGRIND_START_INSTRUMENTATION
#define CALLGRIND_STOP_INSTRUMENTATION
#endif

using namespace loom;

namespace {

double training_step(nn::Module& model, optim::SGD& optimizer, const Tensor& images, const Tensor& labels) {
  optimizer.zero_grad();
  Tensor loss = cross_entropy(model(images), labels);
  loss.backward();
  optimizer.step();
  return loss.item();
}

}  // namespace

// Not inlined and not static: callgrind counts this one by name
// (--toggle-collect). It must be entered after instrumentation starts, or
// callgrind does not see the entry: hence the wrapper below.
[[gnu::noinline]] double counted_training_step(nn::Module& model, optim::SGD& optimizer, const Tensor& images,
                                               const Tensor& labels) {
  return training_step(model, optimizer, images, labels);
}

[[gnu::noinline]] double measured_training_step(nn::Module& model, optim::SGD& optimizer, const Tensor& images,
                                                const Tensor& labels) {
  CALLGRIND_START_INSTRUMENTATION;
  const double loss = counted_training_step(model, optimizer, images, labels);
  CALLGRIND_STOP_INSTRUMENTATION;
  return loss;
}

int main(int argc, char** argv) {
  CLI::App app{"one training step of a benchmark model (for callgrind instruction counts)"};
  std::string model_name = "resnet50", stem_name = "imagenet";
  int64_t batch = 32, warmup = 1;
  int threads = 1;
  app.add_option("--model", model_name, "resnet18 .. resnet152, convnet, or another of the apps' --model names")->capture_default_str();
  app.add_option("--stem", stem_name, "ResNet stem: imagenet or cifar")->capture_default_str();
  app.add_option("--batch", batch, "images per step")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "steps before the measured one")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--threads", threads, "CPU threads")->capture_default_str()->check(CLI::PositiveNumber);
  bool requests = false;
  app.add_flag("--callgrind-requests", requests,
               "print whether the measured step starts callgrind's instrumentation itself (yes / no), and exit");
  CLI11_PARSE(app, argc, argv);
  if (requests) {
    std::printf("%s\n", LOOM_CALLGRIND_REQUESTS ? "yes" : "no");
    return 0;
  }
  try {
    set_num_threads(threads);
    manual_seed(0);
    const auto [model, image_shape] =
        benchmarks::make_benchmark_model(model_name, batch, nn::parse_resnet_stem(stem_name));
    optim::SGD optimizer(model->parameters(), optim::SGDOptions(0.01).momentum(0.9));
    Generator gen(1);
    Tensor images = Tensor::empty(image_shape);
    gen.normal_(images, 0.0, 1.0);
    std::vector<int64_t> label_values(batch);
    for (auto& label : label_values) label = static_cast<int64_t>(gen.below(10));
    const Tensor labels = Tensor::from_vector(label_values, {batch});
    std::vector<double> losses;
    for (int64_t step = 0; step < warmup; ++step) losses.push_back(training_step(*model, optimizer, images, labels));
    losses.push_back(measured_training_step(*model, optimizer, images, labels));
    std::string listed;
    for (double loss : losses) {
      if (!std::isfinite(loss)) throw Error(str("a loss is not finite: ", loss));
      listed += (listed.empty() ? "" : ", ") + str(loss);
    }
    std::printf("{\"model\": \"%s\", \"stem\": \"%s\", \"batch\": %lld, \"threads\": %d, \"losses\": [%s]}\n",
                model_name.c_str(), model_name == "convnet" ? "-" : stem_name.c_str(), static_cast<long long>(batch),
                threads, listed.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "training_step: %s\n", e.what());
    return 1;
  }
}
