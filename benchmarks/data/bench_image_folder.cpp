// ImageFolder throughput: JPEG/PNG decode + RandomResizedCrop(size) +
// RandomHorizontalFlip + ToTensor + Normalize, collated into f32 batches by
// the DataLoader with 1, 2, ... workers; images/s and images/s per worker
// thread (wall clock), and images per CPU-second of the worker threads
// (CLOCK_THREAD_CPUTIME_ID around each sample, so other load on the machine
// barely moves it). Validates one epoch's values and labels before timing,
// then prints one JSON line per worker count (run_image_folder.sh adds
// torchvision's peer).
//   bench_image_folder --folder DIR [--workers 1,2] [--size 224] [--batch-size 32] [--repeats 2]
#include <CLI/CLI.hpp>

#include <time.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <loom/core/error.h>
#include <loom/data/image_folder.h>
#include <loom/data/loader.h>

using namespace loom;
using namespace loom::data;

namespace {

using Clock = std::chrono::steady_clock;

int64_t thread_cpu_ns() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return int64_t{now.tv_sec} * 1000000000 + now.tv_nsec;
}

// The folder, with the CPU time its worker threads spend in get() (decode,
// transforms and the write into the batch slot) added up.
class TimedDataset : public Dataset {
 public:
  explicit TimedDataset(std::shared_ptr<const Dataset> inner) : inner_(std::move(inner)) {}
  int64_t size() const override { return inner_->size(); }
  SampleShape sample_shape() const override { return inner_->sample_shape(); }
  int64_t get(int64_t index, SampleSlot& slot) const override {
    const int64_t start = thread_cpu_ns();
    const int64_t label = inner_->get(index, slot);
    cpu_ns_ += thread_cpu_ns() - start;
    return label;
  }
  double take_cpu_seconds() const { return static_cast<double>(cpu_ns_.exchange(0)) * 1e-9; }

 private:
  std::shared_ptr<const Dataset> inner_;
  mutable std::atomic<int64_t> cpu_ns_{0};
};

// Every value finite and inside ImageNet's normalized [0, 1] range of its channel; labels in range; every image once.
void validate(const std::shared_ptr<const ImageFolder>& folder, int64_t batch_size) {
  const Normalize normalize = imagenet_normalize();
  DataLoader loader(folder, DataLoaderOptions().batch_size(batch_size).num_workers(2));
  int64_t samples = 0;
  for (Batch& batch : loader.epoch(0)) {
    const int64_t plane = batch.images.size(2) * batch.images.size(3);
    const float* values = batch.images.data<float>();
    for (int64_t s = 0; s < batch.size(); ++s) {
      for (int64_t c = 0; c < 3; ++c) {
        const double low = -normalize.mean[c] / normalize.std[c], high = (1 - normalize.mean[c]) / normalize.std[c];
        for (int64_t k = 0; k < plane; ++k) {
          const float v = values[(s * 3 + c) * plane + k];
          if (!std::isfinite(v) || v < low - 1e-5 || v > high + 1e-5) LOOM_FAIL("value ", v, " out of range");
        }
      }
      const int64_t label = batch.labels.data<int64_t>()[s];
      if (label < 0 || label >= static_cast<int64_t>(folder->classes().size())) LOOM_FAIL("label ", label);
    }
    samples += batch.size();
  }
  if (samples != folder->size()) LOOM_FAIL("an epoch gave ", samples, " of ", folder->size(), " images");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ImageFolder decode + RandomResizedCrop + flip + normalize throughput"};
  std::string folder_dir;
  std::vector<int64_t> workers = {1, 2};
  int64_t size = 224, batch_size = 32;
  int repeats = 2;
  app.add_option("--folder", folder_dir, "image folder: DIR/<class>/*.jpg|png")->required();
  app.add_option("--workers", workers, "worker counts")->delimiter(',');
  app.add_option("--size", size, "RandomResizedCrop size");
  app.add_option("--batch-size", batch_size, "images per batch");
  app.add_option("--repeats", repeats, "epochs per worker count (the best is reported)");
  CLI11_PARSE(app, argc, argv);
  try {
    auto folder = std::make_shared<const ImageFolder>(
        folder_dir, ImageFolderOptions().transforms(imagenet_train_transforms(size)));
    validate(folder, batch_size);
    const auto timed = std::make_shared<const TimedDataset>(folder);
    for (const int64_t count : workers) {
      DataLoader loader(timed, DataLoaderOptions().batch_size(batch_size).num_workers(count).seed(1));
      double best = 1e30, best_cpu = 1e30;
      for (int r = 0; r < repeats; ++r) {
        timed->take_cpu_seconds();
        const Clock::time_point start = Clock::now();
        int64_t samples = 0;
        for (Batch& batch : loader.epoch(r + 1)) samples += batch.size();
        if (samples != folder->size()) LOOM_FAIL("epoch gave ", samples, " images");
        best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
        best_cpu = std::min(best_cpu, timed->take_cpu_seconds());
      }
      const double images_per_s = static_cast<double>(folder->size()) / best;
      std::printf(
          "{\"benchmark\": \"image_folder\", \"framework\": \"loom\", \"transforms\": \"RandomResizedCrop(%lld) + "
          "flip + normalize\", \"workers\": %lld, \"batch_size\": %lld, \"images\": %lld, \"seconds\": %.4f, "
          "\"images_per_s\": %.1f, \"images_per_s_per_worker\": %.1f, \"worker_cpu_seconds\": %.4f, "
          "\"images_per_cpu_s\": %.1f}\n",
          static_cast<long long>(size), static_cast<long long>(count), static_cast<long long>(batch_size),
          static_cast<long long>(folder->size()), best, images_per_s, images_per_s / static_cast<double>(count),
          best_cpu, static_cast<double>(folder->size()) / best_cpu);
      std::fflush(stdout);
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "bench_image_folder: %s\n", error.what());
    return 1;
  }
  return 0;
}
