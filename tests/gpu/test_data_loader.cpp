// The DataLoader's CUDA path: batches staged in pinned memory, copied on the
// loader's stream and handed over with an event equal the CPU loader's
// batches byte for byte; the copies run while a kernel occupies the compute
// stream; a worker exception and a stop mid-epoch still work.
#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <loom/core/cuda/runtime.h>
#include <loom/core/error.h>
#include <loom/data/cifar10.h>
#include <loom/data/loader.h>
#include "tests/gpu/compare.h"
#include "tests/gpu/spin_kernel.h"

using namespace loom;
using namespace loom::data;
using loom::gpu_testing::kCuda;

namespace {

using Clock = std::chrono::steady_clock;

Compose cifar_training_transforms() {
  return Compose({RandomCrop(32, 4), RandomHorizontalFlip{}, ToTensor{}, cifar10_normalize()});
}

// The bytes of `t`'s whole storage (CPU or CUDA), so that layouts such as
// channels-last are compared as stored.
std::vector<uint8_t> storage_bytes(const Tensor& t) {
  std::vector<uint8_t> bytes(t.storage()->nbytes());
  if (t.device().is_cpu()) {
    std::memcpy(bytes.data(), t.storage()->data(), bytes.size());
  } else {
    cuda::current_stream(t.device().index).synchronize();  // the copy was ordered before this stream's work
    cuda::copy_bytes(bytes.data(), false, t.storage()->data(), true, bytes.size(), t.device().index);
  }
  return bytes;
}

// Checks that `got` (on the GPU) is `want` (the CPU loader's batch): geometry, dtype and bytes.
void check_same_batch(const Batch& got, const Batch& want) {
  REQUIRE(got.index == want.index);
  CHECK(got.images.device() == kCuda);
  CHECK(got.labels.device() == kCuda);
  REQUIRE(got.copied != nullptr);
  CHECK(got.images.dtype() == want.images.dtype());
  CHECK(got.images.sizes() == want.images.sizes());
  CHECK(got.images.strides() == want.images.strides());
  CHECK(got.images.offset() == want.images.offset());
  CHECK(storage_bytes(got.images) == storage_bytes(want.images));
  CHECK(storage_bytes(got.labels) == storage_bytes(want.labels));
}

struct Layout {
  DType dtype;
  MemoryFormat format;
};

}  // namespace

TEST_SUITE("data_loader") {

TEST_CASE("CUDA batches from pinned staging equal the CPU loader's, for 0 and 2 workers over two epochs") {
  const ImageDataset dataset = synthetic_cifar10(300, 11);
  for (const Layout layout : {Layout{DType::f32, MemoryFormat::nchw}, Layout{DType::f16, MemoryFormat::nhwc},
                              Layout{DType::bf16, MemoryFormat::nchw}}) {
    for (const int64_t workers : {0, 2}) {
      CAPTURE(dtype_name(layout.dtype));
      CAPTURE(static_cast<int>(layout.format));
      CAPTURE(workers);
      const DataLoaderOptions base = DataLoaderOptions()
                                         .batch_size(32)
                                         .num_workers(workers)
                                         .seed(5)
                                         .dtype(layout.dtype)
                                         .memory_format(layout.format);
      DataLoader cpu_loader(dataset, cifar_training_transforms(), base);
      DataLoader gpu_loader(dataset, cifar_training_transforms(), DataLoaderOptions(base).pin_memory(true).device(kCuda));
      for (const int64_t epoch : {0, 1}) {
        cpu_loader.start_epoch(epoch);
        gpu_loader.start_epoch(epoch);
        int64_t batches = 0;
        while (std::optional<Batch> want = cpu_loader.next()) {
          std::optional<Batch> got = gpu_loader.next();
          REQUIRE(got.has_value());
          check_same_batch(*got, *want);
          ++batches;
        }
        CHECK_FALSE(gpu_loader.next().has_value());
        CHECK(batches == 10);  // 9 of 32 and one of 12
      }
    }
  }
}

TEST_CASE("with pin_memory and a CUDA device the workers collate into pinned host memory") {
  const ImageDataset dataset = synthetic_cifar10(16, 12);
  const DataLoaderOptions options = DataLoaderOptions().batch_size(16).pin_memory(true).device(kCuda);
  const FusedTransform transform(cifar_training_transforms(), 3, 32, 32);
  std::vector<int64_t> order(16);
  for (int64_t i = 0; i < 16; ++i) order[static_cast<size_t>(i)] = i;
  const Batch host = build_batch(dataset, transform, options, 0, order.data(), 16, 0);
  CHECK(host.images.device().is_cpu());
  CHECK(cuda::is_pinned(host.images.raw_data()));
  CHECK(cuda::is_pinned(host.labels.raw_data()));
  const Batch pageable = build_batch(dataset, transform, DataLoaderOptions(options).pin_memory(false), 0,
                                     order.data(), 16, 0);
  CHECK_FALSE(cuda::is_pinned(pageable.images.raw_data()));
}

TEST_CASE("the loader's copies complete while a kernel occupies the compute stream; next() does not block on it") {
  const ImageDataset dataset = synthetic_cifar10(512, 13);
  const DataLoaderOptions base = DataLoaderOptions().batch_size(64).num_workers(2).seed(7);
  DataLoader cpu_loader(dataset, cifar_training_transforms(), base);
  DataLoader gpu_loader(dataset, cifar_training_transforms(), DataLoaderOptions(base).pin_memory(true).device(kCuda));
  cuda::Stream compute(0);
  cuda::StreamGuard guard(compute);  // the "training" stream: next() orders it after each copy
  cpu_loader.start_epoch(0);
  gpu_loader.start_epoch(0);
  check_same_batch(*gpu_loader.next(), *cpu_loader.next());  // warm up: CUDA context, pinned blocks, allocator
  compute.synchronize();

  constexpr uint64_t kSpinNs = 2'000'000'000;  // 2 s of kernel on the compute stream
  const Clock::time_point start = Clock::now();
  gpu_testing::spin_on_stream(compute, kSpinNs);
  // The rest of the epoch: 7 batches, more than the prefetch window of 4, so
  // at least 3 of them are built and copied only after the kernel started.
  std::vector<Batch> batches;
  while (std::optional<Batch> batch = gpu_loader.next()) batches.push_back(std::move(*batch));
  const double next_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  CAPTURE(next_seconds);
  CHECK(batches.size() == 7);
  CHECK(next_seconds < 1.0);  // next() did not wait for the compute stream (no host synchronize)

  // Every batch's copy finishes on the loader's stream while the kernel still runs.
  bool all_copied = false;
  while (!all_copied && std::chrono::duration<double>(Clock::now() - start).count() < 1.5) {
    all_copied = true;
    for (const Batch& batch : batches) all_copied = all_copied && batch.copied->query();
    if (!all_copied) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const bool kernel_running = !compute.query();
  const double copied_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  CAPTURE(copied_seconds);
  CHECK(all_copied);
  CHECK(kernel_running);
  compute.synchronize();
  for (const Batch& batch : batches) check_same_batch(batch, *cpu_loader.next());
}

TEST_CASE("a worker exception and a stop mid-epoch on the CUDA path") {
  const ImageDataset dataset = synthetic_cifar10(128, 14);
  auto failing = [](Batch& batch) {
    if (batch.index == 3) throw Error("disk on fire while reading batch 3");
  };
  for (const int64_t workers : {0, 2}) {
    CAPTURE(workers);
    DataLoader loader(dataset, cifar_training_transforms(),
                      DataLoaderOptions().batch_size(8).num_workers(workers).pin_memory(true).device(kCuda).batch_transform(
                          failing));
    loader.start_epoch(0);
    for (int b = 0; b < 3; ++b) REQUIRE(loader.next().has_value());
    std::string message;
    try {
      loader.next();
    } catch (const std::exception& error) {
      message = error.what();
    }
    CHECK(message.find("disk on fire while reading batch 3") != std::string::npos);
    CHECK_FALSE(loader.next().has_value());

    // Stop with copies in flight and batches in the prefetch window, then start again.
    DataLoader stopping(dataset, cifar_training_transforms(),
                        DataLoaderOptions().batch_size(8).num_workers(workers).pin_memory(true).device(kCuda));
    stopping.start_epoch(0);
    Batch kept = *stopping.next();
    stopping.stop();
    stopping.start_epoch(1);
    REQUIRE(stopping.next().has_value());
    CHECK(storage_bytes(kept.labels).size() == 8 * sizeof(int64_t));
  }
  cuda::synchronize(0);
}

}  // TEST_SUITE
