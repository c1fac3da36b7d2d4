// torchvision's ImageFolder: root/<class>/**/*.jpg|jpeg|png, classes sorted
// as torchvision sorts them, each image decoded (libjpeg-turbo, libpng) and
// transformed in the loader's worker threads: Resize, CenterCrop,
// RandomResizedCrop, RandomHorizontalFlip, ToTensor, Normalize, with PIL's
// antialiased bilinear resampling.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <loom/core/options.h>
#include <loom/data/dataset.h>
#include <loom/data/transforms.h>

namespace loom::data {

// An 8-bit image, (height, width, channels) interleaved, as PIL holds it.
struct DecodedImage {
  int64_t height = 0;
  int64_t width = 0;
  int64_t channels = 0;  // 1 (L) or 3 (RGB)
  std::vector<uint8_t> pixels;
};

enum class ColorMode { rgb, grayscale };

// Decodes a JPEG or PNG (told apart by their signatures) from memory into RGB,
// as PIL's Image.open(path).convert("RGB") gives it (alpha dropped, palettes
// expanded, 16-bit samples reduced to 8), or into one luma channel as
// convert("L") (L = (19595 R + 38470 G + 7471 B + 2^15) >> 16). Throws
// loom::Error naming `path` when the data is not a JPEG or PNG or does not decode.
DecodedImage decode_image(const std::vector<uint8_t>& bytes, const std::filesystem::path& path, ColorMode mode);
// Reads the file and decodes it.
DecodedImage read_image(const std::filesystem::path& path, ColorMode mode);

// Decodes only the window [top, top + height) x [left, left + width) of a
// JPEG into RGB: the same pixels as decode_image(bytes, path, rgb) in that
// window, bit for bit, at a fraction of the cost (libjpeg-turbo skips the
// rows above the window, does not decode those below it, and runs the inverse
// DCT and colour conversion only on the columns around it). Data after the
// window is not read, so damage there goes unnoticed. Throws loom::Error
// naming `path` when the data does not decode or the window is not inside the image.
DecodedImage decode_jpeg_window(const std::vector<uint8_t>& bytes, const std::filesystem::path& path, int64_t top,
                                int64_t left, int64_t height, int64_t width);

// Resizes with PIL's antialiased bilinear filter (Image.resize(size,
// BILINEAR), which torchvision's Resize uses on PIL images): a triangle
// filter widened by the scale factor, horizontal pass then vertical, 8-bit
// fixed-point coefficients rounded as PIL rounds them.
DecodedImage resize_bilinear(const DecodedImage& image, int64_t height, int64_t width);

// torchvision.transforms.Resize: `size` alone resizes the shorter side to it
// (the longer side to int(size * long / short)); height and width both given
// resize to exactly that.
struct Resize {
  int64_t size = 0;
  int64_t width = 0;  // 0: `size` is the shorter side; else `size` is the height
};
// torchvision.transforms.CenterCrop(size): the centre window, zero-padded when the image is smaller.
struct CenterCrop {
  int64_t size = 0;
};
// torchvision.transforms.RandomResizedCrop(size, scale, ratio): a random window
// of scale x the area and aspect ratio in `ratio` (log-uniform), resized to size x size.
struct RandomResizedCrop {
  int64_t size = 0;
  double scale_min = 0.08, scale_max = 1.0;
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;
};

using ImageTransform = std::variant<Resize, CenterCrop, RandomResizedCrop, RandomHorizontalFlip, ToTensor, Normalize>;

// What to do with a file that does not decode: stop the epoch with an error
// naming it, or replace the sample by the next image of the folder that
// decodes (and say so once per file on stderr).
enum class OnDecodeError { fail, skip };

class ImageFolderOptions {
  // Channels of the decoded images: rgb (3) or grayscale (1).
  LOOM_OPTION(ColorMode, color) = ColorMode::rgb;
  // Applied in order. Must end with a fixed size (CenterCrop,
  // RandomResizedCrop or Resize with height and width) and include ToTensor.
  LOOM_OPTION(std::vector<ImageTransform>, transforms);
  // What to do with a file that does not decode (see OnDecodeError).
  LOOM_OPTION(OnDecodeError, on_error) = OnDecodeError::fail;
};

// The ImageNet-style pipelines torchvision's examples use, at `size`:
// train: RandomResizedCrop(size), RandomHorizontalFlip, ToTensor, Normalize;
// test: Resize(size * 8 / 7), CenterCrop(size), ToTensor, Normalize
// (Resize(256) + CenterCrop(224) at 224), with ImageNet's mean and std.
std::vector<ImageTransform> imagenet_train_transforms(int64_t size);
std::vector<ImageTransform> imagenet_test_transforms(int64_t size);
Normalize imagenet_normalize();

// The files and classes of an image folder as torchvision's
// datasets.ImageFolder finds them: class names are the sub-directories of
// `root` sorted by name (label = position), samples are every .jpg, .jpeg
// and .png (any case) under each class directory, walked recursively in
// sorted order. Throws naming the directory when `root` has no class
// directories, a class has no images, or a file with an image extension
// loom does not decode (.bmp, .webp, ...) would shift torchvision's indices.
struct ImageFolderIndex {
  std::vector<std::string> classes;
  std::vector<std::filesystem::path> files;
  std::vector<int64_t> labels;
};
ImageFolderIndex index_image_folder(const std::filesystem::path& root);

// True when `root` looks like an image folder (has a sub-directory holding a .jpg, .jpeg or .png).
bool is_image_folder(const std::filesystem::path& root);

// An image folder's samples split in two: a validation set held out of one
// folder, as ImageFolder(root) plus a stratified split gives it in PyTorch.
struct ImageFolderHoldOut {
  ImageFolderIndex train;
  ImageFolderIndex held_out;
};
// Holds out, per class, round(fraction x n) of the class's n samples (at
// least one and never all of them when n >= 2; a class of one sample stays in
// training), drawn by a generator seeded with `seed` and the class's label,
// so every rank and every run with the same seed splits alike. Both halves
// keep all the classes and their samples in `index`'s order. Throws unless
// 0 < fraction < 1.
ImageFolderHoldOut split_image_folder(const ImageFolderIndex& index, double fraction, uint64_t seed);

class ImageFolder : public Dataset {
 public:
  ImageFolder(const std::filesystem::path& root, ImageFolderOptions options);
  // The samples of `index` (e.g. one half of split_image_folder), found under `root`.
  ImageFolder(const std::filesystem::path& root, ImageFolderIndex index, ImageFolderOptions options);

  int64_t size() const override { return static_cast<int64_t>(index_.files.size()); }
  SampleShape sample_shape() const override { return shape_; }
  // Decodes file `index` and applies the transforms with the slot's generator.
  int64_t get(int64_t index, SampleSlot& slot) const override;
  std::string name() const override { return "ImageFolder " + root_.string(); }

  const std::vector<std::string>& classes() const { return index_.classes; }
  const std::filesystem::path& file(int64_t index) const { return index_.files.at(static_cast<size_t>(index)); }
  int64_t label(int64_t index) const { return index_.labels.at(static_cast<size_t>(index)); }
  // Files replaced because they did not decode (OnDecodeError::skip), counted per get().
  int64_t skipped() const { return skipped_.load(); }

  // True when get() takes the fused path: RGB with RandomResizedCrop,
  // optionally RandomHorizontalFlip, ToTensor, optionally Normalize.
  bool fused_pipeline() const { return crop_pipeline_.has_value(); }

  // The transforms up to ToTensor applied to one decoded image: what get()
  // writes, before Normalize, as uint8 (for tests against PIL).
  DecodedImage transform_pixels(DecodedImage image, Generator& random) const;

 private:
  void write_sample(const DecodedImage& image, SampleSlot& slot) const;
  // RandomResizedCrop [+ RandomHorizontalFlip] + ToTensor [+ Normalize] on RGB,
  // torchvision's training pipeline: the window is drawn from the file's
  // header, only it is decoded (JPEG), and resize, flip and normalize write
  // straight into the slot. Same values as transform_pixels + write_sample.
  void get_random_resized_crop(const std::vector<uint8_t>& bytes, const std::filesystem::path& path,
                               SampleSlot& slot) const;

  std::filesystem::path root_;
  ImageFolderIndex index_;
  ImageFolderOptions options_;
  SampleShape shape_;
  std::vector<float> mean_, std_;  // per channel; identity when there is no Normalize
  std::vector<float> tensor_table_;  // (channel, 256): ToTensor then Normalize of each 8-bit value
  std::optional<RandomResizedCrop> crop_pipeline_;  // set when get_random_resized_crop applies
  std::optional<double> flip_probability_;          // that pipeline's flip, if it has one
  mutable std::atomic<int64_t> skipped_{0};
};

}  // namespace loom::data
