// DataLoader tests: batches identical for 0, 1 and 4 workers, order, layout
// and dtype options, wait-time accounting, shutdown mid-epoch without leaked
// threads, and worker exceptions reaching the training thread.
#include <doctest/doctest.h>

#include <algorithm>

#include <chrono>
#include <cstring>
#include <map>
#include <thread>

#include <loom/core/cuda/runtime.h>
#include <loom/data/cifar10.h>
#include <loom/data/loader.h>
#include "tests/data/helpers.h"

using namespace loom::data;
using namespace loom::data::testing;
using loom::DType;
using loom::Tensor;

namespace {

Compose cifar_training_transforms() {
  return Compose({RandomCrop(32, 4), RandomHorizontalFlip{}, ToTensor{}, cifar10_normalize()});
}

// Every batch of one epoch: images as raw bytes, labels as values.
struct EpochRecord {
  std::vector<std::vector<uint8_t>> images;
  std::vector<std::vector<int64_t>> labels;
};

EpochRecord record_epoch(DataLoader& loader, int64_t epoch) {
  EpochRecord record;
  int64_t expected_index = 0;
  for (Batch& batch : loader.epoch(epoch)) {
    REQUIRE(batch.index == expected_index++);
    const Tensor images = batch.images.contiguous();
    const auto* bytes = static_cast<const uint8_t*>(images.raw_data());
    record.images.emplace_back(bytes, bytes + images.nbytes());
    record.labels.push_back(batch.labels.to_vector<int64_t>());
  }
  return record;
}

}  // namespace

TEST_CASE("batches are bit-identical with 0, 1 and 4 workers, in sampler order") {
  const ImageDataset dataset = synthetic_cifar10(300, 1);
  std::vector<EpochRecord> records;
  for (int64_t workers : {0, 1, 4}) {
    auto sampler = std::make_shared<RandomSampler>(dataset.size(), 9);
    DataLoader loader(dataset, cifar_training_transforms(),
                      DataLoaderOptions().batch_size(32).num_workers(workers).seed(3), sampler);
    CHECK(loader.num_batches() == 10);
    for (int64_t epoch : {0, 1}) {
      records.push_back(record_epoch(loader, epoch));
      const EpochRecord& record = records.back();
      REQUIRE(record.images.size() == 10);
      CHECK(record.labels.back().size() == 300 - 9 * 32);  // the last batch is partial
      // Labels follow the sampler's order for this epoch.
      sampler->set_epoch(epoch);
      const std::vector<int64_t> order = sampler->indices();
      for (size_t b = 0; b < record.labels.size(); ++b)
        for (size_t s = 0; s < record.labels[b].size(); ++s)
          REQUIRE(record.labels[b][s] == dataset.label(order[b * 32 + s]));
    }
  }
  REQUIRE(records.size() == 6);
  for (size_t run = 2; run < records.size(); ++run) {
    CAPTURE(run);
    CHECK(records[run].images == records[run % 2].images);
    CHECK(records[run].labels == records[run % 2].labels);
  }
  CHECK(records[0].images != records[1].images);  // a new epoch draws new augmentations
}

TEST_CASE("batch contents are the dataset's pixels / 255 without augmentation") {
  const ImageDataset dataset = synthetic_cifar10(10, 2);
  DataLoader loader(dataset, Compose({ToTensor{}}), DataLoaderOptions().batch_size(4).num_workers(2));
  loader.start_epoch(0);
  int64_t sample = 0;
  while (std::optional<Batch> batch = loader.next()) {
    CHECK(batch->images.sizes() == loom::Shape{batch->size(), 3, 32, 32});
    CHECK(batch->labels.dtype() == DType::i64);
    const float* values = batch->images.data<float>();
    for (int64_t s = 0; s < batch->size(); ++s, ++sample) {
      for (int64_t k = 0; k < 3072; k += 97) REQUIRE(values[s * 3072 + k] == dataset.image(sample)[k] / 255.0f);
    }
  }
  CHECK(sample == 10);
  CHECK_FALSE(loader.next().has_value());
}

TEST_CASE("drop_last, channels-last and 16-bit output options") {
  const ImageDataset dataset = synthetic_cifar10(70, 4);
  const DataLoaderOptions base = DataLoaderOptions().batch_size(16).num_workers(2).seed(1);
  DataLoader reference(dataset, cifar_training_transforms(), base);
  CHECK(reference.num_batches() == 5);
  DataLoader dropping(dataset, cifar_training_transforms(), DataLoaderOptions(base).drop_last(true));
  CHECK(dropping.num_batches() == 4);
  CHECK(record_epoch(dropping, 0).images.size() == 4);

  DataLoader channels_last(dataset, cifar_training_transforms(),
                           DataLoaderOptions(base).memory_format(MemoryFormat::nhwc));
  DataLoader half(dataset, cifar_training_transforms(), DataLoaderOptions(base).dtype(DType::f16));
  DataLoader bf16(dataset, cifar_training_transforms(), DataLoaderOptions(base).dtype(DType::bf16));
  reference.start_epoch(2);
  channels_last.start_epoch(2);
  half.start_epoch(2);
  bf16.start_epoch(2);
  while (std::optional<Batch> expected = reference.next()) {
    const Batch nhwc = *channels_last.next();
    const Batch f16 = *half.next();
    const Batch b16 = *bf16.next();
    const int64_t B = expected->size();
    CHECK(nhwc.images.sizes() == loom::Shape{B, 3, 32, 32});
    CHECK(nhwc.images.strides() == loom::Shape{32 * 32 * 3, 1, 32 * 3, 3});
    const std::vector<float> want = expected->images.to_vector<float>();
    CHECK(nhwc.images.contiguous().to_vector<float>() == want);
    const loom::Half* halves = f16.images.data<loom::Half>();
    const loom::BFloat16* bfloats = b16.images.data<loom::BFloat16>();
    for (size_t k = 0; k < want.size(); ++k) {
      REQUIRE(halves[k].bits == loom::Half(want[k]).bits);
      REQUIRE(bfloats[k].bits == loom::BFloat16(want[k]).bits);
    }
  }
}

TEST_CASE("the loader records how long the consumer waited") {
  const ImageDataset dataset = synthetic_cifar10(8, 3);
  auto slow = [](Batch&) { std::this_thread::sleep_for(std::chrono::milliseconds(30)); };
  for (int64_t workers : {0, 1}) {
    DataLoader loader(dataset, Compose({ToTensor{}}),
                      DataLoaderOptions().batch_size(4).num_workers(workers).batch_transform(slow));
    loader.start_epoch(0);
    REQUIRE(loader.next().has_value());
    CHECK(loader.last_wait_seconds() >= 0.025);
    const double first = loader.total_wait_seconds();
    REQUIRE(loader.next().has_value());
    CHECK(loader.total_wait_seconds() > first);
    loader.reset_wait_total();
    CHECK(loader.total_wait_seconds() == 0.0);
  }
}

TEST_CASE("stopping mid-epoch joins every worker") {
  const ImageDataset dataset = synthetic_cifar10(400, 5);
  auto slow = [](Batch&) { std::this_thread::sleep_for(std::chrono::milliseconds(5)); };
  const int baseline = thread_count();
  {
    DataLoader loader(dataset, cifar_training_transforms(),
                      DataLoaderOptions().batch_size(8).num_workers(4).batch_transform(slow));
    loader.start_epoch(0);
    REQUIRE(loader.next().has_value());
    REQUIRE(loader.next().has_value());
    CHECK(thread_count() == baseline + 4);
    loader.start_epoch(1);  // abandons epoch 0 mid-way
    REQUIRE(loader.next().has_value());
    CHECK(thread_count() == baseline + 4);
  }  // destroyed mid-epoch
  CHECK(thread_count_settled(baseline) == baseline);

  DataLoader loader(dataset.subset(40), Compose({ToTensor{}}), DataLoaderOptions().batch_size(8).num_workers(3));
  int batches = 0;
  for ([[maybe_unused]] Batch& batch : loader.epoch(0)) ++batches;
  CHECK(batches == 5);
  CHECK(thread_count_settled(baseline) == baseline);  // a finished epoch has joined its workers
  loader.start_epoch(1);
  loader.next();
  loader.stop();
  CHECK(thread_count_settled(baseline) == baseline);
}

TEST_CASE("an exception in a worker reaches next() with its message") {
  const ImageDataset dataset = synthetic_cifar10(64, 6);
  auto failing = [](Batch& batch) {
    if (batch.index == 3) throw loom::Error("disk on fire while reading batch 3");
  };
  const int baseline = thread_count();
  for (int64_t workers : {0, 1, 4}) {
    CAPTURE(workers);
    DataLoader loader(dataset, cifar_training_transforms(),
                      DataLoaderOptions().batch_size(8).num_workers(workers).batch_transform(failing));
    loader.start_epoch(0);
    for (int b = 0; b < 3; ++b) REQUIRE(loader.next().has_value());
    const std::string message = error_message([&] { loader.next(); });
    CHECK(message.find("disk on fire while reading batch 3") != std::string::npos);
    CHECK(message.find("batch 3 of epoch 0") != std::string::npos);
    CHECK_FALSE(loader.next().has_value());
    CHECK(thread_count_settled(baseline) == baseline);
    // The loader is usable again for the next epoch.
    loader.start_epoch(1);
    REQUIRE(loader.next().has_value());
  }
}

TEST_CASE("sampler indices outside the dataset and bad options are reported") {
  const ImageDataset dataset = synthetic_cifar10(10, 7);
  auto too_big = std::make_shared<SequentialSampler>(12);
  DataLoader loader(dataset, Compose({ToTensor{}}), DataLoaderOptions().batch_size(4).num_workers(2), too_big);
  loader.start_epoch(0);
  loader.next();
  loader.next();
  CHECK(error_message([&] { loader.next(); }).find("sample index 10 is out of range for 10 samples") !=
        std::string::npos);

  auto make = [&](DataLoaderOptions options) { DataLoader(dataset, Compose({ToTensor{}}), options); };
  CHECK(error_message([&] { make(DataLoaderOptions().batch_size(0)); }).find("batch size 0") != std::string::npos);
  CHECK(error_message([&] { make(DataLoaderOptions().num_workers(-1)); }).find("num_workers -1") !=
        std::string::npos);
  CHECK(error_message([&] { make(DataLoaderOptions().dtype(DType::i32)); }).find("output dtype i32") !=
        std::string::npos);
  DataLoader unstarted(dataset, Compose({ToTensor{}}));
  CHECK(error_message([&] { unstarted.next(); }).find("call start_epoch") != std::string::npos);
}

TEST_CASE("a DistributedSampler drives the loader per rank and per epoch") {
  const ImageDataset dataset = synthetic_cifar10(50, 8);
  std::vector<int64_t> seen;
  for (int64_t rank = 0; rank < 2; ++rank) {
    auto sampler = std::make_shared<DistributedSampler>(dataset.size(), 2, rank, true, 4);
    DataLoader loader(dataset, cifar_training_transforms(), DataLoaderOptions().batch_size(10).num_workers(2),
                      sampler);
    CHECK(loader.num_batches() == 3);
    int64_t samples = 0;
    for (Batch& batch : loader.epoch(5)) samples += batch.size();
    CHECK(samples == 25);
    CHECK(sampler->epoch() == 5);
    const std::vector<int64_t> mine = sampler->indices();
    seen.insert(seen.end(), mine.begin(), mine.end());
  }
  std::sort(seen.begin(), seen.end());
  CHECK(std::unique(seen.begin(), seen.end()) - seen.begin() == 50);
}

TEST_CASE("pin_memory on the CPU leaves batches in place; a CUDA device without one is reported") {
  const ImageDataset dataset = synthetic_cifar10(40, 9);
  const DataLoaderOptions base = DataLoaderOptions().batch_size(16).num_workers(2).seed(3);
  DataLoader plain(dataset, cifar_training_transforms(), base);
  DataLoader pinned(dataset, cifar_training_transforms(), DataLoaderOptions(base).pin_memory(true));
  for (int64_t epoch : {0, 1}) {
    const EpochRecord want = record_epoch(plain, epoch);
    pinned.start_epoch(epoch);
    for (size_t b = 0; b < want.images.size(); ++b) {
      const Batch batch = *pinned.next();
      CHECK(batch.images.device().is_cpu());
      CHECK(batch.labels.device().is_cpu());
      CHECK_FALSE(batch.copied);
      const auto* bytes = static_cast<const uint8_t*>(batch.images.raw_data());
      CHECK(std::vector<uint8_t>(bytes, bytes + batch.images.nbytes()) == want.images[b]);
      CHECK(batch.labels.to_vector<int64_t>() == want.labels[b]);
    }
    CHECK_FALSE(pinned.next().has_value());
  }
  if (loom::cuda::device_count() == 0) {
    // CPU-only build: "built without CUDA"; CUDA build on a machine without a GPU: "no CUDA device".
    const std::string message = error_message([&] {
      DataLoader(dataset, cifar_training_transforms(), DataLoaderOptions(base).device(loom::Device::cuda(0)));
    });
    CAPTURE(message);
    CHECK((message.find("without CUDA") != std::string::npos || message.find("CUDA device") != std::string::npos));
  }
}

TEST_CASE("an epoch started at batch k delivers the full epoch's batches k, k+1, ... bit for bit") {
  const ImageDataset dataset = synthetic_cifar10(300, 2);
  for (int64_t workers : {0, 2}) {
    CAPTURE(workers);
    auto sampler = std::make_shared<DistributedSampler>(dataset.size(), 2, 1, true, 7);
    DataLoader loader(dataset, cifar_training_transforms(),
                      DataLoaderOptions().batch_size(16).num_workers(workers).seed(5), sampler);
    const EpochRecord full = record_epoch(loader, 3);
    REQUIRE(full.images.size() == 10);
    for (int64_t first : {1, 7, 9, 10}) {
      CAPTURE(first);
      loader.start_epoch(3, first);
      int64_t expected = first;
      while (auto batch = loader.next()) {
        REQUIRE(batch->index == expected);
        const Tensor images = batch->images.contiguous();
        const auto* bytes = static_cast<const uint8_t*>(images.raw_data());
        CHECK(std::vector<uint8_t>(bytes, bytes + images.nbytes()) == full.images[static_cast<size_t>(expected)]);
        CHECK(batch->labels.to_vector<int64_t>() == full.labels[static_cast<size_t>(expected)]);
        ++expected;
      }
      CHECK(expected == 10);
    }
  }
  auto sampler = std::make_shared<SequentialSampler>(dataset.size());
  DataLoader loader(dataset, cifar_training_transforms(), DataLoaderOptions().batch_size(100), sampler);
  CHECK_THROWS_WITH_AS(loader.start_epoch(0, 4), doctest::Contains("has 3 batches"), loom::Error);
}

TEST_CASE("a sample's augmentation depends on (seed, epoch, dataset index) only, not on the world size or a resume") {
  const ImageDataset dataset = synthetic_cifar10(60, 4);
  // Each dataset index's augmented pixels as one process trains the epoch whole.
  std::map<int64_t, std::vector<uint8_t>> whole;
  auto record = [&](DataLoader& loader, std::map<int64_t, std::vector<uint8_t>>& into, int64_t epoch) {
    for (Batch& batch : loader.epoch(epoch)) {
      const Tensor images = batch.images.contiguous();
      const auto* bytes = static_cast<const uint8_t*>(images.raw_data());
      const size_t per_sample = images.nbytes() / static_cast<size_t>(batch.size());
      REQUIRE(static_cast<int64_t>(batch.samples.size()) == batch.size());
      const std::vector<int64_t> labels = batch.labels.to_vector<int64_t>();
      for (size_t s = 0; s < batch.samples.size(); ++s) {
        CHECK(labels[s] == dataset.label(batch.samples[s]));  // samples names the batch's dataset indices
        into[batch.samples[s]].assign(bytes + s * per_sample, bytes + (s + 1) * per_sample);
      }
    }
  };
  DataLoader one(dataset, cifar_training_transforms(), DataLoaderOptions().batch_size(8).seed(5),
                 std::make_shared<DistributedSampler>(dataset.size(), 1, 0, true, 7));
  record(one, whole, 2);
  REQUIRE(whole.size() == 60);
  // Three ranks continuing the epoch after 24 samples (as after a resume from another world size).
  std::map<int64_t, std::vector<uint8_t>> rest;
  for (int64_t rank = 0; rank < 3; ++rank) {
    auto sampler = std::make_shared<DistributedSampler>(dataset.size(), 3, rank, true, 7);
    sampler->set_epoch(2);
    sampler->set_start(24);
    DataLoader loader(dataset, cifar_training_transforms(), DataLoaderOptions().batch_size(5).num_workers(1).seed(5),
                      sampler);
    record(loader, rest, 2);
  }
  CHECK(rest.size() == 36);
  for (const auto& [index, pixels] : rest) {
    CAPTURE(index);
    CHECK(pixels == whole.at(index));
  }
}
