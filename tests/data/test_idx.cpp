// IDX reader tests: round trips through raw and gzip files, hand-built files,
// and every validation error.
#include <doctest/doctest.h>

#include <loom/core/generator.h>
#include <loom/data/idx.h>
#include "tests/data/helpers.h"

using namespace loom::data;
using namespace loom::data::testing;

namespace {

IdxImages random_images(int64_t count, int64_t rows, int64_t columns, uint64_t seed) {
  loom::Generator random(seed);
  IdxImages images{count, rows, columns, std::vector<uint8_t>(count * rows * columns)};
  for (uint8_t& pixel : images.pixels) pixel = static_cast<uint8_t>(random.below(256));
  return images;
}

std::vector<int64_t> random_labels(int64_t count, uint64_t seed) {
  loom::Generator random(seed);
  std::vector<int64_t> labels(count);
  for (int64_t& label : labels) label = static_cast<int64_t>(random.below(10));
  return labels;
}

}  // namespace

TEST_CASE("IDX images and labels round-trip through raw and gzip files") {
  TempDir dir;
  const IdxImages images = random_images(7, 5, 6, 1);
  const std::vector<int64_t> labels = random_labels(7, 2);
  for (const char* suffix : {"", ".gz"}) {
    CAPTURE(suffix);
    const auto image_path = dir / (std::string("images-idx3-ubyte") + suffix);
    const auto label_path = dir / (std::string("labels-idx1-ubyte") + suffix);
    write_idx_images(image_path, images);
    write_idx_labels(label_path, labels);
    const std::vector<uint8_t> bytes = read_bytes(image_path);
    if (std::string(suffix) == ".gz") {
      CHECK((bytes[0] == 0x1f && bytes[1] == 0x8b));  // gzip magic
    } else {
      CHECK(bytes.size() == 16 + 7 * 5 * 6);
      CHECK(std::vector<uint8_t>(bytes.begin(), bytes.begin() + 16) == idx_header({2051, 7, 5, 6}));
    }
    const IdxImages read = read_idx_images(image_path);
    CHECK(read.count == 7);
    CHECK(read.rows == 5);
    CHECK(read.columns == 6);
    CHECK(read.pixels == images.pixels);
    CHECK(read_idx_labels(label_path) == labels);

    const ImageDataset dataset = read_idx_dataset(image_path, label_path);
    CHECK(dataset.size() == 7);
    CHECK(dataset.channels() == 1);
    CHECK(dataset.height() == 5);
    CHECK(dataset.width() == 6);
    CHECK(dataset.pixel(3, 0, 2, 4) == images.pixels[3 * 30 + 2 * 6 + 4]);
    CHECK(dataset.label(6) == labels[6]);
  }
}

TEST_CASE("a hand-built IDX file reads as its bytes say") {
  TempDir dir;
  std::vector<uint8_t> bytes = idx_header({2051, 2, 2, 3});
  for (uint8_t v = 0; v < 12; ++v) bytes.push_back(static_cast<uint8_t>(v * 20));
  write_gzip(dir / "images.gz", bytes);
  const IdxImages images = read_idx_images(dir / "images.gz");
  REQUIRE(images.count == 2);
  CHECK(images.rows == 2);
  CHECK(images.columns == 3);
  CHECK(images.pixels[0] == 0);
  CHECK(images.pixels[11] == 220);  // image 1, row 1, column 2
}

TEST_CASE("IDX validation errors name the file and the problem") {
  TempDir dir;
  SUBCASE("wrong magic number") {
    std::vector<uint8_t> bytes = idx_header({1234, 1, 1, 1});
    bytes.push_back(0);
    write_bytes(dir / "bad-images", bytes);
    const std::string message = error_message([&] { read_idx_images(dir / "bad-images"); });
    CHECK(message.find((dir / "bad-images").string()) != std::string::npos);
    CHECK(message.find("magic number 1234, expected 2051 for an image file") != std::string::npos);
  }
  SUBCASE("a label file where an image file is expected") {
    write_idx_labels(dir / "labels.gz", {1, 2, 3});
    const std::string message = error_message([&] { read_idx_images(dir / "labels.gz"); });
    CHECK(message.find("magic number 2049 (an IDX label file), expected 2051") != std::string::npos);
    const std::string reverse = error_message([&] {
      write_idx_images(dir / "images", IdxImages{1, 1, 1, {5}});
      read_idx_labels(dir / "images");
    });
    CHECK(reverse.find("magic number 2051 (an IDX image file), expected 2049 for a label file") !=
          std::string::npos);
  }
  SUBCASE("truncated image data, raw and gzip") {
    std::vector<uint8_t> bytes = idx_header({2051, 3, 4, 4});
    bytes.resize(bytes.size() + 40);  // 48 pixels declared, 40 present
    write_bytes(dir / "short", bytes);
    write_gzip(dir / "short.gz", bytes);
    for (const char* name : {"short", "short.gz"}) {
      const std::string message = error_message([&] { read_idx_images(dir / name); });
      CHECK(message.find((dir / name).string()) != std::string::npos);
      CHECK(message.find("truncated") != std::string::npos);
      CHECK(message.find("3 images of 4x4 (48 bytes of data) but the file holds only 40") != std::string::npos);
    }
  }
  SUBCASE("a corrupt header declaring absurd sizes") {
    write_bytes(dir / "huge", idx_header({2051, 0xffffffffu, 0xffffffffu, 0xffffffffu}));
    CHECK(error_message([&] { read_idx_images(dir / "huge"); }).find("the header is corrupt") != std::string::npos);
    write_bytes(dir / "large", idx_header({2051, 1000000, 28, 28}));
    CHECK(error_message([&] { read_idx_images(dir / "large"); }).find("but the file holds only 0") !=
          std::string::npos);
  }
  SUBCASE("truncated header") {
    write_bytes(dir / "stub", {0, 0, 8, 3, 0, 0});
    CHECK(error_message([&] { read_idx_images(dir / "stub"); }).find("truncated header") != std::string::npos);
    write_bytes(dir / "empty", {});
    CHECK(error_message([&] { read_idx_images(dir / "empty"); }).find("too short") != std::string::npos);
  }
  SUBCASE("bytes after the declared data") {
    std::vector<uint8_t> bytes = idx_header({2049, 2});
    bytes.insert(bytes.end(), {1, 2, 3});
    write_bytes(dir / "long", bytes);
    CHECK(error_message([&] { read_idx_labels(dir / "long"); }).find("has bytes after the 2 labels") !=
          std::string::npos);
  }
  SUBCASE("label out of range") {
    std::vector<uint8_t> bytes = idx_header({2049, 4});
    bytes.insert(bytes.end(), {1, 9, 10, 0});
    write_gzip(dir / "labels.gz", bytes);
    const std::string message = error_message([&] { read_idx_labels(dir / "labels.gz"); });
    CHECK(message.find((dir / "labels.gz").string()) != std::string::npos);
    CHECK(message.find("label 10 at index 2 is outside 0..9") != std::string::npos);
  }
  SUBCASE("image and label counts differ") {
    write_idx_images(dir / "images", random_images(5, 2, 2, 3));
    write_idx_labels(dir / "labels", random_labels(4, 4));
    const std::string message = error_message([&] { read_idx_dataset(dir / "images", dir / "labels"); });
    CHECK(message.find((dir / "images").string() + " holds 5 images") != std::string::npos);
    CHECK(message.find((dir / "labels").string() + " holds 4 labels") != std::string::npos);
  }
  SUBCASE("missing file") {
    const std::string message = error_message([&] { read_idx_images(dir / "nothing-here.gz"); });
    CHECK(message.find((dir / "nothing-here.gz").string() + " does not exist") != std::string::npos);
  }
}

TEST_CASE("load_mnist finds the four files, gzip or raw, and reports what is missing") {
  TempDir dir;
  SUBCASE("missing directory") {
    const std::string message = error_message([&] { load_mnist(dir / "absent"); });
    CHECK(message.find((dir / "absent").string() + " does not exist") != std::string::npos);
  }
  SUBCASE("missing files are listed together") {
    write_idx_images(dir / "train-images-idx3-ubyte.gz", random_images(2, 3, 3, 5));
    const std::string message = error_message([&] { load_mnist(dir.path()); });
    CHECK(message.find("is missing train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz], "
                       "t10k-labels-idx1-ubyte[.gz]") != std::string::npos);
  }
  SUBCASE("a complete directory, mixing raw and gzip files") {
    const IdxImages train = random_images(6, 3, 3, 6), test = random_images(2, 3, 3, 7);
    write_idx_images(dir / "train-images-idx3-ubyte.gz", train);
    write_idx_labels(dir / "train-labels-idx1-ubyte", random_labels(6, 8));
    write_idx_images(dir / "t10k-images-idx3-ubyte", test);
    write_idx_labels(dir / "t10k-labels-idx1-ubyte.gz", random_labels(2, 9));
    const TrainTestSplit split = load_mnist(dir.path());
    CHECK(split.train.size() == 6);
    CHECK(split.test.size() == 2);
    CHECK(split.test.pixel(1, 0, 2, 2) == test.pixels[17]);
  }
  SUBCASE("torchvision's root: ROOT/MNIST/raw as a download leaves it, and FashionMNIST/raw") {
    for (const char* folder : {"MNIST", "FashionMNIST"}) {
      CAPTURE(folder);
      TempDir root;
      const std::filesystem::path raw = root / folder / "raw";
      std::filesystem::create_directories(raw);
      const IdxImages train = random_images(5, 4, 4, 16), test = random_images(3, 4, 4, 17);
      write_idx_images(raw / "train-images-idx3-ubyte", train);
      write_idx_labels(raw / "train-labels-idx1-ubyte", random_labels(5, 18));
      write_idx_images(raw / "t10k-images-idx3-ubyte.gz", test);
      write_idx_labels(raw / "t10k-labels-idx1-ubyte.gz", random_labels(3, 19));
      REQUIRE(find_mnist(root.path()) == raw);
      CHECK(find_mnist(raw) == raw);
      const TrainTestSplit split = load_mnist(root.path());
      CHECK(split.train.size() == 5);
      CHECK(split.test.size() == 3);
      CHECK(split.test.pixel(2, 0, 3, 3) == test.pixels[47]);
    }
  }
  SUBCASE("an incomplete MNIST/raw is named in the error with what it lacks") {
    std::filesystem::create_directories(dir / "MNIST" / "raw");
    write_idx_images(dir / "MNIST" / "raw" / "train-images-idx3-ubyte", random_images(2, 3, 3, 5));
    CHECK_FALSE(find_mnist(dir.path()).has_value());
    const std::string message = error_message([&] { load_mnist(dir.path()); });
    CHECK(message.find((dir / "MNIST" / "raw").string() + " is missing train-labels-idx1-ubyte[.gz], "
                       "t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz]") != std::string::npos);
    CHECK(message.find("MNIST/raw/ or FashionMNIST/raw/ (torchvision's root)") != std::string::npos);
  }
  SUBCASE("label count mismatch names both files") {
    write_idx_images(dir / "train-images-idx3-ubyte", random_images(6, 3, 3, 6));
    write_idx_labels(dir / "train-labels-idx1-ubyte", random_labels(5, 8));
    write_idx_images(dir / "t10k-images-idx3-ubyte", random_images(2, 3, 3, 6));
    write_idx_labels(dir / "t10k-labels-idx1-ubyte", random_labels(2, 8));
    const std::string message = error_message([&] { load_mnist(dir.path()); });
    CHECK(message.find("train-images-idx3-ubyte holds 6 images") != std::string::npos);
    CHECK(message.find("train-labels-idx1-ubyte holds 5 labels") != std::string::npos);
  }
}

TEST_CASE("Fashion-MNIST from /usr/share/datasets loads with the expected shape") {
  const std::filesystem::path directory = "/usr/share/datasets/fashion-mnist";
  if (!std::filesystem::is_directory(directory)) {
    MESSAGE("skipped: ", directory.string(), " is not installed");
    return;
  }
  const TrainTestSplit split = load_mnist(directory);
  CHECK(split.train.size() == 60000);
  CHECK(split.test.size() == 10000);
  CHECK(split.train.height() == 28);
  CHECK(split.train.width() == 28);
  int64_t class_counts[10] = {};
  for (int64_t i = 0; i < split.test.size(); ++i) ++class_counts[split.test.label(i)];
  for (int64_t count : class_counts) CHECK(count == 1000);  // Fashion-MNIST's test set is balanced
}
