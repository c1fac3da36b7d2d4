// A model and a dataset of one's own, trained with DistributedDataParallel:
// every process trains a copy of the model on its share of each epoch, and
// backward returns with the gradients averaged over all processes. Started by
// a launcher, which gives each process its RANK, WORLD_SIZE and rendezvous:
//   loomrun --standalone --nproc_per_node=2 ./ddp_own_model [EPOCHS]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

#include <loom/loom.h>

// The model: a perceptron with one hidden layer, Linear -> ReLU -> Linear.
class TwoLayerNet : public loom::nn::Module {
 public:
  TwoLayerNet(int64_t inputs, int64_t hidden, int64_t classes) {
    register_module("fc1", fc1_, std::make_shared<loom::nn::Linear>(inputs, hidden));
    register_module("fc2", fc2_, std::make_shared<loom::nn::Linear>(hidden, classes));
  }
  loom::Tensor forward(const loom::Tensor& x) override { return (*fc2_)(loom::relu((*fc1_)(x))); }
  std::string type_name() const override { return "TwoLayerNet"; }

 private:
  std::shared_ptr<loom::nn::Linear> fc1_, fc2_;
};

// The dataset, held in memory: points in the disc of radius 3, labelled by
// the ring they fall in (radius 0-1, 1-2, 2-3). Every process builds the same
// one from the same seed.
struct Rings {
  std::vector<float> points;  // (size, 2)
  std::vector<int64_t> labels;

  Rings(int64_t size, uint64_t seed) {
    loom::Generator generator(seed);
    for (int64_t i = 0; i < size; ++i) {
      const double radius = 3 * std::sqrt(generator.uniform()), angle = 2 * std::numbers::pi * generator.uniform();
      points.push_back(static_cast<float>(radius * std::cos(angle)));
      points.push_back(static_cast<float>(radius * std::sin(angle)));
      labels.push_back(static_cast<int64_t>(radius));
    }
  }
  int64_t size() const { return static_cast<int64_t>(labels.size()); }

  // The samples at `indices`: points (n, 2) f32 and labels (n) i64.
  std::pair<loom::Tensor, loom::Tensor> batch(const std::vector<int64_t>& indices) const {
    std::vector<float> x;
    std::vector<int64_t> y;
    for (int64_t i : indices) {
      x.insert(x.end(), {points[2 * i], points[2 * i + 1]});
      y.push_back(labels[i]);
    }
    const int64_t n = static_cast<int64_t>(indices.size());
    return {loom::Tensor::from_vector(x, {n, 2}), loom::Tensor::from_vector(y, {n})};
  }
};

int main(int argc, char** argv) try {
  const int epochs = argc > 1 ? std::atoi(argv[1]) : 10;
  // RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the launcher; for CPU
  // processes "auto" picks shared memory when all are on this host, else Gloo.
  std::shared_ptr<loom::dist::ProcessGroup> group = loom::dist::init_process_group({.backend = "auto"});
  const int rank = group->rank(), world = group->size();

  const Rings train(4096, 1), test(1024, 2);
  loom::manual_seed(0);
  auto model = std::make_shared<TwoLayerNet>(2, 64, 3);
  loom::dist::DistributedDataParallel ddp(model, group);  // starts from rank 0's parameters
  loom::optim::SGD sgd(model->parameters(), loom::optim::SGDOptions(0.05).momentum(0.9));
  // This process's share of each epoch's shuffle, the same size on every process.
  loom::data::DistributedSampler sampler(train.size(), world, rank, /*shuffle=*/true, /*seed=*/0);
  const int64_t batch_size = 32;  // per process

  for (int epoch = 0; epoch < epochs; ++epoch) {
    sampler.set_epoch(epoch);
    const std::vector<int64_t> order = sampler.indices();
    double loss_sum = 0;
    int64_t steps = 0;
    for (size_t begin = 0; begin < order.size(); begin += batch_size) {
      const size_t end = std::min(order.size(), begin + batch_size);
      auto [points, labels] = train.batch({order.begin() + begin, order.begin() + end});
      loom::Tensor loss = loom::cross_entropy(ddp(points), labels);
      sgd.zero_grad();
      loss.backward();  // gradients averaged over the processes when it returns
      sgd.step();
      loss_sum += loss.item();
      ++steps;
    }
    if (rank == 0) std::printf("epoch %d: mean loss %.4f (rank 0)\n", epoch + 1, loss_sum / steps);
  }

  // Each process scores its shard of the test set; the counts are summed.
  loom::NoGradGuard no_grad;
  loom::dist::AccuracyCounts counts;
  loom::data::ShardSampler shard(test.size(), world, rank);
  auto [points, labels] = test.batch(shard.indices());
  counts.correct = loom::count_correct((*model)(points), labels);
  counts.total = labels.numel();
  counts = loom::dist::all_reduce_accuracy(counts, group.get());
  if (rank == 0) std::printf("%d processes, test accuracy %.4f\n", world, counts.accuracy());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "ddp_own_model: %s\n", e.what());
  return 1;
}
