// DataLoader: per-epoch worker threads, a bounded in-order prefetch window,
// the collate loop that writes augmented samples straight into the batch, and
// the staging of batches to a CUDA device on the loader's own stream.
#include <loom/data/loader.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <loom/core/cuda/runtime.h>
#include <loom/core/error.h>
#include <loom/core/profiler.h>
#include <loom/core/generator.h>

namespace loom::data {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The image tensor of a batch and the element strides of one sample in it.
struct BatchImages {
  Tensor images;
  int64_t sample_stride = 0;
  SampleStrides strides;
};

// Host memory for a batch: page-locked when it is to be copied to a CUDA
// device with pin_memory, so that the copy is an asynchronous DMA.
bool stage_in_pinned_memory(const DataLoaderOptions& options) {
  return options.pin_memory() && options.device().is_cuda();
}

Tensor host_empty(const Shape& sizes, DType dtype, const DataLoaderOptions& options) {
  return stage_in_pinned_memory(options) ? Tensor::empty_pinned(sizes, dtype) : Tensor::empty(sizes, dtype);
}

BatchImages allocate_images(int64_t batch, int64_t channels, int64_t height, int64_t width,
                            const DataLoaderOptions& options) {
  BatchImages out;
  if (options.memory_format() == MemoryFormat::nchw) {
    out.images = host_empty({batch, channels, height, width}, options.dtype(), options);
    out.sample_stride = channels * height * width;
    out.strides = {height * width, width, 1};
  } else {
    // Channels-last: memory (B, H, W, C), logical sizes (B, C, H, W).
    Tensor memory = host_empty({batch, height, width, channels}, options.dtype(), options);
    out.images = make_view(memory, {batch, channels, height, width},
                           {height * width * channels, 1, width * channels, channels}, 0);
    out.sample_stride = height * width * channels;
    out.strides = {1, width * channels, channels};
  }
  return out;
}

template <class T>
void collate(const ImageDataset& dataset, const FusedTransform& transform, uint64_t seed, int64_t epoch,
             const int64_t* indices, int64_t count, const BatchImages& out, int64_t* labels) {
  T* base = static_cast<T*>(out.images.raw_data());
  for (int64_t s = 0; s < count; ++s) {
    const int64_t index = indices[s];
    transform.apply<T>(dataset.image(index), transform.draw(seed, epoch, index), base + s * out.sample_stride,
                       out.strides);
    labels[s] = dataset.label(index);
  }
}

// Sample `index` of a user's Dataset, from its own generator, into the batch
// slot `out` (any dtype and strides) through a per-batch f32 scratch buffer.
template <class T>
void collate(const Dataset& dataset, uint64_t seed, int64_t epoch, const int64_t* indices, int64_t count,
             const BatchImages& out, int64_t* labels) {
  const SampleShape shape = dataset.sample_shape();
  std::vector<float> scratch(static_cast<size_t>(shape.elements()));
  T* base = static_cast<T*>(out.images.raw_data());
  for (int64_t s = 0; s < count; ++s) {
    const int64_t index = indices[s];
    Generator random(Generator::mix(Generator::mix(seed, static_cast<uint64_t>(epoch)), static_cast<uint64_t>(index)));
    SampleSlot slot{scratch.data(), shape, &random};
    try {
      labels[s] = dataset.get(index, slot);
    } catch (const std::exception& error) {
      LOOM_FAIL(dataset.name(), ", sample ", index, ": ", error.what());
    }
    T* sample = base + s * out.sample_stride;
    const float* source = scratch.data();
    for (int64_t c = 0; c < shape.channels; ++c) {
      for (int64_t y = 0; y < shape.height; ++y) {
        T* row = sample + c * out.strides.channel + y * out.strides.row;
        for (int64_t x = 0; x < shape.width; ++x) row[x * out.strides.column] = T(*source++);
      }
    }
  }
}

}  // namespace

Batch build_batch(const Dataset& dataset, const DataLoaderOptions& options, int64_t epoch, const int64_t* indices,
                  int64_t count, int64_t batch_index) {
  const SampleShape shape = dataset.sample_shape();
  BatchImages out = allocate_images(count, shape.channels, shape.height, shape.width, options);
  Batch batch;
  batch.index = batch_index;
  batch.samples.assign(indices, indices + count);
  batch.labels = host_empty({count}, DType::i64, options);
  int64_t* labels = batch.labels.data<int64_t>();
  const uint64_t seed = options.seed();
  switch (options.dtype()) {
    case DType::f32: collate<float>(dataset, seed, epoch, indices, count, out, labels); break;
    case DType::f64: collate<double>(dataset, seed, epoch, indices, count, out, labels); break;
    case DType::f16: collate<Half>(dataset, seed, epoch, indices, count, out, labels); break;
    case DType::bf16: collate<BFloat16>(dataset, seed, epoch, indices, count, out, labels); break;
    default: LOOM_FAIL("DataLoader: output dtype ", dtype_name(options.dtype()), " is not f32, f64, f16 or bf16");
  }
  batch.images = std::move(out.images);
  if (options.batch_transform()) options.batch_transform()(batch);
  return batch;
}

Batch build_batch(const ImageDataset& dataset, const FusedTransform& transform, const DataLoaderOptions& options,
                  int64_t epoch, const int64_t* indices, int64_t count, int64_t batch_index) {
  BatchImages out =
      allocate_images(count, transform.channels(), transform.output_height(), transform.output_width(), options);
  Batch batch;
  batch.index = batch_index;
  batch.samples.assign(indices, indices + count);
  batch.labels = host_empty({count}, DType::i64, options);
  int64_t* labels = batch.labels.data<int64_t>();
  switch (options.dtype()) {
    case DType::f32: collate<float>(dataset, transform, options.seed(), epoch, indices, count, out, labels); break;
    case DType::f64: collate<double>(dataset, transform, options.seed(), epoch, indices, count, out, labels); break;
    case DType::f16: collate<Half>(dataset, transform, options.seed(), epoch, indices, count, out, labels); break;
    case DType::bf16:
      collate<BFloat16>(dataset, transform, options.seed(), epoch, indices, count, out, labels);
      break;
    default: LOOM_FAIL("DataLoader: output dtype ", dtype_name(options.dtype()), " is not f32, f64, f16 or bf16");
  }
  batch.images = std::move(out.images);
  if (options.batch_transform()) options.batch_transform()(batch);
  return batch;
}

namespace {

// Copies host tensor `host` (its whole storage, so views such as the
// channels-last layout keep their geometry) into new memory of `device`,
// allocated for and copied on `stream`. A pinned source block is reused only
// after the copy completes (record_pinned_use); pageable memory is staged by
// the driver before copy_bytes_async returns.
Tensor copy_to_device(const Tensor& host, Device device, cuda::StreamView stream) {
  if (!host.defined() || !host.device().is_cpu()) return host;
  const size_t nbytes = host.storage()->nbytes();
  const int64_t elements = static_cast<int64_t>(nbytes / element_size(host.dtype()));
  Tensor memory = Tensor::empty({elements}, host.dtype(), device);  // from the current (copy) stream's pool
  if (nbytes > 0) {
    cuda::copy_bytes_async(memory.raw_data(), true, host.storage()->data(), false, nbytes, stream);
    cuda::record_pinned_use(host.storage()->data(), stream);
  }
  return make_view(memory, host.sizes(), host.strides(), host.offset());
}

}  // namespace

// The loader's CUDA copy stream. stage() runs in the thread that built the
// batch (a worker, or the consumer with 0 workers): it enqueues the batch's
// host-to-device copies and records `copied`; the host batch is released at
// once (pinned blocks wait for their copy before reuse). hand_over() runs in
// the consumer: its current stream waits on `copied`, and the device memory,
// allocated on the copy stream, is marked as used by the consumer's stream so
// the caching allocator does not hand it to the next copy while kernels still
// read it.
class DeviceStaging {
 public:
  explicit DeviceStaging(Device device) : device_(device), stream_(cuda::pooled_stream(check_device(device))) {}

  // Runs on the loader's device: EpochRun::build() holds the device guard.
  void stage(Batch& batch) const {
    cuda::StreamGuard stream_guard(stream_);
    batch.images = copy_to_device(batch.images, device_, stream_);
    batch.labels = copy_to_device(batch.labels, device_, stream_);
    auto copied = std::make_shared<cuda::Event>(device_.index);
    copied->record(stream_);
    batch.copied = std::move(copied);
  }

  void hand_over(const Batch& batch) const {
    const cuda::StreamView compute = cuda::current_stream(device_.index);
    if (batch.copied) compute.wait(*batch.copied);
    if (compute == stream_) return;
    for (const Tensor* tensor : {&batch.images, &batch.labels}) {
      if (tensor->defined() && tensor->device() == device_) {
        cuda::record_stream(tensor->storage()->data(), device_.index, compute);
      }
    }
  }

 private:
  static int check_device(Device device) {
    cuda::require_device(device.index);
    return device.index;
  }

  Device device_;
  cuda::StreamView stream_;  // pooled: it outlives the batches copied on it
};

// What every epoch shares and nothing mutates.
struct DataLoader::Plan {
  ImageDataset dataset;
  std::optional<FusedTransform> transform;  // with `dataset`
  std::shared_ptr<const Dataset> user_dataset;  // instead of both
  DataLoaderOptions options;
  std::unique_ptr<DeviceStaging> staging;  // null unless options.device() is CUDA
};

// One epoch in progress. Workers claim batch numbers in order, but only within
// a window of `capacity` batches past the one the consumer waits for, which
// bounds memory; finished batches wait in slot (number % capacity) until the
// consumer reaches them, so delivery follows sampler order whatever the
// workers' timing.
class DataLoader::EpochRun {
 public:
  EpochRun(std::shared_ptr<const Plan> plan, int64_t epoch, std::vector<int64_t> order, int64_t first_batch)
      : plan_(std::move(plan)), epoch_(epoch), order_(std::move(order)) {
    const DataLoaderOptions& options = plan_->options;
    const int64_t n = static_cast<int64_t>(order_.size());
    num_batches_ = options.drop_last() ? n / options.batch_size() : (n + options.batch_size() - 1) / options.batch_size();
    LOOM_CHECK(first_batch >= 0 && first_batch <= num_batches_, "DataLoader: cannot start epoch ", epoch,
               " at batch ", first_batch, ": it has ", num_batches_, " batches");
    next_claim_ = next_delivery_ = first_batch;
    const int64_t workers = std::min(options.num_workers(), num_batches_ - first_batch);
    capacity_ = std::max<int64_t>(1, options.prefetch_factor() * workers);
    slots_.resize(static_cast<size_t>(capacity_));
    workers_.reserve(static_cast<size_t>(workers));
    try {
      for (int64_t w = 0; w < workers; ++w) workers_.emplace_back([this] { work(); });
    } catch (...) {
      stop();
      throw;
    }
  }
  ~EpochRun() { stop(); }
  EpochRun(const EpochRun&) = delete;
  EpochRun& operator=(const EpochRun&) = delete;

  int64_t epoch() const { return epoch_; }

  std::optional<Batch> next() {
    if (plan_->options.num_workers() == 0) {
      if (next_delivery_ >= num_batches_) return std::nullopt;
      const int64_t number = next_delivery_++;
      try {
        Batch batch = build(number);
        if (plan_->staging) plan_->staging->hand_over(batch);
        return batch;
      } catch (const std::exception& error) {
        next_delivery_ = num_batches_;
        throw Error(failure_message(number, error.what()));
      }
    }
    std::unique_lock lock(mutex_);
    if (next_delivery_ >= num_batches_) {
      lock.unlock();
      stop();  // the workers have finished: join them now rather than at the next epoch
      return std::nullopt;
    }
    Slot& slot = slots_[static_cast<size_t>(next_delivery_ % capacity_)];
    batch_ready_.wait(lock, [&] { return slot.done; });
    const int64_t number = next_delivery_++;
    slot.done = false;
    if (!slot.error.empty()) {
      const std::string message = failure_message(number, slot.error);
      next_delivery_ = num_batches_;
      lock.unlock();
      stop();
      throw Error(message);
    }
    Batch batch = std::move(*slot.batch);
    slot.batch.reset();
    lock.unlock();
    window_moved_.notify_all();
    if (plan_->staging) plan_->staging->hand_over(batch);
    return batch;
  }

  // Asks the workers to finish the batch they are building and exit, then joins them.
  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    window_moved_.notify_all();
    for (std::thread& worker : workers_) {
      if (worker.joinable()) worker.join();
    }
    workers_.clear();
  }

 private:
  struct Slot {
    bool done = false;
    std::optional<Batch> batch;
    std::string error;
  };

  Batch build(int64_t number) const {
    profiler::Range range("build batch", "data");
    // Pinned host memory (cudaHostAlloc) needs a context on the calling
    // thread's device: the loader's, not a new worker thread's implicit GPU 0.
    std::optional<cuda::DeviceGuard> device_guard;
    if (plan_->staging) device_guard.emplace(plan_->options.device().index);
    const int64_t batch_size = plan_->options.batch_size();
    const int64_t begin = number * batch_size;
    const int64_t count = std::min<int64_t>(batch_size, static_cast<int64_t>(order_.size()) - begin);
    Batch batch = plan_->user_dataset
                      ? build_batch(*plan_->user_dataset, plan_->options, epoch_, order_.data() + begin, count, number)
                      : build_batch(plan_->dataset, *plan_->transform, plan_->options, epoch_, order_.data() + begin,
                                    count, number);
    if (plan_->staging) plan_->staging->stage(batch);
    return batch;
  }

  std::string failure_message(int64_t number, const std::string& what) const {
    return str("DataLoader: building batch ", number, " of epoch ", epoch_, " failed: ", what);
  }

  void work() {
    profiler::set_thread_name("data worker");
    for (;;) {
      int64_t number;
      {
        std::unique_lock lock(mutex_);
        window_moved_.wait(lock, [&] {
          return stopping_ || next_claim_ >= num_batches_ || next_claim_ < next_delivery_ + capacity_;
        });
        if (stopping_ || next_claim_ >= num_batches_) return;
        number = next_claim_++;
      }
      std::optional<Batch> batch;
      std::string error;
      try {
        batch = build(number);
      } catch (const std::exception& failure) {
        error = failure.what();
        if (error.empty()) error = "an exception without a message";
      } catch (...) {
        error = "an exception that is not a std::exception";
      }
      {
        std::lock_guard lock(mutex_);
        Slot& slot = slots_[static_cast<size_t>(number % capacity_)];
        slot.batch = std::move(batch);
        slot.error = std::move(error);
        slot.done = true;
      }
      batch_ready_.notify_one();
    }
  }

  std::shared_ptr<const Plan> plan_;
  const int64_t epoch_;
  const std::vector<int64_t> order_;
  int64_t num_batches_ = 0;
  int64_t capacity_ = 1;

  std::mutex mutex_;
  std::condition_variable batch_ready_;   // a worker filled a slot
  std::condition_variable window_moved_;  // the consumer freed a slot, or stop
  std::vector<Slot> slots_;
  int64_t next_claim_ = 0;     // next batch a worker will build
  int64_t next_delivery_ = 0;  // next batch next() returns
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

namespace {

void check_options(const DataLoaderOptions& options) {
  LOOM_CHECK(options.batch_size() >= 1, "DataLoader: batch size ", options.batch_size(), " must be at least 1");
  LOOM_CHECK(options.num_workers() >= 0, "DataLoader: num_workers ", options.num_workers(),
             " must be non-negative (0 loads in the calling thread)");
  LOOM_CHECK(options.prefetch_factor() >= 1, "DataLoader: prefetch_factor ", options.prefetch_factor(),
             " must be at least 1");
  const DType dtype = options.dtype();
  LOOM_CHECK(dtype == DType::f32 || dtype == DType::f64 || dtype == DType::f16 || dtype == DType::bf16,
             "DataLoader: output dtype ", dtype_name(dtype), " is not one of f32, f64, f16, bf16");
}

std::unique_ptr<DeviceStaging> staging_for(const DataLoaderOptions& options) {
  if (!options.device().is_cuda()) return nullptr;
  return std::make_unique<DeviceStaging>(options.device());
}

}  // namespace

DataLoader::DataLoader(ImageDataset dataset, const Compose& transforms, DataLoaderOptions options,
                       std::shared_ptr<Sampler> sampler)
    : sampler_(std::move(sampler)) {
  check_options(options);
  if (!sampler_) sampler_ = std::make_shared<SequentialSampler>(dataset.size());
  FusedTransform transform(transforms, dataset.channels(), dataset.height(), dataset.width());
  std::unique_ptr<DeviceStaging> staging = staging_for(options);
  plan_ = std::make_shared<const Plan>(
      Plan{std::move(dataset), std::move(transform), nullptr, std::move(options), std::move(staging)});
}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options,
                       std::shared_ptr<Sampler> sampler)
    : sampler_(std::move(sampler)) {
  LOOM_CHECK(dataset != nullptr, "DataLoader: the dataset is null");
  check_options(options);
  const SampleShape shape = dataset->sample_shape();
  LOOM_CHECK(shape.channels > 0 && shape.height > 0 && shape.width > 0, "DataLoader: ", dataset->name(),
             " has samples of shape (", shape.channels, ", ", shape.height, ", ", shape.width,
             "); every size must be positive");
  LOOM_CHECK(dataset->size() >= 0, "DataLoader: ", dataset->name(), " has negative size ", dataset->size());
  if (!sampler_) sampler_ = std::make_shared<SequentialSampler>(dataset->size());
  std::unique_ptr<DeviceStaging> staging = staging_for(options);
  plan_ = std::make_shared<const Plan>(
      Plan{ImageDataset(), std::nullopt, std::move(dataset), std::move(options), std::move(staging)});
}

DataLoader::~DataLoader() = default;
DataLoader::DataLoader(DataLoader&&) noexcept = default;
DataLoader& DataLoader::operator=(DataLoader&&) noexcept = default;

void DataLoader::start_epoch(int64_t epoch, int64_t first_batch) {
  run_.reset();
  sampler_->set_epoch(epoch);
  run_ = std::make_unique<EpochRun>(plan_, epoch, sampler_->indices(), first_batch);
}

std::optional<Batch> DataLoader::next() {
  LOOM_CHECK(run_ != nullptr, "DataLoader: call start_epoch(epoch) (or iterate loader.epoch(epoch)) before next()");
  const Clock::time_point start = Clock::now();
  std::optional<Batch> batch;
  {
    profiler::Range wait("data wait", "data");
    batch = run_->next();
  }
  if (batch) {
    last_wait_seconds_ = seconds_since(start);
    total_wait_seconds_ += last_wait_seconds_;
  }
  return batch;
}

void DataLoader::stop() { run_.reset(); }

DataLoader::EpochRange DataLoader::epoch(int64_t epoch) {
  start_epoch(epoch);
  return EpochRange(this);
}

int64_t DataLoader::num_batches() const {
  const int64_t n = sampler_->size();
  const int64_t batch_size = plan_->options.batch_size();
  return plan_->options.drop_last() ? n / batch_size : (n + batch_size - 1) / batch_size;
}

const ImageDataset& DataLoader::dataset() const {
  LOOM_CHECK(!plan_->user_dataset, "DataLoader::dataset(): this loader reads ", plan_->user_dataset->name(),
             ", not an in-memory ImageDataset");
  return plan_->dataset;
}

int64_t DataLoader::dataset_size() const {
  return plan_->user_dataset ? plan_->user_dataset->size() : plan_->dataset.size();
}
const DataLoaderOptions& DataLoader::options() const { return plan_->options; }

}  // namespace loom::data
