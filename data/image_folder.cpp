// ImageFolder: the directory walk torchvision does, and the transforms applied
// per sample in the loader's workers. Decoding is in image_decode.cpp, PIL's
// resampling in image_resample.cpp.
#include <loom/data/image_folder.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <set>

#include <loom/core/error.h>
#include <loom/core/generator.h>
#include <loom/data/image_internal.h>
#include <loom/data/input_file.h>

namespace loom::data {
namespace fs = std::filesystem;

namespace {

using namespace image;

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

bool decodable_extension(const fs::path& path) {
  const std::string extension = lower(path.extension().string());
  return extension == ".jpg" || extension == ".jpeg" || extension == ".png";
}

// The other extensions torchvision's ImageFolder takes (IMG_EXTENSIONS).
bool other_image_extension(const fs::path& path) {
  const std::string extension = lower(path.extension().string());
  for (const char* other : {".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"}) {
    if (extension == other) return true;
  }
  return false;
}

// The window [top, top + height) x [left, left + width), zero outside the image.
DecodedImage crop(const DecodedImage& in, int64_t top, int64_t left, int64_t height, int64_t width) {
  DecodedImage out{height, width, in.channels, std::vector<uint8_t>(static_cast<size_t>(height * width * in.channels))};
  for (int64_t y = 0; y < height; ++y) {
    const int64_t source_y = top + y;
    if (source_y < 0 || source_y >= in.height) continue;
    for (int64_t x = 0; x < width; ++x) {
      const int64_t source_x = left + x;
      if (source_x < 0 || source_x >= in.width) continue;
      std::copy_n(in.pixels.data() + (source_y * in.width + source_x) * in.channels, in.channels,
                  out.pixels.data() + (y * width + x) * in.channels);
    }
  }
  return out;
}

DecodedImage flip_horizontal(const DecodedImage& in) {
  DecodedImage out = in;
  for (int64_t y = 0; y < in.height; ++y) {
    for (int64_t x = 0; x < in.width; ++x) {
      std::copy_n(in.pixels.data() + (y * in.width + x) * in.channels, in.channels,
                  out.pixels.data() + (y * in.width + (in.width - 1 - x)) * in.channels);
    }
  }
  return out;
}

// Python's round(): halves to even.
int64_t round_half_even(double value) { return static_cast<int64_t>(std::nearbyint(value)); }

// torchvision's RandomResizedCrop.get_params: (top, left, height, width).
std::array<int64_t, 4> random_resized_window(const RandomResizedCrop& spec, int64_t height, int64_t width,
                                             Generator& random) {
  const double area = static_cast<double>(height * width);
  const double log_min = std::log(spec.ratio_min), log_max = std::log(spec.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * random.uniform(spec.scale_min, spec.scale_max);
    const double aspect = std::exp(random.uniform(log_min, log_max));
    const int64_t w = round_half_even(std::sqrt(target_area * aspect));
    const int64_t h = round_half_even(std::sqrt(target_area / aspect));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      const int64_t top = static_cast<int64_t>(random.below(static_cast<uint64_t>(height - h + 1)));
      const int64_t left = static_cast<int64_t>(random.below(static_cast<uint64_t>(width - w + 1)));
      return {top, left, h, w};
    }
  }
  // Fallback: the centre crop of the nearest allowed aspect ratio.
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  int64_t w = width, h = height;
  if (in_ratio < spec.ratio_min) {
    h = round_half_even(static_cast<double>(width) / spec.ratio_min);
  } else if (in_ratio > spec.ratio_max) {
    w = round_half_even(static_cast<double>(height) * spec.ratio_max);
  }
  return {(height - h) / 2, (width - w) / 2, h, w};
}

}  // namespace

Normalize imagenet_normalize() { return {{0.485, 0.456, 0.406}, {0.229, 0.224, 0.225}}; }

std::vector<ImageTransform> imagenet_train_transforms(int64_t size) {
  return {RandomResizedCrop{size}, RandomHorizontalFlip{}, ToTensor{}, imagenet_normalize()};
}

std::vector<ImageTransform> imagenet_test_transforms(int64_t size) {
  return {Resize{size * 8 / 7}, CenterCrop{size}, ToTensor{}, imagenet_normalize()};
}

ImageFolderIndex index_image_folder(const fs::path& root) {
  if (!fs::is_directory(root)) LOOM_FAIL("image folder ", root.string(), " does not exist or is not a directory");
  ImageFolderIndex index;
  for (const fs::directory_entry& entry : fs::directory_iterator(root)) {
    if (entry.is_directory()) index.classes.push_back(entry.path().filename().string());
  }
  std::sort(index.classes.begin(), index.classes.end());
  if (index.classes.empty()) {
    LOOM_FAIL("image folder ", root.string(), " has no class directories; expected ", root.string(),
              "/<class>/<image>.jpg|jpeg|png as torchvision's ImageFolder reads");
  }
  for (size_t label = 0; label < index.classes.size(); ++label) {
    // os.walk(followlinks=True) sorted by directory path, each directory's files sorted by name.
    const fs::path class_dir = root / index.classes[label];
    std::vector<std::string> directories = {class_dir.string()};
    for (const fs::directory_entry& entry :
         fs::recursive_directory_iterator(class_dir, fs::directory_options::follow_directory_symlink)) {
      if (entry.is_directory()) directories.push_back(entry.path().string());
    }
    std::sort(directories.begin(), directories.end());
    const size_t before = index.files.size();
    for (const std::string& directory : directories) {
      std::vector<std::string> names;
      for (const fs::directory_entry& entry : fs::directory_iterator(directory)) {
        if (entry.is_directory()) continue;
        if (other_image_extension(entry.path())) {
          LOOM_FAIL("image folder ", root.string(), ": ", entry.path().string(),
                    " is an image torchvision would read but loom decodes only JPEG and PNG; convert or move it, so "
                    "that sample indices match torchvision's");
        }
        if (!decodable_extension(entry.path())) continue;
        // The directory listing's cached type, a stat only for a symbolic link
        // (followed, as torchvision does): no extra system call per image.
        std::error_code error;
        if (!entry.is_regular_file(error)) {
          // torchvision would list it and its loader would block on a FIFO for ever.
          const fs::file_status status = entry.status(error);
          LOOM_FAIL("image folder ", root.string(), ": ", entry.path().string(), " is ", describe_file_type(status),
                    ", not an image file; remove or rename it");
        }
        names.push_back(entry.path().filename().string());
      }
      std::sort(names.begin(), names.end());
      for (const std::string& name : names) {
        index.files.push_back(fs::path(directory) / name);
        index.labels.push_back(static_cast<int64_t>(label));
      }
    }
    if (index.files.size() == before) {
      LOOM_FAIL("image folder ", root.string(), ": class directory ", index.classes[label],
                " holds no .jpg, .jpeg or .png file (torchvision's ImageFolder refuses empty classes too)");
    }
  }
  return index;
}

bool is_image_folder(const fs::path& root) {
  std::error_code error;
  if (!fs::is_directory(root, error)) return false;
  for (const fs::directory_entry& entry : fs::directory_iterator(root, error)) {
    if (!entry.is_directory()) continue;
    for (const fs::directory_entry& file : fs::directory_iterator(entry.path(), error)) {
      if (decodable_extension(file.path())) return true;
    }
  }
  return false;
}

ImageFolderHoldOut split_image_folder(const ImageFolderIndex& index, double fraction, uint64_t seed) {
  if (!(fraction > 0.0 && fraction < 1.0)) {
    LOOM_FAIL("image folder hold-out: the validation fraction ", fraction, " must be above 0 and below 1");
  }
  std::vector<std::vector<size_t>> by_class(index.classes.size());
  for (size_t i = 0; i < index.files.size(); ++i) by_class.at(static_cast<size_t>(index.labels[i])).push_back(i);
  std::vector<bool> held(index.files.size(), false);
  for (size_t label = 0; label < by_class.size(); ++label) {
    std::vector<size_t>& samples = by_class[label];
    const auto n = static_cast<int64_t>(samples.size());
    const int64_t count = n < 2 ? 0 : std::clamp<int64_t>(std::llround(fraction * static_cast<double>(n)), 1, n - 1);
    // The first `count` places of a Fisher-Yates shuffle: a uniform draw without replacement.
    Generator random(Generator::mix(seed, label));
    for (int64_t i = 0; i < count; ++i) {
      const int64_t j = i + static_cast<int64_t>(random.below(static_cast<uint64_t>(n - i)));
      std::swap(samples[static_cast<size_t>(i)], samples[static_cast<size_t>(j)]);
      held[samples[static_cast<size_t>(i)]] = true;
    }
  }
  ImageFolderHoldOut split{{index.classes, {}, {}}, {index.classes, {}, {}}};
  for (size_t i = 0; i < index.files.size(); ++i) {
    ImageFolderIndex& half = held[i] ? split.held_out : split.train;
    half.files.push_back(index.files[i]);
    half.labels.push_back(index.labels[i]);
  }
  return split;
}

ImageFolder::ImageFolder(const fs::path& root, ImageFolderOptions options)
    : ImageFolder(root, index_image_folder(root), std::move(options)) {}

ImageFolder::ImageFolder(const fs::path& root, ImageFolderIndex index, ImageFolderOptions options)
    : root_(root), index_(std::move(index)), options_(std::move(options)) {
  shape_.channels = options_.color() == ColorMode::rgb ? 3 : 1;
  bool seen_to_tensor = false;
  int64_t size_height = 0, size_width = 0;  // the fixed output size, once a transform sets one
  mean_.assign(static_cast<size_t>(shape_.channels), 0.0f);
  std_.assign(static_cast<size_t>(shape_.channels), 1.0f);
  for (const ImageTransform& transform : options_.transforms()) {
    const bool after_tensor = seen_to_tensor && !std::holds_alternative<Normalize>(transform);
    LOOM_CHECK(!after_tensor, "ImageFolder transforms: only Normalize may follow ToTensor");
    if (const auto* resize = std::get_if<Resize>(&transform)) {
      LOOM_CHECK(resize->size > 0 && resize->width >= 0, "ImageFolder transforms: Resize(", resize->size, ", ",
                 resize->width, ") needs positive sizes");
      size_height = resize->width > 0 ? resize->size : 0;
      size_width = resize->width;
    } else if (const auto* center = std::get_if<CenterCrop>(&transform)) {
      LOOM_CHECK(center->size > 0, "ImageFolder transforms: CenterCrop size ", center->size, " must be positive");
      size_height = size_width = center->size;
    } else if (const auto* random_crop = std::get_if<RandomResizedCrop>(&transform)) {
      LOOM_CHECK(random_crop->size > 0 && random_crop->scale_min > 0 && random_crop->scale_min <= random_crop->scale_max &&
                     random_crop->scale_max <= 1 && random_crop->ratio_min > 0 &&
                     random_crop->ratio_min <= random_crop->ratio_max,
                 "ImageFolder transforms: RandomResizedCrop(", random_crop->size, ", scale=(", random_crop->scale_min,
                 ", ", random_crop->scale_max, "), ratio=(", random_crop->ratio_min, ", ", random_crop->ratio_max,
                 ")) is out of range");
      size_height = size_width = random_crop->size;
    } else if (const auto* flip = std::get_if<RandomHorizontalFlip>(&transform)) {
      LOOM_CHECK(flip->probability >= 0 && flip->probability <= 1, "ImageFolder transforms: RandomHorizontalFlip ",
                 "probability ", flip->probability, " must be in [0, 1]");
    } else if (std::holds_alternative<ToTensor>(transform)) {
      seen_to_tensor = true;
    } else if (const auto* normalize = std::get_if<Normalize>(&transform)) {
      LOOM_CHECK(seen_to_tensor, "ImageFolder transforms: Normalize must come after ToTensor");
      const size_t n = normalize->mean.size();
      LOOM_CHECK(n == normalize->std.size() && (n == 1 || n == static_cast<size_t>(shape_.channels)),
                 "ImageFolder transforms: Normalize has ", n, " means and ", normalize->std.size(),
                 " standard deviations for ", shape_.channels, "-channel images");
      for (int64_t c = 0; c < shape_.channels; ++c) {
        const size_t k = n == 1 ? 0 : static_cast<size_t>(c);
        LOOM_CHECK(normalize->std[k] != 0.0, "ImageFolder transforms: Normalize standard deviation is zero");
        mean_[c] = static_cast<float>(normalize->mean[k]);
        std_[c] = static_cast<float>(normalize->std[k]);
      }
    }
  }
  LOOM_CHECK(seen_to_tensor, "ImageFolder transforms: ToTensor is needed (the loader produces floating-point batches)");
  LOOM_CHECK(size_height > 0 && size_width > 0,
             "ImageFolder transforms: images of different sizes cannot share a batch; end the geometric transforms "
             "with CenterCrop(size), RandomResizedCrop(size) or Resize(height, width)");
  shape_.height = size_height;
  shape_.width = size_width;
  tensor_table_.resize(static_cast<size_t>(shape_.channels * 256));
  for (int64_t c = 0; c < shape_.channels; ++c) {
    // ToTensor then Normalize in f32, as torchvision computes them.
    for (int v = 0; v < 256; ++v) tensor_table_[c * 256 + v] = (static_cast<float>(v) / 255.0f - mean_[c]) / std_[c];
  }
  // torchvision's training pipeline on RGB gets the fused path (get_random_resized_crop).
  const std::vector<ImageTransform>& t = options_.transforms();
  size_t at = 0;
  if (options_.color() == ColorMode::rgb && at < t.size() && std::holds_alternative<RandomResizedCrop>(t[at])) {
    const RandomResizedCrop crop_spec = std::get<RandomResizedCrop>(t[at++]);
    std::optional<double> flip;
    if (at < t.size() && std::holds_alternative<RandomHorizontalFlip>(t[at])) {
      flip = std::get<RandomHorizontalFlip>(t[at++]).probability;
    }
    if (at < t.size() && std::holds_alternative<ToTensor>(t[at])) {
      ++at;
      if (at < t.size() && std::holds_alternative<Normalize>(t[at])) ++at;
      if (at == t.size()) {
        crop_pipeline_ = crop_spec;
        flip_probability_ = flip;
      }
    }
  }
}

DecodedImage ImageFolder::transform_pixels(DecodedImage image, Generator& random) const {
  for (const ImageTransform& transform : options_.transforms()) {
    if (const auto* resize = std::get_if<Resize>(&transform)) {
      if (resize->width > 0) {
        image = resize_bilinear(image, resize->size, resize->width);
      } else {
        const int64_t short_side = std::min(image.height, image.width), long_side = std::max(image.height, image.width);
        const int64_t new_long = resize->size * long_side / short_side;  // int(size * long / short)
        const bool portrait = image.height >= image.width;
        if (short_side != resize->size) {
          image = resize_bilinear(image, portrait ? new_long : resize->size, portrait ? resize->size : new_long);
        }
      }
    } else if (const auto* center = std::get_if<CenterCrop>(&transform)) {
      // torchvision pads a smaller image ((size - side) // 2 before), then crops round((side - size) / 2).
      const int64_t s = center->size;
      const int64_t pad_top = image.height < s ? (s - image.height) / 2 : 0;
      const int64_t pad_left = image.width < s ? (s - image.width) / 2 : 0;
      const int64_t padded_height = std::max(image.height, s), padded_width = std::max(image.width, s);
      const int64_t top = round_half_even(static_cast<double>(padded_height - s) / 2.0) - pad_top;
      const int64_t left = round_half_even(static_cast<double>(padded_width - s) / 2.0) - pad_left;
      image = crop(image, top, left, s, s);
    } else if (const auto* random_crop = std::get_if<RandomResizedCrop>(&transform)) {
      const auto [top, left, h, w] = random_resized_window(*random_crop, image.height, image.width, random);
      image = resize_bilinear(crop(image, top, left, h, w), random_crop->size, random_crop->size);
    } else if (const auto* flip = std::get_if<RandomHorizontalFlip>(&transform)) {
      if (random.uniform() < flip->probability) image = flip_horizontal(image);
    }
  }
  return image;
}

void ImageFolder::write_sample(const DecodedImage& image, SampleSlot& slot) const {
  LOOM_CHECK(image.height == shape_.height && image.width == shape_.width && image.channels == shape_.channels,
             "ImageFolder: a transformed image of ", image.height, "x", image.width, "x", image.channels,
             " does not match the sample shape");
  const int64_t plane = shape_.height * shape_.width;
  for (int64_t c = 0; c < shape_.channels; ++c) {
    const float* table = tensor_table_.data() + c * 256;
    float* out = slot.pixels + c * plane;
    const uint8_t* in = image.pixels.data() + c;
    for (int64_t i = 0; i < plane; ++i) out[i] = table[in[i * shape_.channels]];
  }
}

void ImageFolder::get_random_resized_crop(const std::vector<uint8_t>& bytes, const fs::path& path,
                                          SampleSlot& slot) const {
  thread_local JpegWindow jpeg_window;
  const bool jpeg = is_jpeg(bytes);
  JpegDecoder* decoder = nullptr;
  DecodedImage whole;  // a PNG, decoded in full
  int64_t image_height = 0, image_width = 0;
  if (jpeg) {
    decoder = &thread_jpeg_decoder();
    read_jpeg_header(*decoder, bytes, path);
    image_height = decoder->info.image_height;
    image_width = decoder->info.image_width;
  } else {
    whole = decode_image(bytes, path, ColorMode::rgb);
    image_height = whole.height;
    image_width = whole.width;
  }
  // The draws in transform_pixels' order: the window, then the flip.
  const auto [top, left, height, width] = random_resized_window(*crop_pipeline_, image_height, image_width, *slot.random);
  const bool flip = flip_probability_ && slot.random->uniform() < *flip_probability_;
  const uint8_t* window = nullptr;
  int64_t stride = 0;
  if (jpeg) {
    jpeg_decode_window(*decoder, path, top, left, height, width, jpeg_window);
    window = jpeg_window.pixels.data() + jpeg_window.offset;
    stride = jpeg_window.stride;
  } else {
    whole.pixels.resize(whole.pixels.size() + 4);  // the resampler reads 4 bytes per pixel
    window = whole.pixels.data() + (top * image_width + left) * 3;
    stride = image_width * 3;
  }
#if LOOM_IMAGE_SSE41
  if (has_sse41()) {
    thread_local ResampleScratch scratch;
    resample_rgb_to_tensor_sse41(window, stride, height, width, shape_.height, shape_.width, flip,
                                 tensor_table_.data(), slot.pixels, scratch);
    return;
  }
#endif
  DecodedImage cropped{height, width, 3, std::vector<uint8_t>(static_cast<size_t>(height * width * 3))};
  for (int64_t y = 0; y < height; ++y) {
    std::copy_n(window + y * stride, width * 3, cropped.pixels.data() + y * width * 3);
  }
  DecodedImage resized = resize_bilinear(cropped, shape_.height, shape_.width);
  write_sample(flip ? flip_horizontal(resized) : resized, slot);
}

int64_t ImageFolder::get(int64_t index, SampleSlot& slot) const {
  LOOM_CHECK(index >= 0 && index < size(), name(), ": sample index ", index, " is out of range for ", size(),
             " images");
  for (int64_t attempt = 0; attempt < size(); ++attempt) {
    const int64_t candidate = (index + attempt) % size();
    const fs::path& file = index_.files[candidate];
    DecodedImage decoded;
    const Generator before = *slot.random;
    try {
      if (crop_pipeline_) {
        get_random_resized_crop(read_file(file), file, slot);
        return index_.labels[candidate];
      }
      decoded = read_image(file, options_.color());
    } catch (const Error& error) {
      if (options_.on_error() == OnDecodeError::fail) throw;
      *slot.random = before;  // the replacement draws as if this file had not been read
      static std::mutex reported_mutex;
      static std::set<std::string> reported;
      std::lock_guard lock(reported_mutex);
      if (reported.insert(index_.files[candidate].string()).second) {
        std::fprintf(stderr, "warning: skipping %s\n", error.what());
      }
      ++skipped_;
      continue;
    }
    write_sample(transform_pixels(std::move(decoded), *slot.random), slot);
    return index_.labels[candidate];
  }
  LOOM_FAIL(name(), ": no image decodes");
}

}  // namespace loom::data
