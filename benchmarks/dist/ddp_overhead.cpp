// DDP's own cost at world 1: the same training steps of the MNIST ConvNet with
// the model bare or wrapped in DistributedDataParallel (a gloo group of one
// rank, so no collective runs and what differs is the reducer: buckets,
// hooks, gradients into the buckets). Meant for instruction counts, which a
// loaded machine does not disturb: the measured steps run inside
// measured_steps(), so callgrind can count just them:
//   valgrind --tool=callgrind --collect-atstart=no --toggle-collect='*measured_steps*'
//       build/benchmarks/dist/ddp_overhead --ddp on   (one command line)
// and the same with --ddp off; the difference of the two totals is DDP's overhead.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>

#include <loom/core/generator.h>
#include <loom/core/parallel.h>
#include <loom/dist/ddp.h>
#include <loom/dist/process_group_gloo.h>
#include <loom/dist/store.h>
#include <loom/nn/convnet.h>
#include <loom/ops/loss.h>
#include <loom/optim/optimizer.h>

using namespace loom;

namespace {

// One training step per iteration: forward, zero_grad (set_to_none), backward, SGD step.
[[gnu::noinline]] double measured_steps(nn::Module& forward, optim::SGD& sgd, const Tensor& images,
                                        const Tensor& labels, int64_t steps) {
  double last_loss = 0;
  for (int64_t step = 0; step < steps; ++step) {
    Tensor loss = cross_entropy(forward.forward(images), labels);
    sgd.zero_grad();
    loss.backward();
    sgd.step();
    last_loss = loss.item();
  }
  return last_loss;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"DDP overhead at world 1: the same steps with and without DistributedDataParallel"};
  std::string ddp_mode = "on";
  int64_t batch_size = 8, steps = 3, warmup = 1;
  app.add_option("--ddp", ddp_mode, "on: wrap the model in DistributedDataParallel; off: the bare model")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--batch-size", batch_size, "images per step")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "measured steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "steps before the measured ones")->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    set_num_threads(1);
    manual_seed(0);
    auto model = std::make_shared<nn::ConvNet>();
    std::shared_ptr<nn::Module> forward = model;
    if (ddp_mode == "on") {
      auto store = std::make_shared<dist::TCPStore>("127.0.0.1", 0, dist::TCPStoreOptions().is_server(true));
      auto group = std::make_shared<dist::ProcessGroupGloo>(store, 0, 1);
      forward = std::make_shared<dist::DistributedDataParallel>(model, group);
    }
    optim::SGD sgd(model->parameters(), optim::SGDOptions(0.01).momentum(0.9));
    const Shape input_shape{batch_size, 1, 28, 28};
    std::vector<double> pixels(static_cast<size_t>(shape_numel(input_shape)));
    for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = std::sin(0.01 * static_cast<double>(i));
    const Tensor images = Tensor::from_vector_as(pixels, input_shape, DType::f32);
    std::vector<int64_t> label_values(static_cast<size_t>(batch_size));
    for (int64_t i = 0; i < batch_size; ++i) label_values[i] = i % 10;
    const Tensor labels = Tensor::from_vector<int64_t>(label_values, {batch_size});

    if (warmup > 0) measured_steps(*forward, sgd, images, labels, warmup);
    const double loss = measured_steps(*forward, sgd, images, labels, steps);
    // The same loss with and without DDP (world 1) shows both ran the same steps.
    std::printf("{\"ddp\": \"%s\", \"batch_size\": %lld, \"steps\": %lld, \"loss\": %.9g}\n", ddp_mode.c_str(),
                static_cast<long long>(batch_size), static_cast<long long>(steps), loss);
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "ddp_overhead: %s\n", error.what());
    return 1;
  }
}
