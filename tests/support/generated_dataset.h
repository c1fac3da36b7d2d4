// A data::Dataset for tests whose samples a function computes from the
// index: the small learnable or traceable data sets the trainer and dist
// tests feed through a DataLoader.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include <loom/data/dataset.h>

namespace loom::testing {

class GeneratedDataset : public data::Dataset {
 public:
  // Writes sample `index`'s (C, H, W) f32 pixels, every one of them, and returns its label.
  // Called from the loader's worker threads, several at once.
  using SampleFunction = std::function<int64_t(int64_t index, float* pixels)>;

  GeneratedDataset(std::string name, int64_t size, data::SampleShape sample_shape, SampleFunction sample)
      : name_(std::move(name)), size_(size), sample_shape_(sample_shape), sample_(std::move(sample)) {}

  int64_t size() const override { return size_; }
  data::SampleShape sample_shape() const override { return sample_shape_; }
  int64_t get(int64_t index, data::SampleSlot& slot) const override { return sample_(index, slot.pixels); }
  std::string name() const override { return name_; }

 private:
  std::string name_;
  int64_t size_;
  data::SampleShape sample_shape_;
  SampleFunction sample_;
};

}  // namespace loom::testing
