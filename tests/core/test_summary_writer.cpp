// core/summary_writer: CRC-32C against published check values, the TFRecord
// framing and the Event protobuf against bytes worked out by hand from the
// format (tests/apps/read_tfevents.py reads whole files independently).
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <loom/core/error.h>
#include <loom/core/summary_writer.h>

#include "tests/support/temp_dir.h"

namespace {

std::string bytes(std::initializer_list<unsigned> values) {
  std::string out;
  for (unsigned v : values) out += static_cast<char>(v);
  return out;
}

uint32_t read_u32(const std::string& text, size_t at) {
  uint32_t value;
  std::memcpy(&value, text.data() + at, 4);
  return value;
}

uint64_t read_u64(const std::string& text, size_t at) {
  uint64_t value;
  std::memcpy(&value, text.data() + at, 8);
  return value;
}

}  // namespace

TEST_SUITE("summary_writer") {
  TEST_CASE("CRC-32C check values (the Castagnoli 'check' and RFC 3720 B.4)") {
    CHECK(loom::crc32c("123456789", 9) == 0xe3069283u);
    std::vector<unsigned char> block(32, 0);
    CHECK(loom::crc32c(block.data(), block.size()) == 0x8a9136aau);
    std::fill(block.begin(), block.end(), 0xff);
    CHECK(loom::crc32c(block.data(), block.size()) == 0x62a8ab43u);
    for (int i = 0; i < 32; ++i) block[i] = static_cast<unsigned char>(i);
    CHECK(loom::crc32c(block.data(), block.size()) == 0x46dd794eu);
    for (int i = 0; i < 32; ++i) block[i] = static_cast<unsigned char>(31 - i);
    CHECK(loom::crc32c(block.data(), block.size()) == 0x113fdb5cu);
    // Continuing a CRC over a split buffer gives the CRC of the whole.
    CHECK(loom::crc32c("56789", 5, loom::crc32c("1234", 4)) == 0xe3069283u);
    CHECK(loom::crc32c("", 0) == 0u);
  }

  TEST_CASE("the mask rotates right by 15 and adds 0xa282ead8") {
    // crc32c("123456789") = 0xe3069283 -> rotated 0x2507c60d -> + 0xa282ead8.
    CHECK(loom::masked_crc32c("123456789", 9) == 0xc78ab0e5u);
  }

  TEST_CASE("a scalar Event is encoded as protobuf says") {
    // wall_time 1.5 (field 1, fixed64), step 3 (field 2, varint), summary (field 5) holding
    // value (field 1) {tag "a" (field 1), simple_value 2.0f (field 2, fixed32)}.
    const std::string value = bytes({0x0a, 0x01, 'a', 0x15, 0x00, 0x00, 0x00, 0x40});
    const std::string summary = bytes({0x0a, 0x08}) + value;
    const std::string expected =
        bytes({0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f, 0x10, 0x03, 0x2a, 0x0a}) + summary;
    CHECK(loom::event_scalar(1.5, 3, "a", 2.0f) == expected);
    // A step of 300 is a two-byte varint (0xac 0x02).
    CHECK(loom::event_scalar(1.5, 300, "a", 2.0f).substr(9, 3) == bytes({0x10, 0xac, 0x02}));
    // The first record: file_version (field 3) "brain.Event:2".
    CHECK(loom::event_file_version(0.0) ==
          bytes({0x09, 0, 0, 0, 0, 0, 0, 0, 0, 0x1a, 13}) + "brain.Event:2");
  }

  TEST_CASE("a TFRecord is length, its masked CRC, the data, the data's masked CRC") {
    const std::string data = "hello, tensorboard";
    const std::string record = loom::tfrecord(data);
    REQUIRE(record.size() == 8 + 4 + data.size() + 4);
    CHECK(read_u64(record, 0) == data.size());
    CHECK(read_u32(record, 8) == loom::masked_crc32c(record.data(), 8));
    CHECK(record.substr(12, data.size()) == data);
    CHECK(read_u32(record, 12 + data.size()) == loom::masked_crc32c(data.data(), data.size()));
  }

  TEST_CASE("SummaryWriter writes the version record, then one record per scalar") {
    loom::testing::TempDir dir;
    std::filesystem::path path;
    {
      loom::SummaryWriter writer(dir.path() / "run");
      path = writer.path();
      CHECK(path.filename().string().starts_with("events.out.tfevents."));
      writer.add_scalar("train/loss", 0.25, 7, 100.0);
      writer.flush();
    }
    std::ifstream in(path, std::ios::binary);
    const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string second = loom::tfrecord(loom::event_scalar(100.0, 7, "train/loss", 0.25f));
    REQUIRE(file.size() > second.size());
    CHECK(file.substr(file.size() - second.size()) == second);
    const size_t first_length = read_u64(file, 0);
    CHECK(file.substr(12, first_length).find("brain.Event:2") != std::string::npos);
    CHECK(16 + first_length + second.size() == file.size());
  }

  TEST_CASE("an unwritable log directory is an error naming it") {
    loom::testing::TempDir dir;
    std::ofstream(dir.path() / "file") << "x";
    CHECK_THROWS_WITH_AS(loom::SummaryWriter(dir.path() / "file" / "run"), doctest::Contains("file/run"), loom::Error);
  }
}
