// ImageFolder against PIL and torchvision's rules on a tree written by PIL
// (tests/data/make_image_folder.py): class order and labels, decoded pixels
// (RGB and L), Resize + CenterCrop, the loader sharded by DistributedSampler,
// and decode errors failing or skipped per the flag.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>

#include <zlib.h>

#include <loom/core/generator.h>
#include <loom/data/image_folder.h>
#include <loom/data/loader.h>
#include <loom/data/sampler.h>
#include "tests/data/helpers.h"

using namespace loom::data;
using namespace loom::data::testing;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kSize = 24;

struct Tree {
  TempDir dir;
  fs::path root() const { return dir / "tree"; }
  fs::path expected(const std::string& name) const { return dir / "expected" / name; }
};

std::unique_ptr<Tree> make_tree() {
  const std::string python = python_with("PIL");
  REQUIRE_MESSAGE(!python.empty(), "no python3 with PIL: apt-get install python3-pil");
  auto tree = std::make_unique<Tree>();
  run_python(python, str_args("make_image_folder.py", tree->dir.path().string(), "--size", std::to_string(kSize)));
  return tree;
}

std::vector<std::string> lines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

int max_difference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  REQUIRE(a.size() == b.size());
  int worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(int{a[i]} - int{b[i]}));
  return worst;
}

bool is_jpeg(const fs::path& path) {
  std::string extension = path.extension().string();
  for (char& c : extension) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return extension == ".jpg" || extension == ".jpeg";
}

}  // namespace

TEST_CASE("ImageFolder finds the classes and samples in torchvision's order, with its labels") {
  const auto tree = make_tree();
  const ImageFolderIndex index = index_image_folder(tree->root());
  CHECK(index.classes == lines(tree->expected("classes.txt")));
  const std::vector<std::string> samples = lines(tree->expected("samples.txt"));
  REQUIRE(index.files.size() == samples.size());
  for (size_t i = 0; i < samples.size(); ++i) {
    CAPTURE(samples[i]);
    const size_t tab = samples[i].find('\t');
    CHECK(index.labels[i] == std::stoll(samples[i].substr(0, tab)));
    CHECK(fs::relative(index.files[i], tree->root()).string() == samples[i].substr(tab + 1));
  }
  CHECK(is_image_folder(tree->root()));
  CHECK_FALSE(is_image_folder(tree->root() / "b_cat" / "sub"));
}

TEST_CASE("torchvision's own ImageFolder gives the same classes, order and labels") {
  const std::string python = python_with("torchvision");
  if (python.empty()) {
    MESSAGE("skipped: no python3 with torchvision (apt-get install python3-torchvision, scripts/setup.sh --peers)");
    return;
  }
  const auto tree = make_tree();
  run_python(python, str_args("torchvision_view.py folder", tree->root().string(), (tree->dir / "view").string()));
  const ImageFolderIndex index = index_image_folder(tree->root());
  CHECK(index.classes == lines(tree->dir / "view" / "classes.txt"));
  const std::vector<std::string> samples = lines(tree->dir / "view" / "samples.txt");
  REQUIRE(index.files.size() == samples.size());
  for (size_t i = 0; i < samples.size(); ++i) {
    CHECK(std::to_string(index.labels[i]) + "\t" + fs::relative(index.files[i], tree->root()).string() == samples[i]);
  }
}

TEST_CASE("decoded pixels equal PIL's convert('RGB') and convert('L'): PNG exactly, JPEG within 2 levels") {
  const auto tree = make_tree();
  const ImageFolderIndex index = index_image_folder(tree->root());
  for (size_t i = 0; i < index.files.size(); ++i) {
    CAPTURE(index.files[i].string());
    const int tolerance = is_jpeg(index.files[i]) ? 2 : 0;
    const DecodedImage rgb = read_image(index.files[i], ColorMode::rgb);
    CHECK(rgb.channels == 3);
    CHECK(max_difference(rgb.pixels, read_bytes(tree->expected(std::to_string(i) + ".rgb"))) <= tolerance);
    const DecodedImage luma = read_image(index.files[i], ColorMode::grayscale);
    CHECK(luma.channels == 1);
    CHECK(max_difference(luma.pixels, read_bytes(tree->expected(std::to_string(i) + ".l"))) <= tolerance);
  }
}

TEST_CASE("Resize(shorter side) + CenterCrop equal PIL's bilinear resize and torchvision's window") {
  const auto tree = make_tree();
  ImageFolder folder(tree->root(), ImageFolderOptions().transforms({Resize{kSize}, CenterCrop{kSize}, ToTensor{}}));
  CHECK(folder.sample_shape().channels == 3);
  CHECK(folder.sample_shape().height == kSize);
  loom::Generator unused(0);
  for (int64_t i = 0; i < folder.size(); ++i) {
    CAPTURE(folder.file(i).string());
    // From PIL's own decoded pixels, so that only the resampling is compared.
    const std::vector<uint8_t> pil = read_bytes(tree->expected(std::to_string(i) + ".rgb"));
    const DecodedImage decoded = read_image(folder.file(i), ColorMode::rgb);
    DecodedImage from_pil = decoded;
    from_pil.pixels = pil;
    const DecodedImage out = folder.transform_pixels(from_pil, unused);
    REQUIRE(out.height == kSize);
    REQUIRE(out.width == kSize);
    CHECK(max_difference(out.pixels, read_bytes(tree->expected(std::to_string(i) + ".resized"))) <= 1);
  }
}

TEST_CASE("an ImageFolder in the loader: workers, a DistributedSampler shard per rank, normalized batches") {
  const auto tree = make_tree();
  auto folder = std::make_shared<ImageFolder>(
      tree->root(), ImageFolderOptions().transforms(imagenet_train_transforms(16)).on_error(OnDecodeError::fail));
  CHECK(folder->classes().size() == 5);
  std::set<int64_t> seen;
  for (int64_t rank = 0; rank < 2; ++rank) {
    auto sampler = std::make_shared<DistributedSampler>(folder->size(), 2, rank, true, 3);
    DataLoader loader(folder, DataLoaderOptions().batch_size(4).num_workers(2).seed(1), sampler);
    sampler->set_epoch(0);
    const std::vector<int64_t> order = sampler->indices();
    size_t position = 0;
    for (Batch& batch : loader.epoch(0)) {
      REQUIRE(batch.images.size(1) == 3);
      REQUIRE(batch.images.size(2) == 16);
      REQUIRE(batch.images.size(3) == 16);
      const std::vector<int64_t> labels = batch.labels.to_vector<int64_t>();
      const std::vector<float> values = batch.images.contiguous().to_vector<float>();
      for (const float value : values) REQUIRE(std::abs(value) <= 2.7f);  // (x / 255 - mean) / std, ImageNet stats
      for (const int64_t label : labels) {
        REQUIRE(label == folder->label(order[position]));
        seen.insert(order[position++]);
      }
    }
    CHECK(position == order.size());
  }
  CHECK(static_cast<int64_t>(seen.size()) == folder->size());
}

TEST_CASE("a file that does not decode fails naming it, or is skipped with the flag") {
  TempDir dir;
  const std::string python = python_with("PIL");
  REQUIRE(!python.empty());
  run_python(python, str_args("make_image_folder.py", dir.path().string()));
  const fs::path bad = dir / "tree" / "b_cat" / "c.jpg";
  std::vector<uint8_t> bytes = read_bytes(bad);
  bytes.resize(bytes.size() / 2);
  write_bytes(bad, bytes);
  write_bytes(dir / "tree" / "b_cat" / "sub" / "z.jpeg", {'G', 'I', 'F', '8', '9', 'a'});
  const std::vector<ImageTransform> transforms = {CenterCrop{8}, ToTensor{}};
  {
    auto folder = std::make_shared<ImageFolder>(dir / "tree", ImageFolderOptions().transforms(transforms));
    DataLoader loader(folder, DataLoaderOptions().batch_size(20));
    const std::string message = error_message([&] { loader.epoch(0).begin(); });
    CHECK(message.find("ImageFolder " + (dir / "tree").string() + ", sample 7: image " + bad.string() +
                       ": not a readable JPEG") != std::string::npos);
    CHECK(error_message([&] { read_image(dir / "tree" / "b_cat" / "sub" / "z.jpeg", ColorMode::rgb); })
              .find("neither a JPEG nor a PNG") != std::string::npos);
  }
  auto folder = std::make_shared<ImageFolder>(
      dir / "tree", ImageFolderOptions().transforms(transforms).on_error(OnDecodeError::skip));
  DataLoader loader(folder, DataLoaderOptions().batch_size(20));
  int64_t batches = 0;
  for (Batch& batch : loader.epoch(0)) {
    CHECK(batch.size() == folder->size());
    ++batches;
  }
  CHECK(batches == 1);
  // Sample 7 (c.jpg) skips c.jpg and z.jpeg, sample 8 skips z.jpeg: three replacements.
  CHECK(folder->skipped() == 3);
}

TEST_CASE("image folders without classes, with empty classes or other image formats are refused by name") {
  TempDir dir;
  CHECK(error_message([&] { index_image_folder(dir.path()); }).find("has no class directories") != std::string::npos);
  fs::create_directories(dir / "cats");
  write_bytes(dir / "cats" / "readme.txt", {'x'});
  CHECK(error_message([&] { index_image_folder(dir.path()); })
            .find("class directory cats holds no .jpg, .jpeg or .png file") != std::string::npos);
  write_bytes(dir / "cats" / "a.bmp", {'B', 'M'});
  CHECK(error_message([&] { index_image_folder(dir.path()); })
            .find((dir / "cats" / "a.bmp").string() + " is an image torchvision would read but loom decodes only") !=
        std::string::npos);
  CHECK(error_message([&] { ImageFolder(dir / "nothing", {}); }).find("does not exist") != std::string::npos);
}

namespace {

// Writes side x side into the frame header (SOF0/1/2) of the JPEG `jpeg`.
void set_jpeg_size(std::vector<uint8_t>& jpeg, uint16_t side) {
  for (size_t i = 2; i + 9 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xFF && (jpeg[i + 1] == 0xC0 || jpeg[i + 1] == 0xC1 || jpeg[i + 1] == 0xC2)) {
      for (size_t k : {i + 5, i + 7}) {
        jpeg[k] = static_cast<uint8_t>(side >> 8);
        jpeg[k + 1] = static_cast<uint8_t>(side & 0xFF);
      }
      return;
    }
  }
  FAIL("no frame header in the JPEG");
}

}  // namespace

TEST_CASE("an image whose header declares more pixels than PIL's limit is refused before decoding") {
  TempDir dir;
  const std::string python = python_with("PIL");
  REQUIRE(!python.empty());
  run_python(python, str_args("make_image_folder.py", dir.path().string()));
  // 60000 x 60000 pixels (3.6e9; the limit is 178956970), written into the
  // dimensions of a real JPEG's frame header and of a real PNG's IHDR chunk
  // (its CRC recomputed): each file is a few hundred bytes.
  std::vector<uint8_t> jpeg, png;
  for (const auto& entry : fs::recursive_directory_iterator(dir / "tree")) {
    if (entry.path().extension() == ".jpg" && jpeg.empty()) jpeg = read_bytes(entry.path());
    if (entry.path().extension() == ".png" && png.empty()) png = read_bytes(entry.path());
  }
  REQUIRE(!jpeg.empty());
  REQUIRE(!png.empty());
  set_jpeg_size(jpeg, 60000);
  for (size_t k : {16, 20}) {
    const uint32_t side = 60000;
    for (int b = 0; b < 4; ++b) png[k + b] = static_cast<uint8_t>(side >> (24 - 8 * b));
  }
  const uint32_t crc = static_cast<uint32_t>(crc32(0, png.data() + 12, 17));  // "IHDR" and its 13 bytes
  for (int b = 0; b < 4; ++b) png[29 + b] = static_cast<uint8_t>(crc >> (24 - 8 * b));
  for (const auto& image : {std::pair{"huge.jpg", jpeg}, std::pair{"huge.png", png}}) {
    // Variables, not structured bindings: clang 14 cannot capture those in doctest's INFO.
    const char* name = image.first;
    const std::vector<uint8_t>& bytes = image.second;
    CAPTURE(name);
    const std::string message = error_message([&] { decode_image(bytes, name, ColorMode::rgb); });
    CHECK(message.find(std::string("image ") + name + ": its header declares 60000x60000 pixels, over the limit of "
                       "178956970") != std::string::npos);
  }
}

namespace {

// tests/data/make_jpegs.py: larger JPEGs of every subsampling, grayscale, progressive, restart markers, and a PNG.
std::unique_ptr<TempDir> make_jpegs() {
  const std::string python = python_with("PIL");
  REQUIRE_MESSAGE(!python.empty(), "no python3 with PIL: apt-get install python3-pil");
  auto dir = std::make_unique<TempDir>();
  run_python(python, str_args("make_jpegs.py", dir->path().string()));
  return dir;
}

}  // namespace

TEST_CASE("a progressive JPEG whose decoding would take over 768 MiB is refused before decoding") {
  // 13000 x 13000 pixels, within PIL's limit: 484 MiB of RGB pixels, plus in a
  // progressive 4:2:0 file libjpeg's coefficient buffer, 128 bytes per 8x8
  // block: 1625^2 luma and 2 x 813^2 chroma blocks (rounded up to whole MCUs).
  const auto dir = make_jpegs();
  std::vector<uint8_t> progressive = read_bytes(dir->path() / "tree" / "b" / "progressive.jpg");
  std::vector<uint8_t> baseline = read_bytes(dir->path() / "tree" / "a" / "s420.jpg");
  set_jpeg_size(progressive, 13000);
  set_jpeg_size(baseline, 13000);
  const uint64_t coefficients = (1626ull * 1626 + 2 * 813ull * 813) * 128;
  const uint64_t mib = (13000ull * 13000 * 3 + coefficients) >> 20;
  const std::string expected = "image huge.jpg: decoding its 13000x13000 pixels takes " + std::to_string(mib) +
                               " MiB, over the limit of 768 MiB per image";
  CHECK(error_message([&] { decode_image(progressive, "huge.jpg", ColorMode::rgb); }).find(expected) !=
        std::string::npos);
  CHECK(error_message([&] { decode_jpeg_window(progressive, "huge.jpg", 0, 0, 8, 8); }).find(expected) !=
        std::string::npos);
  // The same size in a baseline file needs only the pixels (484 MiB), but the
  // file's few kilobytes cannot hold the 2.6 million luma blocks it declares.
  const std::string too_short = "image huge.jpg: its header declares 13000x13000 pixels in " +
                                std::to_string(1625ull * 1625 + 2 * 813ull * 813) + " blocks of 8x8, more than its " +
                                std::to_string(baseline.size()) + " bytes can hold";
  CHECK(error_message([&] { decode_jpeg_window(baseline, "huge.jpg", 0, 0, 8, 8); }).find(too_short) !=
        std::string::npos);
  CHECK(error_message([&] { decode_image(baseline, "huge.jpg", ColorMode::rgb); }).find(too_short) !=
        std::string::npos);
}

TEST_CASE("a JPEG too short for the blocks it declares is refused; the smallest real files decode") {
  // Blank 3000x3000 images as small as PIL writes them: progressive, and
  // baseline with optimized Huffman tables, about 2 bits per block (the bound
  // is 1 bit: 3000x3000 4:2:0 is 375^2 luma + 2 x 188^2 chroma blocks).
  const auto dir = make_jpegs();
  const uint64_t blocks = 375ull * 375 + 2 * 188ull * 188;
  for (const char* name : {"progressive.jpg", "optimized.jpg"}) {
    CAPTURE(name);
    std::vector<uint8_t> bytes = read_bytes(dir->path() / "blank" / name);
    CHECK(bytes.size() < blocks * 3 / 8);  // under 3 bits per block: the bound is close to real files, yet below them
    const DecodedImage image = decode_image(bytes, name, ColorMode::rgb);
    CHECK(image.height == 3000);
    CHECK(image.width == 3000);
    CHECK(image.pixels[3 * (1500 * 3000 + 1500)] == 128);
    CHECK(decode_jpeg_window(bytes, name, 2990, 2990, 10, 10).pixels[0] == 128);
    // Cut below one bit per block, the same file is refused before decoding.
    bytes.resize(blocks / 8 - 1);
    const std::string message = std::string("image ") + name + ": its header declares 3000x3000 pixels in " +
                                std::to_string(blocks) + " blocks of 8x8, more than its " +
                                std::to_string(blocks / 8 - 1) + " bytes can hold";
    CHECK(error_message([&] { decode_image(bytes, name, ColorMode::rgb); }).find(message) != std::string::npos);
    CHECK(error_message([&] { decode_jpeg_window(bytes, name, 0, 0, 8, 8); }).find(message) != std::string::npos);
  }
}

TEST_CASE("a JPEG window decoded alone equals the full decode's window, bit for bit") {
  const auto dir = make_jpegs();
  const ImageFolderIndex index = index_image_folder(*dir / "tree");
  loom::Generator random(7);
  int64_t windows = 0;
  for (const fs::path& file : index.files) {
    if (!is_jpeg(file)) continue;
    CAPTURE(file.string());
    const std::vector<uint8_t> bytes = read_bytes(file);
    const DecodedImage full = decode_image(bytes, file, ColorMode::rgb);
    const int64_t height = full.height, width = full.width;
    // Corners, edges, single pixels, the whole image, then random windows.
    std::vector<std::array<int64_t, 4>> cases = {{0, 0, height, width},          {0, 0, 1, 1},
                                                 {height - 1, width - 1, 1, 1}, {0, width - 1, height, 1},
                                                 {height - 1, 0, 1, width},     {height / 3, width / 3, 1, width / 2}};
    for (int n = 0; n < 60; ++n) {
      const int64_t h = 1 + static_cast<int64_t>(random.below(static_cast<uint64_t>(height)));
      const int64_t w = 1 + static_cast<int64_t>(random.below(static_cast<uint64_t>(width)));
      cases.push_back({static_cast<int64_t>(random.below(static_cast<uint64_t>(height - h + 1))),
                       static_cast<int64_t>(random.below(static_cast<uint64_t>(width - w + 1))), h, w});
    }
    for (const std::array<int64_t, 4>& window_case : cases) {
      // Variables, not structured bindings: clang 14 cannot capture those in doctest's INFO.
      const int64_t top = window_case[0], left = window_case[1], h = window_case[2], w = window_case[3];
      CAPTURE(top);
      CAPTURE(left);
      CAPTURE(h);
      CAPTURE(w);
      const DecodedImage window = decode_jpeg_window(bytes, file, top, left, h, w);
      REQUIRE(window.height == h);
      REQUIRE(window.width == w);
      REQUIRE(window.channels == 3);
      bool equal = true;
      for (int64_t y = 0; y < h && equal; ++y) {
        equal = std::equal(window.pixels.begin() + y * w * 3, window.pixels.begin() + (y + 1) * w * 3,
                           full.pixels.begin() + ((top + y) * width + left) * 3);
      }
      CHECK(equal);
      ++windows;
    }
  }
  CHECK(windows == 8 * 66);
  const fs::path any = index.files.front();
  CHECK(error_message([&] { decode_jpeg_window(read_bytes(any), any, 0, 0, 10000, 1); }).find("is not inside") !=
        std::string::npos);
}

TEST_CASE("RandomResizedCrop + flip + ToTensor + Normalize: the fused path equals the transforms one by one") {
  const auto dir = make_jpegs();
  for (const int64_t size : {int64_t{224}, int64_t{64}}) {
    CAPTURE(size);
    ImageFolder folder(*dir / "tree", ImageFolderOptions().transforms(imagenet_train_transforms(size)));
    REQUIRE(folder.fused_pipeline());
    const Normalize normalize = imagenet_normalize();
    const int64_t plane = size * size;
    std::vector<float> pixels(static_cast<size_t>(3 * plane));
    for (int64_t i = 0; i < folder.size(); ++i) {
      CAPTURE(folder.file(i).string());
      for (uint64_t seed = 0; seed < 12; ++seed) {
        CAPTURE(seed);
        loom::Generator fused_random(seed), reference_random(seed);
        SampleSlot slot{pixels.data(), folder.sample_shape(), &fused_random};
        CHECK(folder.get(i, slot) == folder.label(i));
        const DecodedImage expected = folder.transform_pixels(read_image(folder.file(i), ColorMode::rgb), reference_random);
        CHECK(fused_random.counter() == reference_random.counter());
        REQUIRE(expected.height == size);
        REQUIRE(expected.width == size);
        int64_t different = 0;
        for (int64_t c = 0; c < 3; ++c) {
          for (int64_t k = 0; k < plane; ++k) {
            const float value = (static_cast<float>(expected.pixels[k * 3 + c]) / 255.0f -
                                 static_cast<float>(normalize.mean[c])) /
                                static_cast<float>(normalize.std[c]);
            different += pixels[c * plane + k] != value;
          }
        }
        CHECK(different == 0);
      }
    }
  }
  // Other pipelines take the general path.
  const auto fused = [&](const ImageFolderOptions& options) {
    return ImageFolder(*dir / "tree", options).fused_pipeline();
  };
  CHECK_FALSE(fused(ImageFolderOptions().transforms(imagenet_test_transforms(32))));
  CHECK_FALSE(fused(ImageFolderOptions().color(ColorMode::grayscale).transforms({RandomResizedCrop{32}, ToTensor{}})));
  CHECK(fused(ImageFolderOptions().transforms({RandomResizedCrop{16}, ToTensor{}})));
}
