// Data pipeline throughput: decode + augment + collate in images/s, for
// CIFAR-10-shaped data (RandomCrop(32, 4) + flip + normalize) and
// Fashion-MNIST (ToTensor + normalize), in the calling thread and through the
// DataLoader with 1 and 2 workers. Validates every batch's values once before
// timing, then prints one JSON line per measurement.
//   bench_data [--cifar-dir DIR] [--mnist-dir DIR] [--workers 1,2] [--repeats 3]
//   bench_data --write-synthetic-cifar DIR   (the data the torchvision peer reads)
#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <loom/core/error.h>
#include <loom/data/cifar10.h>
#include <loom/data/idx.h>
#include <loom/data/loader.h>

using namespace loom;
using namespace loom::data;

namespace {

using Clock = std::chrono::steady_clock;

struct Workload {
  std::string dataset;
  std::string transforms;
  ImageDataset images;
  Compose compose;
  std::vector<double> mean, stddev;
};

// Every value must be finite and inside [(0 - mean) / std, (1 - mean) / std]
// of its channel; every label in 0..9; every sample visited once.
void validate(const Workload& work, int64_t batch_size) {
  DataLoader loader(work.images, work.compose, DataLoaderOptions().batch_size(batch_size).num_workers(2),
                    std::make_shared<RandomSampler>(work.images.size(), 1));
  int64_t samples = 0;
  for (Batch& batch : loader.epoch(0)) {
    const int64_t B = batch.size(), C = batch.images.size(1), plane = batch.images.size(2) * batch.images.size(3);
    const float* values = batch.images.data<float>();
    for (int64_t s = 0; s < B; ++s) {
      for (int64_t c = 0; c < C; ++c) {
        const double low = (0.0 - work.mean[c]) / work.stddev[c], high = (1.0 - work.mean[c]) / work.stddev[c];
        for (int64_t k = 0; k < plane; ++k) {
          const float v = values[(s * C + c) * plane + k];
          if (!std::isfinite(v) || v < low - 1e-5 || v > high + 1e-5) {
            LOOM_FAIL(work.dataset, ": value ", v, " of channel ", c, " is outside [", low, ", ", high, "]");
          }
        }
      }
      const int64_t label = batch.labels.data<int64_t>()[s];
      if (label < 0 || label > 9) LOOM_FAIL(work.dataset, ": label ", label, " outside 0..9");
    }
    samples += B;
  }
  if (samples != work.images.size()) LOOM_FAIL(work.dataset, ": an epoch gave ", samples, " samples");
}

void report(const Workload& work, const char* mode, int64_t workers, int64_t batch_size, double seconds,
            double wait_seconds) {
  const double images_per_s = static_cast<double>(work.images.size()) / seconds;
  const double per_thread = images_per_s / static_cast<double>(std::max<int64_t>(workers, 1));
  std::printf(
      "{\"benchmark\": \"data_pipeline\", \"framework\": \"loom\", \"dataset\": \"%s\", \"transforms\": \"%s\", "
      "\"mode\": \"%s\", \"workers\": %lld, \"batch_size\": %lld, \"images\": %lld, \"seconds\": %.4f, "
      "\"images_per_s\": %.0f, \"images_per_s_per_worker\": %.0f, \"consumer_wait_s\": %.4f}\n",
      work.dataset.c_str(), work.transforms.c_str(), mode, static_cast<long long>(workers),
      static_cast<long long>(batch_size), static_cast<long long>(work.images.size()), seconds, images_per_s,
      per_thread, wait_seconds);
  std::fflush(stdout);
}

// The fused collate alone, in this thread: the per-core figure.
void bench_inline(const Workload& work, int64_t batch_size, int repeats) {
  const FusedTransform transform(work.compose, work.images.channels(), work.images.height(), work.images.width());
  const std::vector<int64_t> order = RandomSampler(work.images.size(), 2).indices();
  const DataLoaderOptions options = DataLoaderOptions().batch_size(batch_size);
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const Clock::time_point start = Clock::now();
    for (int64_t begin = 0, b = 0; begin < work.images.size(); begin += batch_size, ++b) {
      const int64_t count = std::min(batch_size, work.images.size() - begin);
      Batch batch = build_batch(work.images, transform, options, r, order.data() + begin, count, b);
    }
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  report(work, "inline", 1, batch_size, best, 0.0);
}

// Full epochs through the DataLoader; the consumer only takes the batches.
void bench_loader(const Workload& work, int64_t workers, int64_t batch_size, int repeats) {
  DataLoader loader(work.images, work.compose, DataLoaderOptions().batch_size(batch_size).num_workers(workers),
                    std::make_shared<RandomSampler>(work.images.size(), 3));
  double best = 1e30, wait = 0.0;
  for (int r = 0; r < repeats; ++r) {
    loader.reset_wait_total();
    const Clock::time_point start = Clock::now();
    int64_t samples = 0;
    for (Batch& batch : loader.epoch(r)) samples += batch.size();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (samples != work.images.size()) LOOM_FAIL("epoch gave ", samples, " samples");
    if (seconds < best) {
      best = seconds;
      wait = loader.total_wait_seconds();
    }
  }
  report(work, "loader", workers, batch_size, best, wait);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loom data pipeline throughput"};
  std::string cifar_dir, mnist_dir = "/usr/share/datasets/fashion-mnist", write_dir;
  int64_t images = 50000, batch_size = 128;
  int repeats = 3;
  std::vector<int64_t> worker_counts = {1, 2};
  app.add_option("--cifar-dir", cifar_dir, "CIFAR-10 binary directory (default: synthetic data)");
  app.add_option("--mnist-dir", mnist_dir, "Fashion-MNIST / MNIST IDX directory ('' to skip)");
  app.add_option("--images", images, "synthetic CIFAR-10 images")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", batch_size)->check(CLI::PositiveNumber);
  app.add_option("--repeats", repeats, "epochs per measurement; the fastest is reported")->check(CLI::PositiveNumber);
  app.add_option("--workers", worker_counts, "loader worker counts")->delimiter(',');
  app.add_option("--write-synthetic-cifar", write_dir, "write synthetic CIFAR-10 batch files here and exit");
  CLI11_PARSE(app, argc, argv);
  try {
    if (!write_dir.empty()) {
      write_cifar10_directory(write_dir, synthetic_cifar10(images, 0), synthetic_cifar10(images / 5, 1));
      return 0;
    }
    std::vector<Workload> workloads;
    const std::vector<double> cifar_mean(cifar10_mean.begin(), cifar10_mean.end());
    const std::vector<double> cifar_std(cifar10_std.begin(), cifar10_std.end());
    workloads.push_back({cifar_dir.empty() ? "cifar10-synthetic" : "cifar10",
                         "RandomCrop(32,4)+RandomHorizontalFlip+ToTensor+Normalize",
                         cifar_dir.empty() ? synthetic_cifar10(images, 0) : load_cifar10(cifar_dir).train,
                         Compose({RandomCrop(32, 4), RandomHorizontalFlip{}, ToTensor{}, cifar10_normalize()}),
                         cifar_mean, cifar_std});
    if (!mnist_dir.empty()) {
      workloads.push_back({"fashion-mnist", "ToTensor+Normalize", load_mnist(mnist_dir).train,
                           Compose({ToTensor{}, mnist_normalize()}), {mnist_mean[0]}, {mnist_std[0]}});
    }
    for (const Workload& work : workloads) {
      validate(work, batch_size);
      bench_inline(work, batch_size, repeats);
      for (int64_t workers : worker_counts) bench_loader(work, workers, batch_size, repeats);
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "bench_data: %s\n", error.what());
    return 1;
  }
  return 0;
}
