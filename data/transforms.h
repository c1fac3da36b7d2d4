// Per-sample image transforms composed like torchvision's (RandomCrop,
// RandomHorizontalFlip, ToTensor, Normalize), folded into one fused loop that
// reads uint8 (C, H, W) pixels and writes the output batch directly.
#pragma once

#include <array>
#include <cstdint>
#include <variant>
#include <vector>

#include <loom/core/dtype.h>

namespace loom::data {

// Per-channel statistics the tutorials normalize with.
inline constexpr std::array<double, 3> cifar10_mean = {0.4914, 0.4822, 0.4465};
inline constexpr std::array<double, 3> cifar10_std = {0.2023, 0.1994, 0.2010};
inline constexpr std::array<double, 1> mnist_mean = {0.1307};
inline constexpr std::array<double, 1> mnist_std = {0.3081};

// Pads every side with `padding` zero pixels, then takes a random
// height x width window (torchvision.transforms.RandomCrop(size, padding)).
struct RandomCrop {
  int64_t height = 0;
  int64_t width = 0;
  int64_t padding = 0;
  explicit RandomCrop(int64_t size, int64_t padding = 0) : height(size), width(size), padding(padding) {}
  RandomCrop(int64_t height, int64_t width, int64_t padding) : height(height), width(width), padding(padding) {}
};

// Mirrors left-right with the given probability.
struct RandomHorizontalFlip {
  double probability = 0.5;
};

// uint8 -> floating point in [0, 1] (x / 255).
struct ToTensor {};

// (x - mean[c]) / std[c]; one value broadcasts to every channel.
struct Normalize {
  std::vector<double> mean;
  std::vector<double> std;
};
Normalize cifar10_normalize();
Normalize mnist_normalize();

using Transform = std::variant<RandomCrop, RandomHorizontalFlip, ToTensor, Normalize>;

// An ordered list of transforms, as torchvision.transforms.Compose. Checked
// when a FusedTransform is built from it: ToTensor exactly once, Normalize
// after ToTensor, RandomCrop before Normalize, each transform at most once.
class Compose {
 public:
  Compose() = default;
  // Implicit, so a braced list works where a Compose is expected.
  Compose(std::vector<Transform> transforms) : transforms_(std::move(transforms)) {}
  const std::vector<Transform>& transforms() const { return transforms_; }

 private:
  std::vector<Transform> transforms_;
};

// The random choices made for one sample. The crop window's top-left corner
// is given in source coordinates, so it is negative inside the padding.
struct SampleAugmentation {
  int64_t top = 0;
  int64_t left = 0;
  bool flip = false;
};

// Element strides of one output sample, covering NCHW and NHWC batches alike.
struct SampleStrides {
  int64_t channel = 0;
  int64_t row = 0;
  int64_t column = 0;
};

// A Compose specialised to one input shape: random parameters come from
// draw(), values from a per-channel 256-entry table that holds exactly what
// torchvision computes in f32 ((x / 255 - mean) / std), so apply() is one
// gather per output element with the crop, flip and layout folded into the
// loop bounds and strides.
class FusedTransform {
 public:
  FusedTransform(const Compose& compose, int64_t channels, int64_t height, int64_t width);

  int64_t channels() const { return channels_; }
  int64_t output_height() const { return output_height_; }
  int64_t output_width() const { return output_width_; }

  // The randomness of a sample depends only on (seed, epoch, index): the same
  // sample gets the same crop and flip whichever thread builds it.
  SampleAugmentation draw(uint64_t seed, int64_t epoch, int64_t index) const;

  // Writes the transformed (C, H, W) uint8 `source` image to `out` with the
  // given strides. T is float, double, Half or BFloat16.
  template <class T>
  void apply(const uint8_t* source, const SampleAugmentation& augmentation, T* out, SampleStrides strides) const;

  // The output value of pixel value `value` in `channel`, in f32.
  float value_of(int64_t channel, uint8_t value) const { return table_f32_[channel * 256 + value]; }

 private:
  template <class T>
  const T* table() const;

  int64_t channels_, height_, width_;
  int64_t output_height_, output_width_;
  int64_t padding_ = 0;
  bool has_crop_ = false;
  double flip_probability_ = 0.0;
  // The random draws in composition order: crop and flip.
  std::vector<int> draw_order_;
  // (C, 256) lookup tables, one per output dtype.
  std::vector<float> table_f32_;
  std::vector<double> table_f64_;
  std::vector<Half> table_f16_;
  std::vector<BFloat16> table_bf16_;
};

}  // namespace loom::data
