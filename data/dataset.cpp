// ImageDataset: construction checks and bounds-checked access.
#include <loom/data/dataset.h>

#include <loom/core/error.h>

namespace loom::data {

ImageDataset::ImageDataset(int64_t channels, int64_t height, int64_t width, std::vector<uint8_t> pixels,
                           std::vector<int64_t> labels, std::string name)
    : count_(static_cast<int64_t>(labels.size())),
      channels_(channels),
      height_(height),
      width_(width),
      name_(std::move(name)) {
  LOOM_CHECK(channels > 0 && height > 0 && width > 0, "dataset ", name_, ": image shape (", channels, ", ", height,
             ", ", width, ") must be positive");
  LOOM_CHECK(static_cast<int64_t>(pixels.size()) == count_ * image_bytes(), "dataset ", name_, ": ", pixels.size(),
             " pixel bytes do not hold ", count_, " images of shape (", channels, ", ", height, ", ", width,
             "); expected ", count_ * image_bytes());
  contents_ = std::make_shared<const Contents>(Contents{std::move(pixels), std::move(labels)});
}

void ImageDataset::check_index(int64_t index) const {
  LOOM_CHECK(index >= 0 && index < count_, "dataset ", name_, ": sample index ", index, " is out of range for ",
             count_, " samples");
}

const uint8_t* ImageDataset::image(int64_t index) const {
  check_index(index);
  return contents_->pixels.data() + index * image_bytes();
}

uint8_t ImageDataset::pixel(int64_t index, int64_t channel, int64_t row, int64_t column) const {
  LOOM_CHECK(channel >= 0 && channel < channels_ && row >= 0 && row < height_ && column >= 0 && column < width_,
             "dataset ", name_, ": pixel (", channel, ", ", row, ", ", column, ") is outside images of shape (",
             channels_, ", ", height_, ", ", width_, ")");
  return image(index)[(channel * height_ + row) * width_ + column];
}

int64_t ImageDataset::label(int64_t index) const {
  check_index(index);
  return contents_->labels[index];
}

ImageDataset ImageDataset::subset(int64_t count) const {
  LOOM_CHECK(count >= 0 && count <= count_, "dataset ", name_, ": cannot take the first ", count, " of ", count_,
             " samples");
  ImageDataset first = *this;
  first.count_ = count;
  return first;
}

}  // namespace loom::data
