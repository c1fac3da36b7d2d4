// Training on the GPU against the CPU: the fused optimizer updates against the
// CPU loops, and the tutorials' ConvNet trained from the same initialisation
// on the same batches, whose loss curves must agree step by step.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <tuple>
#include <limits>

#include <loom/core/cuda/counters.h>
#include <loom/core/cuda/graph.h>
#include <loom/core/cuda/runtime.h>
#include <loom/nn/convnet.h>
#include <loom/nn/layers.h>
#include <loom/ops/elementwise.h>
#include <loom/ops/loss.h>
#include <loom/optim/cuda/fused_update.h>
#include <loom/data/loader.h>
#include <loom/data/sampler.h>
#include <loom/optim/amp.h>
#include <loom/optim/lr_scheduler.h>
#include <loom/train/trainer.h>
#include "tests/support/generated_dataset.h"
#include <loom/optim/grad_scaler.h>
#include <loom/optim/optimizer.h>
#include "tests/gpu/compare.h"
#include "tests/gpu/convnet_o2.h"

using namespace loom;
using namespace loom::gpu_testing;

namespace {

// Learnable synthetic MNIST-like batches: class k lights a k-dependent
// rectangle of a 28x28 image, plus noise.
struct SyntheticBatch {
  Tensor images, labels;  // (N, 1, 28, 28) f32, (N) i64, on the CPU
};
SyntheticBatch synthetic_batch(int64_t n, uint64_t seed) {
  Generator gen(seed);
  std::vector<float> pixels(static_cast<size_t>(n * 28 * 28));
  std::vector<int64_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = static_cast<int64_t>(gen.below(10));
    labels[i] = k;
    for (int64_t y = 0; y < 28; ++y) {
      for (int64_t x = 0; x < 28; ++x) {
        const bool lit = y >= 2 * k && y < 2 * k + 8 && x >= 27 - 2 * k - 8 && x < 27 - 2 * k;
        pixels[(i * 28 + y) * 28 + x] = static_cast<float>((lit ? 1.0 : 0.0) + 0.3 * gen.normal());
      }
    }
  }
  return {Tensor::from_vector<float>(pixels, {n, 1, 28, 28}), Tensor::from_vector<int64_t>(labels, {n})};
}

// Runs the same optimizer update on CPU and GPU copies of one parameter set
// for three steps with fixed gradients and compares the parameters.
template <class MakeOptimizer>
void check_optimizer(const char* name, MakeOptimizer make) {
  INFO(name);
  std::vector<Tensor> cpu_params, gpu_params;
  for (const Shape& shape : {Shape{16, 1, 5, 5}, Shape{16}, Shape{10, 1568}, Shape{10000}, Shape{3}}) {
    Tensor p = random_cpu(shape, 71 + cpu_params.size(), DType::f32).set_requires_grad(true);
    cpu_params.push_back(p);
    gpu_params.push_back(to_gpu(p));
  }
  auto cpu_optimizer = make(cpu_params);
  auto gpu_optimizer = make(gpu_params);
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < cpu_params.size(); ++i) {
      const Tensor g = random_cpu(cpu_params[i].sizes(), 100 * step + i, DType::f32);
      cpu_params[i].set_grad(g);
      gpu_params[i].set_grad(g.to(kCuda));
    }
    cpu_optimizer->step();
    gpu_optimizer->step();
  }
  for (size_t i = 0; i < cpu_params.size(); ++i) {
    check_close(gpu_params[i], cpu_params[i], 1e-6, std::string(name) + " parameter " + std::to_string(i));
  }
  // The state a checkpoint saves lives on the parameters' device.
  for (auto& [key, t] : gpu_optimizer->state()) {
    if (t.dim() > 0) CHECK(t.device().is_cuda());
  }
}

}  // namespace

TEST_SUITE("training") {

TEST_CASE("fused optimizer updates match the CPU optimizers") {
  using optim::Adam;
  using optim::AdamOptions;
  using optim::SGD;
  using optim::SGDOptions;
  check_optimizer("SGD", [](std::vector<Tensor> p) { return std::make_unique<SGD>(p, SGDOptions(0.1)); });
  check_optimizer("SGD momentum, weight decay", [](std::vector<Tensor> p) {
    return std::make_unique<SGD>(p, SGDOptions(0.05).momentum(0.9).weight_decay(1e-2).dampening(0.1));
  });
  check_optimizer("SGD nesterov", [](std::vector<Tensor> p) {
    return std::make_unique<SGD>(p, SGDOptions(0.05).momentum(0.9).nesterov(true));
  });
  check_optimizer("Adam, L2", [](std::vector<Tensor> p) {
    return std::make_unique<Adam>(p, AdamOptions(1e-2).weight_decay(1e-2));
  });
  check_optimizer("AdamW", [](std::vector<Tensor> p) { return optim::make_adamw(p, 1e-2, 1e-2); });
}

TEST_CASE("GradScaler's unscale on the GPU matches the CPU and finds inf / NaN") {
  for (DType dtype : {DType::f16, DType::bf16, DType::f32, DType::f64}) {
    INFO(dtype_name(dtype));
    std::vector<Tensor> cpu_sources, gpu_sources, cpu_destinations, gpu_destinations;
    for (const Shape& shape : {Shape{1000}, Shape{16, 1, 5, 5}, Shape{70000}}) {
      const Tensor g = random_cpu(shape, 81 + cpu_sources.size(), dtype, -1000, 1000);
      cpu_sources.push_back(g);
      gpu_sources.push_back(g.to(kCuda));
      const DType to = dtype == DType::f64 ? DType::f64 : DType::f32;
      cpu_destinations.push_back(Tensor::empty(shape, to));
      gpu_destinations.push_back(Tensor::empty(shape, to, kCuda));
    }
    const double factor = 1.0 / 65536;
    CHECK_FALSE(optim::unscale_and_check(gpu_sources, gpu_destinations, factor));
    CHECK_FALSE(optim::unscale_and_check(cpu_sources, cpu_destinations, factor));
    for (size_t i = 0; i < cpu_sources.size(); ++i) {
      check_close(gpu_destinations[i], cpu_destinations[i], 0, "unscaled gradient " + std::to_string(i));
    }
    // An infinity anywhere in any tensor is found.
    Tensor poisoned = cpu_sources[2].clone();
    poisoned.slice(0, 69999, 70000).fill_(std::numeric_limits<double>::infinity());
    gpu_sources[2] = poisoned.to(kCuda);
    CHECK(optim::unscale_and_check(gpu_sources, gpu_destinations, factor));
  }
}

TEST_CASE("the ConvNet's loss curve on the GPU matches the CPU's") {
  manual_seed(0);
  nn::ConvNet cpu_model;
  manual_seed(0);
  nn::ConvNet gpu_model;
  gpu_model.to(kCuda);
  optim::SGD cpu_sgd(cpu_model.parameters(), optim::SGDOptions(0.01).momentum(0.9));
  optim::SGD gpu_sgd(gpu_model.parameters(), optim::SGDOptions(0.01).momentum(0.9));
  std::vector<double> cpu_losses, gpu_losses;
  for (int step = 0; step < 40; ++step) {
    const SyntheticBatch batch = synthetic_batch(100, 1000 + step);
    Tensor cpu_loss = cross_entropy(cpu_model(batch.images), batch.labels);
    cpu_sgd.zero_grad();
    cpu_loss.backward();
    cpu_sgd.step();
    Tensor gpu_loss = cross_entropy(gpu_model(batch.images.to(kCuda)), batch.labels.to(kCuda));
    gpu_sgd.zero_grad();
    gpu_loss.backward();
    gpu_sgd.step();
    cpu_losses.push_back(cpu_loss.item());
    gpu_losses.push_back(gpu_loss.item());
  }
  for (size_t i = 0; i < cpu_losses.size(); ++i) {
    INFO("step ", i, ": cpu ", cpu_losses[i], " gpu ", gpu_losses[i]);
    CHECK(std::abs(gpu_losses[i] - cpu_losses[i]) <= 2e-3 * std::max(1.0, std::abs(cpu_losses[i])));
  }
  CHECK(gpu_losses.back() < 0.5 * gpu_losses.front());  // it learned
  const auto cpu_state = cpu_model.state_dict();
  const auto gpu_state = gpu_model.state_dict();
  REQUIRE(cpu_state.size() == gpu_state.size());
  for (size_t i = 0; i < cpu_state.size(); ++i) {
    if (!is_floating(cpu_state[i].second.dtype())) {
      check_close(gpu_state[i].second, cpu_state[i].second, 0, cpu_state[i].first);
    } else {
      check_close(gpu_state[i].second, cpu_state[i].second, 1e-2, cpu_state[i].first);
    }
  }
  MESSAGE(cuda::memory_summary(0));
}

TEST_CASE("channels-last f16 training on the GPU learns") {
  manual_seed(1);
  nn::ConvNet model;
  model.to(kCuda);
  model.to(DType::f16, {"BatchNorm2d"});  // BN parameters and statistics stay f32
  // The optimizer steps f32 master copies; gradients arrive in f16.
  std::vector<Tensor> params = model.parameters();
  std::vector<Tensor> master;
  for (const Tensor& p : params) master.push_back(p.detach().to(DType::f32).set_requires_grad(true));
  optim::SGD sgd(master, optim::SGDOptions(0.02).momentum(0.9));
  std::vector<double> losses;
  for (int step = 0; step < 60; ++step) {
    const SyntheticBatch batch = synthetic_batch(100, 2000 + step % 20);
    Tensor images = to_gpu(batch.images.to(DType::f16), true);
    Tensor loss = cross_entropy(model(images), batch.labels.to(kCuda));
    model.zero_grad(true);
    loss.backward();
    for (size_t i = 0; i < params.size(); ++i) master[i].set_grad(params[i].grad().to(DType::f32));
    sgd.step();
    NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) Tensor(params[i]).copy_(master[i]);
    if (step % 10 == 0 || step == 59) losses.push_back(loss.item());
  }
  INFO("losses every 10 steps: ", losses.front(), " ... ", losses.back());
  for (double l : losses) CHECK(std::isfinite(l));
  CHECK(losses.back() < 0.5 * losses.front());
}

TEST_CASE("copy_tensors (LOOM_CUDA_MASTER_COPY=fused) equals one copy_ per tensor, bit for bit, in fewer launches") {
  // 40 pairs (more than one list of 36), sizes across chunk boundaries and
  // empty ones, destinations f16, bf16 and f32 as O2's model holds them;
  // values beyond f16's range round to infinity in both.
  std::vector<Tensor> sources, fused, per_tensor;
  const DType destination_dtypes[] = {DType::f16, DType::bf16, DType::f32};
  for (int i = 0; i < 40; ++i) {
    const int64_t n = i % 7 == 3 ? 0 : 1 + (i * 2311) % 9000;
    sources.push_back(to_gpu(random_cpu({n}, 80 + i, DType::f32, -70000.0, 70000.0)));
    const DType dtype = destination_dtypes[i % 3];
    fused.push_back(Tensor::zeros({n}, dtype, kCuda));
    per_tensor.push_back(Tensor::zeros({n}, dtype, kCuda));
  }
  const cuda::Counters before = cuda::counters();
  optim::cuda::copy_tensors(sources, fused);
  const int64_t launches = (cuda::counters() - before).kernel_launches;
  CHECK(launches == 3);  // one list per destination dtype (14, 13 and 13 pairs)
  for (size_t i = 0; i < sources.size(); ++i) per_tensor[i].copy_(sources[i]);
  for (size_t i = 0; i < sources.size(); ++i) {
    INFO("pair ", i, " ", fused[i].str());
    CHECK(host_values(fused[i]) == host_values(per_tensor[i]));
  }
}

TEST_CASE("BatchNorm2d counts a training batch in one launch on the GPU, and counts right") {
  nn::BatchNorm2d bn(4);
  bn.to(kCuda);
  const Tensor x = to_gpu(random_cpu({2, 4, 3, 3}, 71, DType::f32));
  bn(x);  // the first batch also makes the counter's one
  const cuda::Counters counted_before = cuda::counters();
  bn(x);
  const int64_t counted = (cuda::counters() - counted_before).kernel_launches;
  const Tensor tracked = bn.num_batches_tracked;
  bn.num_batches_tracked = Tensor();  // not tracked: nothing to count
  const cuda::Counters uncounted_before = cuda::counters();
  bn(x);
  const int64_t uncounted = (cuda::counters() - uncounted_before).kernel_launches;
  CHECK(counted - uncounted == 1);
  CHECK(tracked.to(Device::cpu()).to_vector<int64_t>() == std::vector<int64_t>{2});
}

TEST_CASE("the loss scale on the GPU (LOOM_CUDA_LOSS_SCALE=device): kernels equal the host's, bit for bit") {
  // The unscale reading the scale from the device equals the host-factor
  // unscale, flag included; the update kernel follows the host schedule
  // through growth, back-off and both bounds.
  const optim::GradScalerOptions options =
      optim::GradScalerOptions().init_scale(6.0).growth_interval(2).min_scale(0.75).max_scale(24.0);
  optim::GradScaler host(options), device(options);
  device.to(kCuda);
  REQUIRE(device.device() == kCuda);
  const std::vector<int> flags = {0, 0, 0, 0, 1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0};
  for (size_t step = 0; step < flags.size(); ++step) {
    INFO("step ", step);
    std::vector<Tensor> cpu_sources, gpu_sources, cpu_destinations, gpu_destinations;
    for (DType dtype : {DType::f16, DType::bf16, DType::f32}) {
      Tensor g = random_cpu({5000}, 90 + step, dtype, -1000, 1000);
      if (flags[step] != 0 && dtype == DType::bf16) g.slice(0, 4321, 4322).fill_(std::nan(""));
      cpu_sources.push_back(g);
      gpu_sources.push_back(g.to(kCuda));
      cpu_destinations.push_back(Tensor::empty({5000}, DType::f32));
      gpu_destinations.push_back(Tensor::empty({5000}, DType::f32, kCuda));
    }
    const cuda::Counters before = cuda::counters();
    const Tensor gpu_flag = device.unscale(gpu_sources, gpu_destinations);
    device.update(gpu_flag);
    const cuda::Counters spent = cuda::counters() - before;
    CHECK(spent.host_syncs() == 0);
    // One unscale list per source dtype (3), the update, and the flag's zero (a fill or a memset).
    CHECK(spent.kernel_launches <= 5);
    const Tensor cpu_flag = host.unscale(cpu_sources, cpu_destinations);
    host.update(cpu_flag);
    CHECK(gpu_flag.device() == kCuda);
    CHECK(host_values(gpu_flag) == std::vector<double>{static_cast<double>(flags[step])});
    CHECK(host_values(cpu_flag) == std::vector<double>{static_cast<double>(flags[step])});
    if (flags[step] == 0) {
      for (size_t i = 0; i < cpu_sources.size(); ++i) {
        CHECK(host_values(gpu_destinations[i]) == host_values(cpu_destinations[i]));
      }
    }
    CHECK(device.get_scale() == host.get_scale());
    CHECK(device.growth_tracker() == host.growth_tracker());
    CHECK(device.skipped_steps() == host.skipped_steps());
    // The loss is multiplied by the same scale, on the device.
    const Tensor loss = Tensor::scalar(0.3125);
    CHECK(host_values(device.scale(loss.to(kCuda))) == host_values(host.scale(loss)));
  }
  CHECK(host.skipped_steps() == 5);
  // A checkpoint of the device state restores into a host one.
  optim::GradScaler restored(options);
  restored.load_state(device.state());
  CHECK(restored.get_scale() == device.get_scale());
}

TEST_CASE("amp O2 with SGD and the loss scale on the GPU: the host's steps bit for bit, skip included, no host sync") {
  // Two ConvNets from one initialisation, amp O2 with SGD momentum, the same
  // batches; one keeps the loss scale on the host (the default), the other
  // on the GPU. Step 3's gradients are poisoned: both skip it.
  const auto make = [](bool on_device) {
    manual_seed(5);
    auto model = std::make_shared<nn::ConvNet>();
    model->to(kCuda);
    if (on_device) setenv("LOOM_CUDA_LOSS_SCALE", "device", 1);
    auto optimizer = amp::initialize(
        *model, [](std::vector<Tensor> p) { return std::make_unique<optim::SGD>(p, optim::SGDOptions(0.02).momentum(0.9)); },
        amp::OptLevel::O2, optim::GradScalerOptions().init_scale(1024).growth_interval(3));
    unsetenv("LOOM_CUDA_LOSS_SCALE");
    return std::make_pair(model, std::shared_ptr<amp::MixedPrecisionOptimizer>(std::move(optimizer)));
  };
  auto [host_model, host_optimizer] = make(false);
  auto [device_model, device_optimizer] = make(true);
  CHECK(host_optimizer->scaler().device() == Device::cpu());
  CHECK(device_optimizer->scaler().device() == kCuda);
  for (int step = 0; step < 8; ++step) {
    INFO("step ", step);
    const SyntheticBatch batch = synthetic_batch(64, 3000 + step);
    const Tensor images = batch.images.to(DType::f16).to(kCuda), labels = batch.labels.to(kCuda);
    for (auto* run : {&host_optimizer, &device_optimizer}) {
      amp::MixedPrecisionOptimizer& optimizer = **run;
      nn::ConvNet& model = run == &host_optimizer ? *host_model : *device_model;
      const cuda::Counters before = cuda::counters();
      Tensor loss;
      {
        auto autocast = optimizer.autocast();
        loss = cross_entropy(model(images), labels);
      }
      optimizer.zero_grad();
      optimizer.scale_loss(loss).backward();
      if (step == 3) {
        make_view(model.named_parameters()[0].second.mutable_grad(), {1}, {1}, 7)
            .fill_(std::numeric_limits<double>::infinity());
      }
      optimizer.step();
      const int64_t syncs = (cuda::counters() - before).host_syncs();
      // The first step makes the momentum buffers on the host's decision.
      if (run == &device_optimizer && step > 0) CHECK(syncs == 0);
      if (run == &host_optimizer) CHECK(syncs >= 1);
    }
    CHECK(device_optimizer->last_step_skipped() == (step == 3));
    CHECK(host_optimizer->last_step_skipped() == (step == 3));
    CHECK(device_optimizer->scaler().get_scale() == host_optimizer->scaler().get_scale());
  }
  CHECK(device_optimizer->scaler().skipped_steps() == 1);
  const auto host_state = host_model->state_dict(), device_state = device_model->state_dict();
  for (size_t i = 0; i < host_state.size(); ++i) {
    INFO(host_state[i].first);
    CHECK(host_values(device_state[i].second) == host_values(host_state[i].second));
  }
  const auto host_masters = host_optimizer->master_weights()->masters();
  const auto device_masters = device_optimizer->master_weights()->masters();
  for (size_t i = 0; i < host_masters.size(); ++i) CHECK(host_values(device_masters[i]) == host_values(host_masters[i]));
}

TEST_CASE("a training step captured as a CUDA graph replays the eager step bit for bit, O0 and O2") {
  // Two ConvNets from one initialisation and the same batches: one trains
  // eagerly; the other takes one eager step (the momentum buffers, cuDNN's
  // plans), then captures a step and replays it, the batch copied into the
  // captured input before each replay.
  for (const amp::OptLevel level : {amp::OptLevel::O0, amp::OptLevel::O2}) {
    INFO(amp::opt_level_name(level));
    const DType input_dtype = amp::input_dtype(level);
    const auto make = [&] {
      manual_seed(9);
      auto model = std::make_shared<nn::ConvNet>();
      model->to(kCuda);
      std::shared_ptr<amp::MixedPrecisionOptimizer> optimizer = amp::initialize(
          *model,
          [](std::vector<Tensor> p) { return std::make_unique<optim::SGD>(p, optim::SGDOptions(0.02).momentum(0.9)); },
          level, optim::GradScalerOptions().init_scale(1024));
      optimizer->place_loss_scale(kCuda);
      return std::make_pair(model, optimizer);
    };
    auto [eager_model, eager_optimizer] = make();
    auto [graph_model, graph_optimizer] = make();
    const auto step = [](nn::ConvNet& model, amp::MixedPrecisionOptimizer& optimizer, const Tensor& images,
                         const Tensor& labels) {
      optimizer.zero_grad();
      Tensor loss;
      {
        auto autocast = optimizer.autocast();
        loss = cross_entropy(model(images), labels);
      }
      optimizer.scale_loss(loss).backward();
      optimizer.step();
      return loss;
    };
    const auto batch_on_gpu = [&](int index) {
      const SyntheticBatch batch = synthetic_batch(32, 4000 + index);
      return std::make_pair(batch.images.to(input_dtype).to(kCuda), batch.labels.to(kCuda));
    };
    Tensor static_images, static_labels, static_loss;
    std::tie(static_images, static_labels) = batch_on_gpu(0);
    step(*graph_model, *graph_optimizer, static_images, static_labels);
    cuda::Graph graph(0);
    CHECK_FALSE(graph.captured());
    graph.capture([&] { static_loss = step(*graph_model, *graph_optimizer, static_images, static_labels); });
    REQUIRE(graph.captured());
    std::vector<double> eager_losses, graph_losses;
    for (int index = 0; index < 6; ++index) {
      const auto [images, labels] = batch_on_gpu(index);
      eager_losses.push_back(step(*eager_model, *eager_optimizer, images, labels).item());
      if (index == 0) continue;  // the graph model's eager first step
      static_images.copy_(images);
      static_labels.copy_(labels);
      const cuda::Counters before = cuda::counters();
      graph.replay();
      const cuda::Counters spent = cuda::counters() - before;
      CHECK(spent.launches() == 1);
      CHECK(spent.host_syncs() == 0);
      graph_losses.push_back(static_loss.item());
    }
    for (size_t i = 0; i < graph_losses.size(); ++i) CHECK(graph_losses[i] == eager_losses[i + 1]);
    const auto eager_state = eager_model->state_dict(), graph_state = graph_model->state_dict();
    for (size_t i = 0; i < eager_state.size(); ++i) {
      INFO(eager_state[i].first);
      CHECK(host_values(graph_state[i].second) == host_values(eager_state[i].second));
    }
  }
}

TEST_CASE("a step that waits for the device cannot be captured, and the error says which wait") {
  const Tensor x = to_gpu(random_cpu({64}, 3, DType::f32));
  cuda::Graph graph(0);
  CHECK_THROWS_WITH_AS(graph.replay(), doctest::Contains("nothing was captured"), loom::Error);
  const std::string message = error_message([&] { graph.capture([&] { (void)sum(x * x).item(); }); });
  check_mentions(message, {"cannot be captured as a CUDA graph", "device_to_host_copy"});
  CHECK_FALSE(graph.captured());
  // The device is usable afterwards, and a capture without the wait succeeds.
  Tensor y;
  graph.capture([&] { y = x * x; });
  graph.replay();
  CHECK(host_values(y) == host_values(x.to(Device::cpu()) * x.to(Device::cpu())));
}

TEST_CASE("the Trainer's --cuda-graph steps end where its eager steps do, bit for bit: warm-up, schedule, last batch") {
  // The ConvNet at O2 on 150 generated MNIST-like samples, batch 32: 4 full
  // batches and a last one of 22 (eager), 2 epochs, warm-up over 3 steps and
  // a per-step schedule, so the rates change between replays.
  const auto sample = [](int64_t index, float* pixels) -> int64_t {
    const SyntheticBatch one = synthetic_batch(1, 5000 + static_cast<uint64_t>(index));
    const std::vector<float> values = one.images.to_vector<float>();
    std::copy(values.begin(), values.end(), pixels);
    return one.labels.to_vector<int64_t>()[0];
  };
  auto dataset = std::make_shared<loom::testing::GeneratedDataset>("synthetic", 150, data::SampleShape{1, 28, 28}, sample);
  const auto run = [&](bool graphed, int64_t& launches) {
    const ConvNetO2 convnet(kCuda);
    const auto& [model, optimizer] = convnet;
    data::DataLoader loader(dataset,
                            data::DataLoaderOptions().batch_size(32).seed(4).dtype(DType::f16).device(kCuda),
                            std::make_shared<data::DistributedSampler>(150, 1, 0, /*shuffle=*/true, 4));
    train::Trainer trainer(model, optimizer,
                           train::TrainerOptions().epochs(2).warmup_steps(3).cuda_graph(graphed)
                               .scheduler_interval(train::SchedulerInterval::step).log_interval(1000));
    trainer.scheduler(std::make_shared<optim::StepLR>(optimizer->optimizer(), 2, 0.7));
    int64_t steps = 0;
    trainer.on_step([&](const train::StepInfo&) { ++steps; });
    const cuda::Counters before = cuda::counters();
    const train::FitResult result = trainer.fit(loader, nullptr);
    launches = (cuda::counters() - before).launches();
    CHECK(result.steps == 10);
    CHECK(steps == 10);
    return convnet.state();
  };
  int64_t eager_launches = 0, graph_launches = 0;
  const auto eager = run(false, eager_launches);
  const auto graphed = run(true, graph_launches);
  // 7 of the 10 steps are replays (the first step and each epoch's smaller
  // last batch run eagerly): far fewer launches from the host.
  INFO("launches: eager ", eager_launches, ", graphed ", graph_launches);
  CHECK(graph_launches * 2 < eager_launches);
  REQUIRE(graphed.size() == eager.size());
  for (size_t i = 0; i < eager.size(); ++i) {
    INFO("state entry ", i);
    CHECK(graphed[i] == eager[i]);
  }
}

TEST_CASE("Adam with GradScaler's flag on the GPU: counts on the device, a skipped step skipped there, as the host's") {
  // The same Adam / AdamW on the GPU twice: one reads a host flag (its counts
  // on the host), the other takes the flag on the GPU (its counts move
  // there). Step 2 is flagged. The bias corrections are computed in f64 on
  // the device (its pow may differ from the host's in the last bit).
  for (const bool decoupled : {false, true}) {
    INFO((decoupled ? "AdamW" : "Adam"));
    std::vector<Tensor> host_params, device_params;
    for (const Shape& shape : {Shape{16, 1, 5, 5}, Shape{10000}, Shape{3}}) {
      const Tensor p = random_cpu(shape, 61 + host_params.size(), DType::f32);
      host_params.push_back(to_gpu(p).set_requires_grad(true));
      device_params.push_back(to_gpu(p).set_requires_grad(true));
    }
    const optim::AdamOptions options =
        optim::AdamOptions(1e-2).weight_decay(1e-2).decoupled_weight_decay(decoupled);
    optim::Adam host(host_params, options), device(device_params, options);
    for (int step = 0; step < 4; ++step) {
      for (size_t i = 0; i < host_params.size(); ++i) {
        const Tensor g = random_cpu(host_params[i].sizes(), 200 * step + i, DType::f32);
        host_params[i].set_grad(g.to(kCuda));
        device_params[i].set_grad(g.to(kCuda));
      }
      const int flag = step == 2 ? 1 : 0;
      host.step_if_finite(Tensor::scalar(flag, DType::i32));
      const Tensor device_flag = Tensor::scalar(flag, DType::i32).to(kCuda);
      const cuda::Counters before = cuda::counters();
      device.step_if_finite(device_flag);
      CHECK((cuda::counters() - before).host_syncs() == 0);
    }
    for (size_t i = 0; i < host_params.size(); ++i) {
      check_close(device_params[i], host_params[i].to(Device::cpu()), 1e-6, "parameter " + std::to_string(i));
    }
    const auto host_state = host.state(), device_state = device.state();
    REQUIRE(host_state.size() == device_state.size());
    for (size_t k = 0; k < host_state.size(); ++k) {
      INFO(host_state[k].first);
      if (host_state[k].first.ends_with(".step")) {
        CHECK(device_state[k].second.item() == 3);
        CHECK(host_state[k].second.item() == 3);
      }
    }
  }
}

}  // TEST_SUITE
