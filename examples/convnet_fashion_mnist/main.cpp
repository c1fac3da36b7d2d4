// The smallest complete loom program: the PyTorch tutorials' ConvNet trained
// on Fashion-MNIST with SGD for one epoch, then its test accuracy.
//   convnet_fashion_mnist [DATA_DIR] [MAX_STEPS]
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>

#include <loom/loom.h>

int main(int argc, char** argv) try {
  const char* dir = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";  // Debian's dataset-fashion-mnist
  const long max_steps = argc > 2 ? std::atol(argv[2]) : 0;                      // 0: the whole epoch
  const loom::data::TrainTestSplit data = loom::data::load_mnist(dir);  // the four IDX files, gzipped or not

  loom::manual_seed(0);
  loom::nn::ConvNet model;  // 2 x (conv 5x5, batch norm, ReLU, max pool), linear
  loom::optim::SGD sgd(model.parameters(), loom::optim::SGDOptions(0.01).momentum(0.9));
  const loom::data::Compose transforms({loom::data::ToTensor{}, loom::data::mnist_normalize()});
  loom::data::DataLoader train(data.train, transforms, loom::data::DataLoaderOptions().batch_size(100),
                               std::make_shared<loom::data::RandomSampler>(data.train.size()));
  long step = 0;
  for (loom::data::Batch& batch : train.epoch(0)) {  // images (100, 1, 28, 28) f32, labels (100) i64
    loom::Tensor loss = loom::cross_entropy(model(batch.images), batch.labels);
    sgd.zero_grad();
    loss.backward();
    sgd.step();
    if (++step % 100 == 0) std::printf("step %ld, loss %.4f\n", step, loss.item());
    if (step == max_steps) break;
  }

  loom::NoGradGuard no_grad;
  model.eval();
  loom::data::DataLoader test(data.test, transforms, loom::data::DataLoaderOptions().batch_size(500));
  int64_t correct = 0;
  for (loom::data::Batch& batch : test.epoch(0)) correct += loom::count_correct(model(batch.images), batch.labels);
  std::printf("test accuracy after %ld steps: %.4f\n", step, static_cast<double>(correct) / data.test.size());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "convnet_fashion_mnist: %s\n", e.what());
  return 1;
}
