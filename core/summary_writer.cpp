#include <loom/core/summary_writer.h>

#include <unistd.h>

#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <type_traits>

#include <loom/core/error.h>

namespace loom {

namespace {

// The byte-at-a-time table of the reflected Castagnoli polynomial.
constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 1) ? (crc >> 1) ^ 0x82f63b78u : crc >> 1;
    table[i] = crc;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out += static_cast<char>((value & 0x7f) | 0x80);
    value >>= 7;
  }
  out += static_cast<char>(value);
}

template <typename T>
void put_little_endian(std::string& out, T value) {
  static_assert(std::is_trivially_copyable_v<T>);
  unsigned char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  static_assert(std::endian::native == std::endian::little, "the record layout below assumes a little-endian host");
  out.append(reinterpret_cast<const char*>(bytes), sizeof(T));
}

// Protobuf field keys: (field number << 3) | wire type.
constexpr uint8_t kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;
void put_key(std::string& out, int field, uint8_t wire_type) { put_varint(out, (static_cast<uint64_t>(field) << 3) | wire_type); }

void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// Event fields 1 (wall_time) and 2 (step).
std::string event_head(double wall_time, int64_t step) {
  std::string event;
  put_key(event, 1, kFixed64);
  put_little_endian(event, wall_time);
  if (step != 0) {  // proto3: a zero is not written
    put_key(event, 2, kVarint);
    put_varint(event, static_cast<uint64_t>(step));
  }
  return event;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::atomic<int> g_writers{0};

}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = kCrc32cTable[(crc ^ bytes[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view data) {
  std::string record;
  put_little_endian(record, static_cast<uint64_t>(data.size()));
  put_little_endian(record, masked_crc32c(record.data(), 8));
  record.append(data);
  put_little_endian(record, masked_crc32c(data.data(), data.size()));
  return record;
}

std::string event_file_version(double wall_time) {
  std::string event = event_head(wall_time, 0);
  put_bytes(event, 3, "brain.Event:2");
  return event;
}

std::string event_scalar(double wall_time, int64_t step, std::string_view tag, float value) {
  std::string summary_value;
  put_bytes(summary_value, 1, tag);
  put_key(summary_value, 2, kFixed32);
  put_little_endian(summary_value, value);
  std::string summary;
  put_bytes(summary, 1, summary_value);
  std::string event = event_head(wall_time, step);
  put_bytes(event, 5, summary);
  return event;
}

SummaryWriter::SummaryWriter(const std::filesystem::path& log_dir) {
  std::error_code ec;
  std::filesystem::create_directories(log_dir, ec);
  LOOM_CHECK(!ec, "TensorBoard log directory ", log_dir.string(), ": cannot create it: ", ec.message());
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "localhost");
  const double wall_time = now_seconds();
  path_ = log_dir / str("events.out.tfevents.", static_cast<long long>(wall_time), ".", host, ".", ::getpid(), ".",
                        g_writers.fetch_add(1));
  file_ = std::fopen(path_.c_str(), "wb");
  LOOM_CHECK(file_ != nullptr, "TensorBoard event file ", path_.string(), ": cannot create it: ", std::strerror(errno));
  write_record(event_file_version(wall_time));
}

SummaryWriter::~SummaryWriter() {
  if (file_) std::fclose(file_);
}

void SummaryWriter::add_scalar(std::string_view tag, double value, int64_t step, std::optional<double> wall_time) {
  write_record(event_scalar(wall_time.value_or(now_seconds()), step, tag, static_cast<float>(value)));
}

void SummaryWriter::write_record(const std::string& event) {
  const std::string record = tfrecord(event);
  LOOM_CHECK(std::fwrite(record.data(), 1, record.size(), file_) == record.size(), "TensorBoard event file ",
             path_.string(), ": write failed: ", std::strerror(errno));
}

void SummaryWriter::flush() {
  LOOM_CHECK(std::fflush(file_) == 0 && !std::ferror(file_), "TensorBoard event file ", path_.string(),
             ": write failed: ", std::strerror(errno));
}

}  // namespace loom
