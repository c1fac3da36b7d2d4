// TensorBoard event files written by loom (PyTorch's
// torch.utils.tensorboard.SummaryWriter, scalars only): `tensorboard --logdir
// DIR` shows them.
//
// The file format (TensorFlow's TFRecord of Event protobufs): each record is
//   uint64 length (little endian), uint32 masked CRC-32C of those 8 bytes,
//   `length` bytes of data, uint32 masked CRC-32C of the data,
// where masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8. The data is
// an Event message: wall_time (field 1, double), step (2, int64), and either
// file_version (3, string: "brain.Event:2", the first record) or summary (5,
// a Summary: repeated value (1) of Value {tag (1, string), simple_value (2,
// float)}). The protobuf encoding is written by hand; nothing else is needed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace loom {

// CRC-32C (Castagnoli, reflected polynomial 0x82f63b78) of `size` bytes,
// continuing from `crc` (0 to start): crc32c("123456789") == 0xe3069283.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);
// TFRecord's masked CRC-32C.
uint32_t masked_crc32c(const void* data, size_t size);

// One TFRecord around `data`: length, masked CRC of the length, data, masked CRC of the data.
std::string tfrecord(std::string_view data);

// The Event messages, protobuf-encoded.
std::string event_file_version(double wall_time);
std::string event_scalar(double wall_time, int64_t step, std::string_view tag, float value);

// Writes scalars into `log_dir`/events.out.tfevents.<seconds>.<host>.<pid>.<n>
// (the directory is created). Not thread-safe: one writer per thread. Records
// are buffered by stdio; flush() (and the destructor) hands them to the OS.
class SummaryWriter {
 public:
  // Throws naming the directory or the file when it cannot be created.
  explicit SummaryWriter(const std::filesystem::path& log_dir);
  ~SummaryWriter();
  SummaryWriter(const SummaryWriter&) = delete;
  SummaryWriter& operator=(const SummaryWriter&) = delete;

  // The scalar `tag` at `step`; wall_time in seconds since the epoch, now by default.
  void add_scalar(std::string_view tag, double value, int64_t step, std::optional<double> wall_time = std::nullopt);
  // Throws naming the file when a write failed (a full disk).
  void flush();
  const std::filesystem::path& path() const { return path_; }

 private:
  void write_record(const std::string& event);
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

}  // namespace loom
