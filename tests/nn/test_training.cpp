// The ConvNet learns: a few hundred SGD steps on a Fashion-MNIST subset drive
// the loss down and the test accuracy far above chance (10%).
#include <doctest/doctest.h>

#include <filesystem>

#include <loom/core/autograd.h>
#include <loom/core/generator.h>
#include <loom/data/idx.h>
#include <loom/data/loader.h>
#include <loom/nn/convnet.h>
#include <loom/ops/loss.h>
#include <loom/optim/optimizer.h>

using namespace loom;

TEST_CASE("ConvNet trains on a Fashion-MNIST subset") {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  REQUIRE_MESSAGE(std::filesystem::is_directory(dir), dir, " is missing: apt-get install dataset-fashion-mnist");
  data::TrainTestSplit split = data::load_mnist(dir);
  const data::Compose transforms({data::ToTensor{}, data::mnist_normalize()});
  manual_seed(0);
  nn::ConvNet model;
  optim::SGD optimizer(model.parameters(), optim::SGDOptions(0.01).momentum(0.9));
  data::DataLoader train(split.train.subset(10000), transforms, data::DataLoaderOptions().batch_size(50).num_workers(1),
                         std::make_shared<data::RandomSampler>(10000, 0));

  std::vector<double> losses;
  train.start_epoch(0);
  while (auto batch = train.next()) {
    Tensor loss = cross_entropy(model(batch->images), batch->labels);
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
    losses.push_back(loss.item());
    if (losses.size() == 200) break;
  }
  REQUIRE(losses.size() == 200);
  double first = 0, last = 0;
  for (int i = 0; i < 20; ++i) {
    first += losses[i] / 20;
    last += losses[losses.size() - 1 - i] / 20;
  }
  INFO("mean loss over the first 20 steps ", first, ", over the last 20 ", last);
  CHECK(last < 0.6 * first);

  model.eval();
  NoGradGuard no_grad;
  data::DataLoader test(split.test.subset(2000), transforms, data::DataLoaderOptions().batch_size(500));
  int64_t correct = 0, total = 0;
  test.start_epoch(0);
  while (auto batch = test.next()) {
    correct += count_correct(model(batch->images), batch->labels);
    total += batch->size();
  }
  const double accuracy = static_cast<double>(correct) / static_cast<double>(total);
  INFO("test accuracy ", accuracy);
  CHECK(accuracy > 0.7);
}
