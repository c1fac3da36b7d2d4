// A model and a dataset of one's own, trained with DistributedDataParallel
// through loom::train's Trainer: every process trains a copy of the model on
// its share of each epoch, gradients are averaged during backward, rank 0
// writes a checkpoint at each epoch's end, SIGTERM / SIGUSR1 stop every
// process after the same step with a checkpoint, and a restarted job resumes
// from the newest one. Started by a launcher, which gives each process its
// RANK, WORLD_SIZE and rendezvous:
//   loomrun --standalone --nproc_per_node=2 --max_restarts=3 ./ddp_own_model [EPOCHS] [CHECKPOINT_DIR]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include <loom/loom.h>

using namespace loom;

// The model: a perceptron with one hidden layer, Linear -> ReLU -> Linear.
class TwoLayerNet : public nn::Module {
 public:
  TwoLayerNet(int64_t inputs, int64_t hidden, int64_t classes) {
    register_module("fc1", fc1_, std::make_shared<nn::Linear>(inputs, hidden));
    register_module("fc2", fc2_, std::make_shared<nn::Linear>(hidden, classes));
  }
  // x: (n, inputs, 1, 1) as the loader delivers samples of shape (inputs, 1, 1).
  Tensor forward(const Tensor& x) override { return (*fc2_)(relu((*fc1_)(x.flatten(1)))); }
  std::string type_name() const override { return "TwoLayerNet"; }

 private:
  std::shared_ptr<nn::Linear> fc1_, fc2_;
};

// The dataset: points in the disc of radius 3, labelled by the ring they fall
// in (radius 0-1, 1-2, 2-3). Point i is drawn from its own seed, so every
// process sees the same data set.
class Rings : public data::Dataset {
 public:
  Rings(int64_t size, uint64_t seed) : size_(size), seed_(seed) {}
  int64_t size() const override { return size_; }
  data::SampleShape sample_shape() const override { return {2, 1, 1}; }
  int64_t get(int64_t index, data::SampleSlot& slot) const override {
    Generator generator(seed_ * 1000003 + static_cast<uint64_t>(index));
    const double radius = 3 * std::sqrt(generator.uniform()), angle = 2 * std::numbers::pi * generator.uniform();
    slot.pixels[0] = static_cast<float>(radius * std::cos(angle));
    slot.pixels[1] = static_cast<float>(radius * std::sin(angle));
    return static_cast<int64_t>(radius);
  }

 private:
  int64_t size_;
  uint64_t seed_;
};

int main(int argc, char** argv) try {
  const int epochs = argc > 1 ? std::atoi(argv[1]) : 10;
  const std::string checkpoint_dir = argc > 2 ? argv[2] : "checkpoint";
  // RANK and WORLD_SIZE from the launcher; CPU processes meet over shared memory on one host, else Gloo.
  const dist::LaunchEnvironment launch = dist::resolve_launch_environment();
  auto options = dist::InitOptions().backend(dist::Backend::automatic);
  auto group = launch.world_size > 1 ? dist::init_process_group(options) : nullptr;
  manual_seed(0);
  auto model = std::make_shared<TwoLayerNet>(2, 64, 3);
  auto make_sgd = [](std::vector<Tensor> parameters) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::SGD>(std::move(parameters), optim::SGDOptions(0.05).momentum(0.9));
  };
  // 32 points per process and step; every process its share of each epoch's shuffle, and of the test set.
  auto train_set = std::make_shared<Rings>(4096, 1), test_set = std::make_shared<Rings>(1024, 2);
  data::DataLoader train_data(train_set, data::DataLoaderOptions().batch_size(32),
                              std::make_shared<data::DistributedSampler>(train_set->size(), launch.world_size,
                                                                         launch.rank, /*shuffle=*/true, /*seed=*/0));
  data::DataLoader test_data(test_set, data::DataLoaderOptions().batch_size(256),
                             std::make_shared<data::ShardSampler>(test_set->size(), launch.world_size, launch.rank));

  train::Trainer trainer(model, amp::initialize(*model, make_sgd, amp::OptLevel::O0),
                         train::TrainerOptions()
                             .epochs(epochs)
                             .process_group(group)  // DistributedDataParallel over it
                             .checkpoints(train::CheckpointOptions().directory(checkpoint_dir))
                             .log_interval(64));
  trainer.after_evaluation([&](const train::FitResult& result) {
    std::printf("%d processes, test accuracy %.4f\n", launch.world_size, result.accuracy->accuracy());
  });
  return trainer.fit(train_data, &test_data).exit_code();  // 128 + the signal when one stopped it
} catch (const std::exception& e) {
  std::fprintf(stderr, "ddp_own_model: %s\n", e.what());
  return 1;
}
