// Convergence: the tutorials' ConvNet trained for 150 steps of 64 images on
// Fashion-MNIST with the same seed, data order and SGD at O0 (f32), O2 (f16
// with f32 masters and dynamic loss scaling) and bf16 reaches a test accuracy
// (on 2000 test images) within 2 points of f32. The full two-epoch comparison
// is train_mnist --amp O0 / O2 / bf16. Skipped when the dataset is not installed.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <filesystem>

#include <loom/core/autograd.h>
#include <loom/core/generator.h>
#include <loom/core/parallel.h>
#include <loom/data/idx.h>
#include <loom/data/loader.h>
#include <loom/data/sampler.h>
#include <loom/nn/convnet.h>
#include <loom/ops/loss.h>
#include "tests/amp/helpers.h"

using namespace loom;

namespace {

constexpr const char* kFashionMnist = "/usr/share/datasets/fashion-mnist";
constexpr int64_t kSteps = 150, kBatch = 64, kTestImages = 2000;

struct Result {
  double accuracy = 0;
  int64_t skipped = 0;
  double seconds = 0;
};

Result train_and_evaluate(const data::TrainTestSplit& split, amp::OptLevel level) {
  const auto start = std::chrono::steady_clock::now();
  manual_seed(0);
  nn::ConvNet model;
  auto optimizer = amp::initialize(model, amp_test::sgd(0.02), level);
  const DType input = amp::input_dtype(level);
  const data::Compose transforms({data::ToTensor{}, data::mnist_normalize()});
  data::DataLoader train_loader(split.train, transforms, data::DataLoaderOptions().batch_size(kBatch).dtype(input).seed(0),
                                std::make_shared<data::RandomSampler>(split.train.size(), 0));
  train_loader.start_epoch(0);
  for (int64_t step = 0; step < kSteps; ++step) {
    auto batch = train_loader.next();
    REQUIRE(batch);
    amp_test::train_step(model, *optimizer, batch->images, batch->labels);
  }
  train_loader.stop();

  data::DataLoader test_loader(split.test.subset(kTestImages), transforms,
                               data::DataLoaderOptions().batch_size(500).dtype(input));
  NoGradGuard no_grad;
  model.eval();
  auto autocast = optimizer->autocast();
  int64_t correct = 0, total = 0;
  test_loader.start_epoch(0);
  while (auto batch = test_loader.next()) {
    correct += count_correct(model(batch->images), batch->labels);
    total += batch->size();
  }
  Result result;
  result.accuracy = static_cast<double>(correct) / static_cast<double>(total);
  result.skipped = optimizer->scaler().skipped_steps();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace

TEST_SUITE("convergence") {
  TEST_CASE("ConvNet on Fashion-MNIST: O2 and bf16 within 2 points of f32 after 150 steps") {
    if (!std::filesystem::is_directory(kFashionMnist)) {
      MESSAGE("skipped: ", kFashionMnist, " is not installed (apt-get install dataset-fashion-mnist)");
      return;
    }
    // One thread: the sums, and so the accuracies, are the same on every machine.
    const int threads = get_num_threads();
    set_num_threads(1);
    struct RestoreThreads {
      int threads;
      ~RestoreThreads() { set_num_threads(threads); }
    } restore{threads};
    const data::TrainTestSplit split = data::load_mnist(kFashionMnist);
    const Result f32 = train_and_evaluate(split, amp::OptLevel::O0);
    MESSAGE("O0 accuracy ", f32.accuracy, " in ", f32.seconds, " s");
    CHECK(f32.accuracy > 0.70);  // the run learned something: the comparison means something
    for (amp::OptLevel level : {amp::OptLevel::O2, amp::OptLevel::bf16}) {
      const Result r = train_and_evaluate(split, level);
      MESSAGE(std::string(amp::opt_level_name(level)), " accuracy ", r.accuracy, " (", r.skipped, " steps skipped) in ", r.seconds, " s");
      CHECK_MESSAGE(std::abs(r.accuracy - f32.accuracy) <= 0.02, std::string(amp::opt_level_name(level)), " ", r.accuracy, " vs O0 ",
                    f32.accuracy);
    }
  }
}
