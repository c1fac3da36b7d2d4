// DataLoader: sampler -> batches of indices -> worker threads that decode,
// augment and collate -> bounded in-order prefetch queue -> training thread.
#pragma once

#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <vector>

#include <loom/core/cuda/stream.h>
#include <loom/core/memory_format.h>
#include <loom/core/options.h>
#include <loom/core/tensor.h>
#include <loom/data/dataset.h>
#include <loom/data/sampler.h>
#include <loom/data/transforms.h>

namespace loom::data {

// How a batch of images lies in memory (core/memory_format.h). Both have
// logical sizes (B, C, H, W); nhwc is the channels-last stride variant.
using ::loom::MemoryFormat;

struct Batch {
  Tensor images;      // (B, C, H, W), options.dtype(), in options.memory_format(), on options.device()
  Tensor labels;      // (B) i64, on options.device()
  int64_t index = 0;  // position of this batch in its epoch (from the sampler's start)
  std::vector<int64_t> samples;  // the dataset index of each of its B samples, in order
  // CUDA batches only: recorded on the loader's copy stream after the batch's
  // host-to-device copies. next() has already made the calling thread's
  // current stream wait on it; work on other streams must wait on it too.
  std::shared_ptr<const cuda::Event> copied;
  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
};

class DataLoaderOptions {
  // Samples per batch; the last batch of an epoch is smaller unless drop_last.
  LOOM_OPTION(int64_t, batch_size) = 64;
  // Worker threads; 0 builds every batch in the thread that calls next().
  LOOM_OPTION(int64_t, num_workers) = 0;
  // Batches in flight per worker (built or being built, not yet consumed).
  LOOM_OPTION(int64_t, prefetch_factor) = 2;
  // Drop an epoch's last, smaller batch.
  LOOM_OPTION(bool, drop_last) = false;
  // Where next() delivers batches. On the CPU (the default) the collated batch
  // is used in place. On a CUDA device the batch is copied there on the
  // loader's own stream by the thread that built it, and next() makes the
  // caller's current stream wait on the copy (an event, no host sync).
  LOOM_OPTION(Device, device) = Device::cpu();
  // With a CUDA device: collate into page-locked host memory, so the copy is
  // asynchronous DMA; a buffer is reused only after its copy has completed.
  // Without it the driver stages the copy from pageable memory. Ignored on the CPU.
  LOOM_OPTION(bool, pin_memory) = false;
  // Element type of the images: f32 (default), f64, f16 or bf16, written directly.
  LOOM_OPTION(DType, dtype) = DType::f32;
  // nchw (default) or nhwc, the channels-last stride variant.
  LOOM_OPTION(MemoryFormat, memory_format) = MemoryFormat::nchw;
  // Seed of the augmentation randomness: sample i of epoch e uses (seed, e, i).
  LOOM_OPTION(uint64_t, seed) = 0;
  // Runs on every collated batch in the thread that built it (e.g. batch-level
  // augmentation); an exception it throws reaches the training thread.
  LOOM_OPTION(std::function<void(Batch&)>, batch_transform);
};

class DataLoader {
 public:
  // Without a sampler the loader visits the dataset in order.
  DataLoader(ImageDataset dataset, const Compose& transforms, DataLoaderOptions options = {},
             std::shared_ptr<Sampler> sampler = nullptr);
  // A user's Dataset: the workers call dataset->get() into each batch slot
  // (see data/dataset.h); sampling, prefetch, dtype, memory format, pinned
  // staging and the copy to a CUDA device are those of the built-in datasets.
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options = {},
             std::shared_ptr<Sampler> sampler = nullptr);
  // Stops the epoch in progress and joins its workers.
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;
  DataLoader(DataLoader&&) noexcept;
  DataLoader& operator=(DataLoader&&) noexcept;

  // Ends any epoch in progress (joining its workers), sets the sampler's
  // epoch and starts the workers on the new one. `first_batch` > 0 resumes an
  // epoch in its middle: next() returns batch first_batch, first_batch + 1, ...,
  // the same batches (samples, augmentation, index) the full epoch has there.
  void start_epoch(int64_t epoch, int64_t first_batch = 0);
  // The next batch in sampler order, or nullopt at the end of the epoch.
  // Rethrows, as loom::Error with its message, an exception from building the batch.
  std::optional<Batch> next();
  // Ends the epoch in progress early and joins its workers.
  void stop();

  class EpochRange;
  // start_epoch(epoch), then iterate: for (Batch& batch : loader.epoch(e)).
  EpochRange epoch(int64_t epoch);

  // Batches per epoch with the current sampler size.
  int64_t num_batches() const;
  // Seconds the last next() waited for its batch (the "Time dataload" figure),
  // and the sum since construction or reset_wait_total(). For CUDA batches
  // this is the host's wait; the device-side wait for the copy is not in it.
  double last_wait_seconds() const { return last_wait_seconds_; }
  double total_wait_seconds() const { return total_wait_seconds_; }
  void reset_wait_total() { total_wait_seconds_ = 0.0; }

  // The in-memory dataset; throws for a loader built on a user's Dataset.
  const ImageDataset& dataset() const;
  // Samples in the dataset, whichever kind it is.
  int64_t dataset_size() const;
  Sampler& sampler() { return *sampler_; }
  const DataLoaderOptions& options() const;

 private:
  struct Plan;
  class EpochRun;
  std::shared_ptr<const Plan> plan_;
  std::shared_ptr<Sampler> sampler_;
  std::unique_ptr<EpochRun> run_;
  double last_wait_seconds_ = 0.0;
  double total_wait_seconds_ = 0.0;
};

// An input range over one epoch; each step calls DataLoader::next().
class DataLoader::EpochRange {
 public:
  class Iterator {
   public:
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    explicit Iterator(DataLoader* loader) : loader_(loader), current_(loader->next()) {}
    Batch& operator*() { return *current_; }
    Batch* operator->() { return &*current_; }
    Iterator& operator++() {
      current_ = loader_->next();
      return *this;
    }
    bool operator==(std::default_sentinel_t) const { return !current_.has_value(); }

   private:
    DataLoader* loader_;
    std::optional<Batch> current_;
  };
  explicit EpochRange(DataLoader* loader) : loader_(loader) {}
  Iterator begin() { return Iterator(loader_); }
  std::default_sentinel_t end() { return {}; }

 private:
  DataLoader* loader_;
};

// Builds batch `batch_index` of an epoch from `order` without threads: what
// each worker runs before any copy to options.device(); in pinned memory when
// options.pin_memory() and the device is CUDA. Exposed for tests and benchmarks.
Batch build_batch(const ImageDataset& dataset, const FusedTransform& transform, const DataLoaderOptions& options,
                  int64_t epoch, const int64_t* indices, int64_t count, int64_t batch_index);
// The same for a user's Dataset.
Batch build_batch(const Dataset& dataset, const DataLoaderOptions& options, int64_t epoch, const int64_t* indices,
                  int64_t count, int64_t batch_index);

}  // namespace loom::data
