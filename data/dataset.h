// ImageDataset: labelled uint8 images held in memory, (N, C, H, W) planes plus
// int64 labels, shared read-only by every loader thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace loom::data {

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
