// Datasets the DataLoader takes: ImageDataset, labelled uint8 images held in
// memory ((N, C, H, W) planes plus int64 labels, shared read-only by every
// loader thread, augmented by a fused Compose), and Dataset, the interface a
// user implements for anything else (files decoded on the fly, generated data).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <loom/core/generator.h>

namespace loom::data {

// The shape every sample of a Dataset has: (channels, height, width).
struct SampleShape {
  int64_t channels = 0;
  int64_t height = 0;
  int64_t width = 0;
  int64_t elements() const { return channels * height * width; }
};

// Where Dataset::get writes one sample: its batch slot, seen as a contiguous
// (C, H, W) f32 buffer that the loader converts to the batch's dtype and
// memory format, and the sample's own random generator, seeded from
// (loader seed, epoch, index) so that results do not depend on which worker
// builds the sample.
struct SampleSlot {
  float* pixels = nullptr;  // (C, H, W) of sample_shape(), contiguous; every element must be written
  SampleShape shape;
  Generator* random = nullptr;
};

// A user's dataset, as torch.utils.data.Dataset: a size, and sample i on
// request. The DataLoader calls get() from its worker threads, several at
// once, so get() must be safe to call concurrently (const, no unguarded shared
// state). An exception from get() fails the batch and reaches the training
// thread as loom::Error naming the batch, the epoch and the sample index.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual SampleShape sample_shape() const = 0;
  // Writes sample `index` (0 <= index < size()) into `slot` and returns its label.
  virtual int64_t get(int64_t index, SampleSlot& slot) const = 0;
  // For error messages ("ImageFolder /data/train").
  virtual std::string name() const { return "dataset"; }
};

// An immutable, cheaply copyable dataset of images. Copies (and subsets) share
// one allocation, so handing the dataset to worker threads copies nothing.
class ImageDataset {
 public:
  ImageDataset() = default;
  // pixels: (count, channels, height, width) uint8, count = labels.size().
  // `name` appears in error messages ("CIFAR-10 train", "Fashion-MNIST test").
  ImageDataset(int64_t channels, int64_t height, int64_t width, std::vector<uint8_t> pixels,
               std::vector<int64_t> labels, std::string name);

  int64_t size() const { return count_; }
  int64_t channels() const { return channels_; }
  int64_t height() const { return height_; }
  int64_t width() const { return width_; }
  int64_t image_bytes() const { return channels_ * height_ * width_; }
  const std::string& name() const { return name_; }

  // The image at `index` as (C, H, W) planes; valid while any copy of the dataset lives.
  const uint8_t* image(int64_t index) const;
  uint8_t pixel(int64_t index, int64_t channel, int64_t row, int64_t column) const;
  int64_t label(int64_t index) const;

  // The first `count` samples, sharing this dataset's storage.
  ImageDataset subset(int64_t count) const;

 private:
  struct Contents {
    std::vector<uint8_t> pixels;
    std::vector<int64_t> labels;
  };
  void check_index(int64_t index) const;

  std::shared_ptr<const Contents> contents_;
  int64_t count_ = 0;
  int64_t channels_ = 0;
  int64_t height_ = 0;
  int64_t width_ = 0;
  std::string name_;
};

// The two halves every reader here returns.
struct TrainTestSplit {
  ImageDataset train;
  ImageDataset test;
};

}  // namespace loom::data
