// CIFAR-10 reader tests: the record layout, round trips through generated
// batch files, and every validation error.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <algorithm>

#include <loom/data/cifar10.h>
#include "tests/data/helpers.h"

using namespace loom::data;
using namespace loom::data::testing;

TEST_CASE("a CIFAR-10 record is a label byte then the R, G and B planes") {
  TempDir dir;
  std::vector<uint8_t> bytes(2 * 3073);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7 % 251);
  bytes[0] = 3;
  bytes[3073] = 9;
  write_bytes(dir / "data_batch_1.bin", bytes);
  const ImageDataset dataset = read_cifar10_files({dir / "data_batch_1.bin"}, "test");
  REQUIRE(dataset.size() == 2);
  CHECK(dataset.channels() == 3);
  CHECK(dataset.height() == 32);
  CHECK(dataset.width() == 32);
  CHECK(dataset.label(0) == 3);
  CHECK(dataset.label(1) == 9);
  // Record 1, green plane (channel 1), row 5, column 30.
  CHECK(dataset.pixel(1, 1, 5, 30) == bytes[3073 + 1 + 1024 + 5 * 32 + 30]);
  CHECK(dataset.pixel(0, 2, 31, 31) == bytes[3072]);
}

TEST_CASE("CIFAR-10 directories round-trip, found directly or through cifar-10-batches-bin") {
  TempDir dir;
  const ImageDataset train = synthetic_cifar10(103, 11);
  const ImageDataset test = synthetic_cifar10(9, 12);
  const auto batches = dir / "cifar-10-batches-bin";
  write_cifar10_directory(batches, train, test);
  CHECK(std::filesystem::file_size(batches / "data_batch_1.bin") == 20 * 3073);
  CHECK(std::filesystem::file_size(batches / "data_batch_5.bin") == 21 * 3073);
  for (const std::filesystem::path& root : {batches, dir.path()}) {
    CAPTURE(root.string());
    const TrainTestSplit split = load_cifar10(root);
    REQUIRE(split.train.size() == 103);
    REQUIRE(split.test.size() == 9);
    for (int64_t i = 0; i < train.size(); ++i) {
      REQUIRE(split.train.label(i) == train.label(i));
      REQUIRE(std::equal(train.image(i), train.image(i) + 3072, split.train.image(i)));
    }
    CHECK(std::equal(test.image(8), test.image(8) + 3072, split.test.image(8)));
  }
}

TEST_CASE("synthetic CIFAR-10 is deterministic and well formed") {
  const ImageDataset a = synthetic_cifar10(50, 3), b = synthetic_cifar10(50, 3), c = synthetic_cifar10(50, 4);
  CHECK(std::equal(a.image(0), a.image(0) + 50 * 3072, b.image(0)));
  CHECK_FALSE(std::equal(a.image(0), a.image(0) + 50 * 3072, c.image(0)));
  std::vector<int> seen(10, 0);
  for (int64_t i = 0; i < a.size(); ++i) {
    REQUIRE(a.label(i) >= 0);
    REQUIRE(a.label(i) <= 9);
    ++seen[a.label(i)];
  }
  CHECK(std::count(seen.begin(), seen.end(), 0) <= 2);
}

TEST_CASE("CIFAR-10 validation errors name the file and the problem") {
  TempDir dir;
  SUBCASE("size not a multiple of 3073") {
    write_bytes(dir / "data_batch_1.bin", std::vector<uint8_t>(30731));
    const std::string message = error_message([&] { read_cifar10_files({dir / "data_batch_1.bin"}, "x"); });
    CHECK(message.find("CIFAR-10 file " + (dir / "data_batch_1.bin").string() +
                       " has 30731 bytes; expected a multiple of 3073") != std::string::npos);
  }
  SUBCASE("label above 9, with the record index") {
    std::vector<uint8_t> bytes(3 * 3073);
    bytes[3073] = 12;
    write_bytes(dir / "test_batch.bin", bytes);
    const std::string message = error_message([&] { read_cifar10_files({dir / "test_batch.bin"}, "x"); });
    CHECK(message.find((dir / "test_batch.bin").string()) != std::string::npos);
    CHECK(message.find("record 1 has label 12; labels must be 0..9") != std::string::npos);
  }
  SUBCASE("missing batch files are listed at once") {
    write_bytes(dir / "data_batch_1.bin", std::vector<uint8_t>(3073));
    write_bytes(dir / "data_batch_3.bin", std::vector<uint8_t>(3073));
    const std::string message = error_message([&] { load_cifar10(dir.path()); });
    CHECK(message.find("is missing data_batch_2.bin, data_batch_4.bin, data_batch_5.bin, test_batch.bin") !=
          std::string::npos);
  }
  SUBCASE("missing directory") {
    const std::string message = error_message([&] { load_cifar10(dir / "nope"); });
    CHECK(message.find((dir / "nope").string() + " does not exist") != std::string::npos);
  }
  SUBCASE("a missing file passed directly") {
    const std::string message = error_message([&] { read_cifar10_files({dir / "data_batch_9.bin"}, "x"); });
    CHECK(message.find((dir / "data_batch_9.bin").string() + " does not exist") != std::string::npos);
  }
  SUBCASE("an empty batch is an error, not a batch of no images") {
    write_bytes(dir / "data_batch_1.bin", {});
    const std::string message = error_message([&] { read_cifar10_files({dir / "data_batch_1.bin"}, "x"); });
    CHECK(message.find("CIFAR-10 file " + (dir / "data_batch_1.bin").string() +
                       " has 0 bytes; expected a multiple of 3073 above zero") != std::string::npos);
    CHECK(message.find("the official batches hold 10000 images, 30730000 bytes") != std::string::npos);
  }
  SUBCASE("an empty test batch in a complete directory stops load_cifar10") {
    for (int i = 1; i <= 5; ++i) write_bytes(dir / ("data_batch_" + std::to_string(i) + ".bin"), std::vector<uint8_t>(3073));
    write_bytes(dir / "test_batch.bin", {});
    const std::string message = error_message([&] { load_cifar10(dir.path()); });
    CHECK(message.find((dir / "test_batch.bin").string() + " has 0 bytes") != std::string::npos);
  }
  SUBCASE("a FIFO named like a batch is refused without opening it for a blocking read") {
    REQUIRE(::mkfifo((dir / "data_batch_1.bin").c_str(), 0600) == 0);
    const std::string message = error_message([&] { read_cifar10_files({dir / "data_batch_1.bin"}, "x"); });
    CHECK(message.find((dir / "data_batch_1.bin").string() + " is a FIFO (named pipe), not a regular file") !=
          std::string::npos);
  }
}
