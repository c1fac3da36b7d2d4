// Where a data-parallel step's time goes: one process per rank (started by
// loomrun, srun or train_mnist-style variables), a model wrapped in
// DistributedDataParallel, synthetic batches; after warm-up, per step the
// backward time, the communication time of every bucket and how much of it
// was not hidden under backward (reduction end - backward end). Checks first
// that every rank holds the same averaged gradients. Rank 0 prints one JSON
// line with the medians and the last step's bucket timeline.
//   loomrun --nproc_per_node=2 build/benchmarks/dist/ddp_timeline --model convnet
//   loomrun --nproc_per_node=2 build/benchmarks/dist/ddp_timeline --model resnet18 --batch-size 16 --bucket-mb 1
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include <loom/core/generator.h>
#include <loom/core/parallel.h>
#include <loom/dist/ddp.h>
#include <loom/dist/environment.h>
#include <loom/dist/process_group.h>
#include <loom/ops/loss.h>
#include <loom/optim/optimizer.h>
#include "benchmarks/stats.h"
#include "benchmarks/benchmark_model.h"

using namespace loom;
using Clock = std::chrono::steady_clock;

namespace {
using bench::median;

double ms(Clock::time_point from, Clock::time_point to) { return std::chrono::duration<double, std::milli>(to - from).count(); }

// Sum of every gradient, reduced with max and min over ranks: equal when
// every rank holds the same averaged gradients.
void check_gradients_agree(nn::Module& model, dist::ProcessGroup& group) {
  double total = 0;
  for (auto& [name, parameter] : model.named_parameters())
    for (double g : parameter.grad().to_vector<double>()) total += g;
  Tensor high = Tensor::full({1}, total, DType::f64), low = Tensor::full({1}, total, DType::f64);
  group.all_reduce(high, dist::ReduceOp::max)->wait();
  group.all_reduce(low, dist::ReduceOp::min)->wait();
  LOOM_CHECK(std::isfinite(total) && high.item() == low.item(), "ranks disagree on the averaged gradients: sum ",
             low.item(), " .. ", high.item());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"DDP step timeline: backward, bucket all-reduces, exposed communication"};
  std::string model_name = "convnet";
  int64_t batch_size = 100, steps = 30, warmup = 5;
  int threads = 1;
  double bucket_mb = 25, first_bucket_mb = 1;
  std::string compression = "none";
  app.add_option("--model", model_name, "convnet (28x28x1) or resnet18/resnet50 (32x32x3, CIFAR stem)")
      ->check(CLI::IsMember({"convnet", "resnet18", "resnet50"}));
  app.add_option("--batch-size", batch_size, "images per rank and step")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "measured steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "steps before measuring")->check(CLI::NonNegativeNumber);
  app.add_option("--threads", threads, "CPU threads per rank")->check(CLI::PositiveNumber);
  app.add_option("--bucket-mb", bucket_mb, "bucket cap in MiB (PyTorch's bucket_cap_mb)")->check(CLI::PositiveNumber);
  app.add_option("--first-bucket-mb", first_bucket_mb, "first bucket cap in MiB")->check(CLI::PositiveNumber);
  app.add_option("--compression", compression, "none, fp16 or bf16")->check(CLI::IsMember({"none", "fp16", "bf16"}));
  CLI11_PARSE(app, argc, argv);
  try {
    set_num_threads(threads);
    auto group = dist::init_process_group(dist::InitOptions().init_method("env://").timeout(
        dist::collective_timeout_from_environment(std::chrono::minutes(5))));
    const bool leader = group->rank() == 0;
    manual_seed(0);
    const auto [model, input_shape] = benchmarks::make_benchmark_model(model_name, batch_size, nn::ResNetStem::cifar);
    dist::DistributedDataParallel ddp(model, group,
                                      dist::DistributedDataParallelOptions()
                                          .first_bucket_bytes_cap(static_cast<size_t>(first_bucket_mb * (1 << 20)))
                                          .bucket_bytes_cap(static_cast<size_t>(bucket_mb * (1 << 20))));
    if (compression != "none") ddp.register_comm_hook(dist::compress_hook(compression == "fp16" ? DType::f16 : DType::bf16));
    optim::SGD sgd(model->parameters(), optim::SGDOptions(0.01).momentum(0.9));

    // Synthetic batches, different on every rank.
    std::vector<double> pixels(static_cast<size_t>(shape_numel(input_shape)));
    for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = std::sin(0.01 * static_cast<double>(i) + group->rank());
    const Tensor images = Tensor::from_vector_as(pixels, input_shape, DType::f32);
    std::vector<int64_t> label_values(static_cast<size_t>(batch_size));
    for (int64_t i = 0; i < batch_size; ++i) label_values[i] = (i + group->rank()) % 10;
    const Tensor labels = Tensor::from_vector<int64_t>(label_values, {batch_size});

    std::vector<double> step_ms, backward_ms, communication_ms, exposed_ms;
    dist::IterationTiming last;
    for (int64_t step = 0; step < warmup + steps; ++step) {
      const auto start = Clock::now();
      Tensor loss = cross_entropy(ddp(images), labels);
      sgd.zero_grad();
      const auto backward_start = Clock::now();
      loss.backward();
      if (step == 0) check_gradients_agree(*model, *group);
      sgd.step();
      const auto end = Clock::now();
      if (step < warmup) continue;
      last = ddp.last_iteration_timing();
      double busy = 0;
      for (const auto& bucket : last.buckets) busy += ms(bucket.started, bucket.done);
      step_ms.push_back(ms(start, end));
      backward_ms.push_back(ms(backward_start, last.backward_end));
      communication_ms.push_back(busy);
      exposed_ms.push_back(ms(last.backward_end, last.reduced));
    }
    if (leader) {
      std::string buckets;
      for (const auto& bucket : last.buckets) {
        buckets += str(buckets.empty() ? "" : ", ", "{\"bytes\": ", bucket.bytes, ", \"wire_bytes\": ", bucket.wire_bytes,
                       ", \"parameters\": ", bucket.parameters, ", \"ready_ms\": ", ms(last.forward_end, bucket.ready),
                       ", \"launched_ms\": ", ms(last.forward_end, bucket.launched),
                       ", \"started_ms\": ", ms(last.forward_end, bucket.started),
                       ", \"done_ms\": ", ms(last.forward_end, bucket.done), "}");
      }
      std::printf(
          "{\"model\": \"%s\", \"world\": %d, \"threads\": %d, \"batch_per_rank\": %lld, \"compression\": \"%s\", "
          "\"images_per_s\": %.1f, \"step_ms\": %.3f, \"backward_ms\": %.3f, \"communication_ms\": %.3f, "
          "\"exposed_communication_ms\": %.3f, \"last_step\": {\"first_gradient_ms\": %.3f, \"backward_end_ms\": %.3f, "
          "\"reduced_ms\": %.3f, \"buckets\": [%s]}}\n",
          model_name.c_str(), group->size(), threads, static_cast<long long>(batch_size), compression.c_str(),
          1000.0 * static_cast<double>(batch_size * group->size()) / median(step_ms), median(step_ms),
          median(backward_ms), median(communication_ms), median(exposed_ms), ms(last.forward_end, last.first_gradient),
          ms(last.forward_end, last.backward_end), ms(last.forward_end, last.reduced), buckets.c_str());
    }
    group->barrier()->wait();
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "ddp_timeline: %s\n", error.what());
    return 1;
  }
}
