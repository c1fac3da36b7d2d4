// train_mnist: the tutorials' ConvNet (or a 1-channel ResNet, --model) on MNIST / Fashion-MNIST.
//   train_mnist --epochs 2 --batch-size 100 --lr 0.01
//   train_mnist --amp O2     (mixed precision: apex's amp.initialize(model, optimizer, opt_level='O2'))
// Prints "Epoch [e/E], Step [i/N], Loss: x" every --log-interval steps,
// "Training complete in: h:mm:ss.ffffff" and the test accuracy.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>

#include "apps/app_common.h"
#include "core/autograd.h"
#include "core/cuda/runtime.h"
#include "core/generator.h"
#include "core/parallel.h"
#include "data/idx.h"
#include "data/loader.h"
#include "nn/convnet.h"
#include "nn/resnet.h"
#include "ops/loss.h"
#include "optim/amp.h"
#include "optim/optimizer.h"

namespace fs = std::filesystem;
using namespace loom;

namespace {

struct Flags {
  int epochs = 2;
  int64_t batch_size = 100;
  double lr = 0.01;
  double momentum = 0.9;
  std::string optimizer = "sgd";
  std::string model = "convnet";
  std::string data;
  uint64_t seed = 0;
  int threads = 0;
  int workers = 1;
  int64_t log_interval = 100;
  std::string device = "cpu";
  int64_t max_steps = 0;
  std::string amp = "O0";  // mixed precision: apex's opt level, or bf16
};

// --data, else torchvision's ./data/MNIST/raw, else Debian's Fashion-MNIST.
fs::path resolve_data_dir(const std::string& flag) {
  if (!flag.empty()) {
    if (!fs::is_directory(flag)) throw Error("--data " + flag + ": no such directory");
    return flag;
  }
  for (const char* candidate : {"./data/MNIST/raw", "/usr/share/datasets/fashion-mnist"}) {
    if (fs::is_directory(candidate)) return candidate;
  }
  throw Error(
      "no training data: pass --data DIR with the MNIST IDX files, put them in ./data/MNIST/raw, "
      "or install Fashion-MNIST with `apt-get install dataset-fashion-mnist`");
}

Device resolve_device(const std::string& name) {
  if (name == "auto") return cuda::device_count() > 0 ? Device::cuda(0) : Device::cpu();
  Device device = parse_device(name);
  if (device.is_cuda()) cuda::require_device(device.index);
  return device;
}

double evaluate(nn::Module& model, data::DataLoader& loader, int64_t& correct, int64_t& total) {
  NoGradGuard no_grad;
  model.eval();
  correct = total = 0;
  loader.start_epoch(0);
  while (auto batch = loader.next()) {
    correct += count_correct(model(batch->images), batch->labels);
    total += batch->size();
  }
  model.train();
  return total > 0 ? static_cast<double>(correct) / static_cast<double>(total) : 0.0;
}

int run(const Flags& flags) {
  if (flags.threads > 0) set_num_threads(flags.threads);
  Device device = resolve_device(flags.device);
  LOOM_CHECK(device.is_cpu(), "--device ", device.str(), ": the CUDA training path is not built yet; use --device cpu");
  const fs::path dir = resolve_data_dir(flags.data);
  data::TrainTestSplit split = data::load_mnist(dir);
  std::printf("Training on %s (%lld training, %lld test images) from %s\n", split.train.name().c_str(),
              static_cast<long long>(split.train.size()), static_cast<long long>(split.test.size()), dir.c_str());

  manual_seed(flags.seed);
  // The ResNets take 1-channel 28x28 images with the ImageNet stem (the ResNet-101 tutorial).
  std::shared_ptr<nn::Module> model_owner;
  if (flags.model == "convnet") {
    model_owner = std::make_shared<nn::ConvNet>();
  } else {
    model_owner = nn::make_resnet(flags.model, nn::ResNetOptions().num_classes(10).in_channels(1));
  }
  nn::Module& model = *model_owner;
  // apex's amp.initialize: the model in the level's dtypes (--amp O2: f16 but
  // batch norm) and the optimizer over what it must step (f32 master weights
  // at O2 / O3 / bf16).
  const amp::OptLevel amp_level = amp::parse_opt_level(flags.amp);
  std::unique_ptr<amp::MixedPrecisionOptimizer> optimizer = amp::initialize(
      model,
      [&](std::vector<Tensor> parameters) -> std::unique_ptr<optim::Optimizer> {
        if (flags.optimizer == "sgd") {
          return std::make_unique<optim::SGD>(std::move(parameters), optim::SGDOptions(flags.lr).momentum(flags.momentum));
        }
        return std::make_unique<optim::Adam>(std::move(parameters), optim::AdamOptions(flags.lr));
      },
      amp_level);
  const data::Compose transforms({data::ToTensor{}, data::mnist_normalize()});
  data::DataLoader train_loader(split.train, transforms,
                                data::DataLoaderOptions().batch_size(flags.batch_size).num_workers(flags.workers).seed(flags.seed).dtype(amp::input_dtype(amp_level)),
                                std::make_shared<data::RandomSampler>(split.train.size(), flags.seed));
  data::DataLoader test_loader(split.test, transforms, data::DataLoaderOptions().batch_size(500).num_workers(flags.workers).dtype(amp::input_dtype(amp_level)));

  const int64_t steps_per_epoch = train_loader.num_batches();
  const auto start = std::chrono::steady_clock::now();
  int64_t steps = 0;
  for (int epoch = 0; epoch < flags.epochs; ++epoch) {
    train_loader.start_epoch(epoch);
    int64_t step = 0;
    while (auto batch = train_loader.next()) {
      Tensor loss;
      {
        auto autocast = optimizer->autocast();  // the loss in f32; --amp O1: f16 convolutions
        loss = cross_entropy(model(batch->images), batch->labels);
      }
      optimizer->zero_grad();
      optimizer->scale_loss(loss).backward();
      optimizer->step();  // unscales the (averaged) gradients; skips the step on inf / NaN
      ++step;
      ++steps;
      if (step % flags.log_interval == 0) {
        std::printf("Epoch [%d/%d], Step [%lld/%lld], Loss: %.4f\n", epoch + 1, flags.epochs,
                    static_cast<long long>(step), static_cast<long long>(steps_per_epoch), loss.item());
        std::fflush(stdout);
      }
      if (flags.max_steps > 0 && steps >= flags.max_steps) break;
    }
    if (flags.max_steps > 0 && steps >= flags.max_steps) break;
  }
  const auto elapsed = std::chrono::steady_clock::now() - start;
  std::printf("Training complete in: %s\n", apps::format_duration(elapsed).c_str());
  if (optimizer->scaler().enabled()) {
    std::printf("Mixed precision --amp %s: loss scale %g, %lld steps skipped for inf / NaN gradients\n",
                flags.amp.c_str(), optimizer->scaler().get_scale(),
                static_cast<long long>(optimizer->scaler().skipped_steps()));
  }
  const double seconds = std::chrono::duration<double>(elapsed).count();
  std::printf("Throughput: %.1f images/s, time waiting for data: %.3f s\n",
              seconds > 0 ? static_cast<double>(steps * flags.batch_size) / seconds : 0.0,
              train_loader.total_wait_seconds());

  int64_t correct = 0, total = 0;
  auto autocast = optimizer->autocast();  // evaluate as trained
  const double accuracy = evaluate(model, test_loader, correct, total);
  std::printf("Test accuracy: %.4f (%lld/%lld)\n", accuracy, static_cast<long long>(correct),
              static_cast<long long>(total));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train the tutorials' ConvNet on MNIST / Fashion-MNIST with loom"};
  Flags flags;
  app.add_option("--epochs", flags.epochs, "number of epochs")->capture_default_str()->check(apps::whole_at_least(0));
  app.add_option("--batch-size", flags.batch_size, "images per step")->capture_default_str()->check(apps::whole_at_least(1));
  app.add_option("--lr", flags.lr, "learning rate")->capture_default_str()->check(apps::at_least(0));
  app.add_option("--momentum", flags.momentum, "SGD momentum")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  app.add_option("--model", flags.model, "convnet, resnet18, resnet50 or resnet101")->capture_default_str()->check(CLI::IsMember({"convnet", "resnet18", "resnet34", "resnet50", "resnet101", "resnet152"}));
  app.add_option("--optimizer", flags.optimizer, "sgd or adam")->capture_default_str()->check(CLI::IsMember({"sgd", "adam"}));
  app.add_option("--data", flags.data, "directory with the IDX files (default ./data/MNIST/raw, else /usr/share/datasets/fashion-mnist)");
  app.add_option("--seed", flags.seed, "random seed")->capture_default_str();
  app.add_option("--threads", flags.threads, "CPU threads (0 = all cores)")->capture_default_str()->check(apps::whole_at_least(0));
  app.add_option("--workers", flags.workers, "data loader threads (0 = load in the training thread)")->capture_default_str()->check(apps::whole_at_least(0));
  app.add_option("--log-interval", flags.log_interval, "steps between loss lines")->capture_default_str()->check(apps::whole_at_least(1));
  app.add_option("--device", flags.device, "cpu, cuda, cuda:N or auto")->capture_default_str();
  app.add_option("--max-steps", flags.max_steps, "stop after this many steps (0 = full epochs)")->capture_default_str()->check(apps::whole_at_least(0));
  app.add_option("--amp", flags.amp, "mixed precision, apex's opt levels: O0 (f32), O1 (f16 convolutions, f32 weights), O2 (f16 weights but batch norm, f32 masters, loss scaling), O3 (pure f16), bf16 (bf16 weights, f32 masters)")->capture_default_str()->check(CLI::IsMember({"O0", "O1", "O2", "O3", "bf16"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "train_mnist: %s\n", e.what());
    return 2;
  }
  try {
    return run(flags);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_mnist: %s\n", e.what());
    return 1;
  }
}
