// The fused per-sample transform: validation of a Compose, the per-sample
// random draws, and the single gather loop that writes a sample.
#include <loom/data/transforms.h>

#include <algorithm>

#include <loom/core/error.h>
#include <loom/core/generator.h>

namespace loom::data {

namespace {
enum DrawKind : int { draw_crop = 0, draw_flip = 1 };
}  // namespace

Normalize cifar10_normalize() {
  return {{cifar10_mean.begin(), cifar10_mean.end()}, {cifar10_std.begin(), cifar10_std.end()}};
}

Normalize mnist_normalize() { return {{mnist_mean.begin(), mnist_mean.end()}, {mnist_std.begin(), mnist_std.end()}}; }

FusedTransform::FusedTransform(const Compose& compose, int64_t channels, int64_t height, int64_t width)
    : channels_(channels), height_(height), width_(width), output_height_(height), output_width_(width) {
  LOOM_CHECK(channels > 0 && height > 0 && width > 0, "transforms: input images of shape (", channels, ", ", height,
             ", ", width, ") must have positive sizes");
  bool seen_to_tensor = false, seen_normalize = false, seen_flip = false;
  std::vector<float> mean(channels, 0.0f), stddev(channels, 1.0f);
  for (const Transform& transform : compose.transforms()) {
    if (const auto* crop = std::get_if<RandomCrop>(&transform)) {
      LOOM_CHECK(!has_crop_, "transforms: RandomCrop appears twice; use one crop");
      LOOM_CHECK(!seen_normalize, "transforms: RandomCrop after Normalize is not supported (its zero padding would ",
                 "not be normalized); put RandomCrop before ToTensor as torchvision examples do");
      LOOM_CHECK(crop->padding >= 0, "transforms: RandomCrop padding ", crop->padding, " must be non-negative");
      LOOM_CHECK(crop->height > 0 && crop->width > 0 && crop->height <= height + 2 * crop->padding &&
                     crop->width <= width + 2 * crop->padding,
                 "transforms: RandomCrop of ", crop->height, "x", crop->width, " does not fit in ", height, "x",
                 width, " images padded by ", crop->padding);
      has_crop_ = true;
      padding_ = crop->padding;
      output_height_ = crop->height;
      output_width_ = crop->width;
      draw_order_.push_back(draw_crop);
    } else if (const auto* flip = std::get_if<RandomHorizontalFlip>(&transform)) {
      LOOM_CHECK(!seen_flip, "transforms: RandomHorizontalFlip appears twice; use one flip");
      LOOM_CHECK(flip->probability >= 0.0 && flip->probability <= 1.0, "transforms: RandomHorizontalFlip ",
                 "probability ", flip->probability, " must be in [0, 1]");
      seen_flip = true;
      flip_probability_ = flip->probability;
      draw_order_.push_back(draw_flip);
    } else if (std::holds_alternative<ToTensor>(transform)) {
      LOOM_CHECK(!seen_to_tensor, "transforms: ToTensor appears twice; use it once");
      seen_to_tensor = true;
    } else if (const auto* normalize = std::get_if<Normalize>(&transform)) {
      LOOM_CHECK(seen_to_tensor, "transforms: Normalize must come after ToTensor");
      LOOM_CHECK(!seen_normalize, "transforms: Normalize appears twice; use it once");
      const size_t n = normalize->mean.size();
      LOOM_CHECK(n == normalize->std.size() && (n == 1 || n == static_cast<size_t>(channels)),
                 "transforms: Normalize has ", n, " means and ", normalize->std.size(), " standard deviations for ",
                 channels, "-channel images; give one value or one per channel");
      for (int64_t c = 0; c < channels; ++c) {
        const size_t k = n == 1 ? 0 : static_cast<size_t>(c);
        LOOM_CHECK(normalize->std[k] != 0.0, "transforms: Normalize standard deviation of channel ", c, " is zero");
        mean[c] = static_cast<float>(normalize->mean[k]);
        stddev[c] = static_cast<float>(normalize->std[k]);
      }
      seen_normalize = true;
    }
  }
  LOOM_CHECK(seen_to_tensor, "transforms: the composition needs ToTensor, because the loader produces floating-",
             "point batches");

  // The same f32 operations torchvision performs: ToTensor divides by 255,
  // Normalize subtracts the mean and divides by the standard deviation.
  table_f32_.resize(channels * 256);
  for (int64_t c = 0; c < channels; ++c) {
    for (int v = 0; v < 256; ++v) {
      float x = static_cast<float>(v) / 255.0f;
      if (seen_normalize) x = (x - mean[c]) / stddev[c];
      table_f32_[c * 256 + v] = x;
    }
  }
  for (float x : table_f32_) {
    table_f64_.push_back(x);
    table_f16_.push_back(Half(x));
    table_bf16_.push_back(BFloat16(x));
  }
}

SampleAugmentation FusedTransform::draw(uint64_t seed, int64_t epoch, int64_t index) const {
  SampleAugmentation augmentation;
  if (draw_order_.empty()) return augmentation;
  Generator random(Generator::mix(Generator::mix(seed, static_cast<uint64_t>(epoch)), static_cast<uint64_t>(index)));
  for (int kind : draw_order_) {
    if (kind == draw_crop) {
      // Offsets of the window inside the padded image, as torchvision draws them.
      const uint64_t rows = static_cast<uint64_t>(height_ + 2 * padding_ - output_height_ + 1);
      const uint64_t columns = static_cast<uint64_t>(width_ + 2 * padding_ - output_width_ + 1);
      augmentation.top = static_cast<int64_t>(random.below(rows)) - padding_;
      augmentation.left = static_cast<int64_t>(random.below(columns)) - padding_;
    } else {
      augmentation.flip = random.uniform() < flip_probability_;
    }
  }
  return augmentation;
}

template <>
const float* FusedTransform::table<float>() const { return table_f32_.data(); }
template <>
const double* FusedTransform::table<double>() const { return table_f64_.data(); }
template <>
const Half* FusedTransform::table<Half>() const { return table_f16_.data(); }
template <>
const BFloat16* FusedTransform::table<BFloat16>() const { return table_bf16_.data(); }

namespace {

// One output row: out[x] = lookup[source_row[first_column + x]] (or, flipped,
// source_row[first_column - x]) for x in [valid_begin, valid_end), and the
// padding value elsewhere. Column stride 1 (NCHW) gets its own instantiation
// so the compiler sees contiguous stores.
template <class T, bool unit_stride>
inline void write_row(T* out, int64_t column_stride, int64_t output_width, const uint8_t* source_row,
                      int64_t first_column, bool flip, int64_t valid_begin, int64_t valid_end, const T* lookup,
                      T pad) {
  const int64_t stride = unit_stride ? 1 : column_stride;
  for (int64_t x = 0; x < valid_begin; ++x) out[x * stride] = pad;
  if (flip) {
    const uint8_t* from = source_row + first_column;
    for (int64_t x = valid_begin; x < valid_end; ++x) out[x * stride] = lookup[from[-x]];
  } else {
    const uint8_t* from = source_row + first_column;
    for (int64_t x = valid_begin; x < valid_end; ++x) out[x * stride] = lookup[from[x]];
  }
  for (int64_t x = valid_end; x < output_width; ++x) out[x * stride] = pad;
}

}  // namespace

template <class T>
void FusedTransform::apply(const uint8_t* source, const SampleAugmentation& augmentation, T* out,
                           SampleStrides strides) const {
  const int64_t top = augmentation.top, left = augmentation.left;
  // Output column x reads source column left + x, or left + (W_out - 1 - x)
  // when flipped; [valid_begin, valid_end) is where that column is inside
  // the image rather than in the zero padding.
  int64_t first_column, valid_begin, valid_end;
  if (augmentation.flip) {
    first_column = left + output_width_ - 1;
    valid_begin = std::max<int64_t>(0, left + output_width_ - width_);
    valid_end = std::min<int64_t>(output_width_, left + output_width_);
  } else {
    first_column = left;
    valid_begin = std::max<int64_t>(0, -left);
    valid_end = std::min<int64_t>(output_width_, width_ - left);
  }
  valid_end = std::max(valid_end, valid_begin);
  const T* tables = table<T>();
  for (int64_t c = 0; c < channels_; ++c) {
    const uint8_t* plane = source + c * height_ * width_;
    const T* lookup = tables + c * 256;
    const T pad = lookup[0];  // torchvision pads the uint8 image with 0 before ToTensor
    for (int64_t y = 0; y < output_height_; ++y) {
      T* row = out + c * strides.channel + y * strides.row;
      const int64_t source_y = top + y;
      const bool inside = source_y >= 0 && source_y < height_;
      // A row in the vertical padding is all padding: an empty valid range.
      const int64_t begin = inside ? valid_begin : output_width_;
      const int64_t end = inside ? valid_end : output_width_;
      const uint8_t* source_row = inside ? plane + source_y * width_ : plane;
      if (strides.column == 1) {
        write_row<T, true>(row, 1, output_width_, source_row, first_column, augmentation.flip, begin, end, lookup,
                           pad);
      } else {
        write_row<T, false>(row, strides.column, output_width_, source_row, first_column, augmentation.flip, begin,
                            end, lookup, pad);
      }
    }
  }
}

template void FusedTransform::apply<float>(const uint8_t*, const SampleAugmentation&, float*, SampleStrides) const;
template void FusedTransform::apply<double>(const uint8_t*, const SampleAugmentation&, double*, SampleStrides) const;
template void FusedTransform::apply<Half>(const uint8_t*, const SampleAugmentation&, Half*, SampleStrides) const;
template void FusedTransform::apply<BFloat16>(const uint8_t*, const SampleAugmentation&, BFloat16*,
                                              SampleStrides) const;

}  // namespace loom::data
