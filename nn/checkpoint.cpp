#include <loom/nn/checkpoint.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include <zlib.h>

#include <loom/core/autograd.h>
#include <loom/core/parallel.h>

namespace loom::nn {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; the reader and writer copy bytes as they are");

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

// A header this large is a corrupt length field, not a real header (the
// safetensors library's own limit is 100 MB).
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

std::string errno_text() { return std::strerror(errno); }

// Owns one open file descriptor.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd = -1) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept {
    if (this != &other) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Closes now, reporting the error close() returns (a delayed write error).
  [[nodiscard]] int close() {
    const int result = ::close(fd_);
    fd_ = -1;
    return result;
  }

 private:
  int fd_;
};

// What a failed write or sync means for the user, after strerror's text.
std::string write_error_hint(int error) {
  switch (error) {
    case ENOSPC: return " (the disk is full)";
    case EDQUOT: return " (the disk quota is used up)";
    case EFBIG: return " (the file size limit, ulimit -f, is reached)";
    case EIO: return " (an I/O error: the disk or the network filesystem failed)";
    case EROFS: return " (the filesystem is mounted read-only)";
    default: return "";
  }
}

// LOOM_CHECKPOINT_TEST_PAUSE_AT_BYTE=N (tests only): the writer stops for good
// once N bytes of the temporary file are written, after saying so on stderr,
// so that a test can kill the process in the middle of a write.
std::optional<uint64_t> test_pause_at_byte() {
  const char* text = std::getenv("LOOM_CHECKPOINT_TEST_PAUSE_AT_BYTE");
  if (text == nullptr || *text == '\0') return std::nullopt;
  return std::strtoull(text, nullptr, 10);
}

class FileWriter {
 public:
  FileWriter(int fd, const fs::path& path, const std::string& temporary)
      : fd_(fd), path_(path), temporary_(temporary), pause_at_(test_pause_at_byte()) {}

  void write(const void* data, size_t bytes) {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      size_t chunk = bytes;
      if (pause_at_ && written_ < *pause_at_) chunk = std::min<uint64_t>(chunk, *pause_at_ - written_);
      const ssize_t done = ::write(fd_, p, chunk);
      if (done < 0) {
        if (errno == EINTR) continue;
        const int error = errno;
        LOOM_FAIL("checkpoint ", path_.string(), ": writing ", temporary_, " failed after ", written_, " bytes: ",
                  std::strerror(error), write_error_hint(error), "; the previous checkpoint, if any, is unchanged");
      }
      p += done;
      bytes -= static_cast<size_t>(done);
      written_ += static_cast<uint64_t>(done);
      if (pause_at_ && written_ == *pause_at_) {
        std::fprintf(stderr, "checkpoint writer paused (test hook) after %llu bytes of %s\n",
                     static_cast<unsigned long long>(written_), temporary_.c_str());
        std::fflush(stderr);
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
      }
    }
  }

 private:
  int fd_;
  fs::path path_;
  std::string temporary_;
  std::optional<uint64_t> pause_at_;
  uint64_t written_ = 0;
};

// zlib's CRC-32 of `pieces` laid end to end: fixed-size chunks in parallel
// (loom's threads), combined in order with crc32_combine. A ResNet-50
// checkpoint is 190 MB, about 0.1-0.2 s of CRC on one core.
uLong data_crc32(const std::vector<std::pair<const void*, uint64_t>>& pieces) {
  constexpr uint64_t kChunkBytes = uint64_t{4} << 20;
  struct Chunk {
    const Bytef* data;
    uint64_t bytes;
    uLong crc;
  };
  std::vector<Chunk> chunks;
  for (auto [data, bytes] : pieces) {
    for (uint64_t at = 0; at < bytes; at += kChunkBytes)
      chunks.push_back({static_cast<const Bytef*>(data) + at, std::min(kChunkBytes, bytes - at), 0});
  }
  parallel_for(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) chunks[i].crc = ::crc32_z(0L, chunks[i].data, chunks[i].bytes);
  });
  uLong crc = ::crc32_z(0L, Z_NULL, 0);
  for (const Chunk& chunk : chunks) crc = ::crc32_combine64(crc, chunk.crc, static_cast<z_off64_t>(chunk.bytes));
  return crc;
}

// Reads exactly `bytes` at `offset`; false on a short read.
bool read_at(int fd, void* data, size_t bytes, uint64_t offset) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t got = ::pread(fd, p, bytes, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    bytes -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return true;
}

// Removes the temporary file unless the rename happened.
struct TemporaryFile {
  std::string path;
  bool keep = false;
  ~TemporaryFile() {
    if (!keep && !path.empty()) ::unlink(path.c_str());
  }
};

std::string describe(const fs::path& path) { return "checkpoint " + path.string(); }

// The integer metadata value `text` of `key`; `kind` names the type in the error.
template <class Integer>
Integer parse_integer(const std::string& text, const std::string& key, const fs::path& path, const char* kind) {
  Integer value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  LOOM_CHECK(error == std::errc() && end == text.data() + text.size(), describe(path), ": metadata '", key,
             "' is '", text, "', not ", kind);
  return value;
}

int64_t parse_int(const std::string& text, const std::string& key, const fs::path& path) {
  return parse_integer<int64_t>(text, key, path, "an integer");
}

uint64_t parse_uint(const std::string& text, const std::string& key, const fs::path& path) {
  return parse_integer<uint64_t>(text, key, path, "an unsigned integer");
}

}  // namespace

const char* safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::i64: return "I64";
    case DType::i32: return "I32";
    case DType::u8: return "U8";
  }
  return "?";
}

std::optional<DType> parse_safetensors_dtype(const std::string& name) {
  for (DType d : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64, DType::i32, DType::u8}) {
    if (name == safetensors_dtype_name(d)) return d;
  }
  return std::nullopt;
}

void save_safetensors(const fs::path& path, const NamedTensors& tensors, const Metadata& metadata) {
  const std::string where = describe(path);
  // Host copies first: every check happens before the file is created.
  std::vector<Tensor> host;
  host.reserve(tensors.size());
  Json header = Json::object();
  std::set<std::string> seen;
  uint64_t offset = 0;
  {
    NoGradGuard no_grad;
    for (auto& [name, t] : tensors) {
      LOOM_CHECK(!name.empty() && name != "__metadata__", where, ": '", name, "' cannot name a tensor");
      LOOM_CHECK(seen.insert(name).second, where, ": tensor '", name, "' is given twice");
      LOOM_CHECK(t.defined(), where, ": tensor '", name, "' is undefined");
      Tensor h = t.detach().to(Device::cpu()).contiguous();
      const uint64_t bytes = h.nbytes();
      header[name] = {{"dtype", safetensors_dtype_name(h.dtype())},
                      {"shape", h.sizes()},
                      {"data_offsets", {offset, offset + bytes}}};
      offset += bytes;
      host.push_back(std::move(h));
    }
  }
  // A CRC-32 of the data section (zlib's, as Python's zlib.crc32 computes it)
  // lets the reader tell a corrupt file from a valid one.
  std::vector<std::pair<const void*, uint64_t>> pieces;
  for (const Tensor& h : host) pieces.emplace_back(h.raw_data(), h.nbytes());
  const uLong crc = data_crc32(pieces);
  Json meta = Json::object();
  for (auto& [key, value] : metadata) {
    LOOM_CHECK(key != kDataCrc32Key, where, ": metadata key ", key, " is reserved");
    meta[key] = value;
  }
  meta[kDataCrc32Key] = str(crc);
  header["__metadata__"] = std::move(meta);
  std::string text = header.dump();
  // Pad with spaces so the data starts 8-byte aligned (as the safetensors library does).
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_bytes = text.size();

  const fs::path directory = path.has_parent_path() ? path.parent_path() : fs::path(".");
  std::error_code ec;
  LOOM_CHECK(fs::is_directory(directory, ec), where, ": directory ", directory.string(), " does not exist");
  TemporaryFile temporary{(directory / ("." + path.filename().string() + ".tmp-XXXXXX")).string()};
  std::vector<char> name_buffer(temporary.path.begin(), temporary.path.end());
  name_buffer.push_back('\0');
  FileDescriptor file(::mkstemp(name_buffer.data()));
  if (!file.valid()) {
    temporary.path.clear();
    const int error = errno;
    LOOM_FAIL(where, ": cannot create a temporary file in ", directory.string(), ": ", std::strerror(error),
              write_error_hint(error));
  }
  temporary.path = name_buffer.data();
  ::fchmod(file.get(), 0644);  // mkstemp creates 0600; a checkpoint is an ordinary file

  FileWriter writer(file.get(), path, temporary.path);
  writer.write(&header_bytes, sizeof(header_bytes));
  writer.write(text.data(), text.size());
  for (const Tensor& h : host) writer.write(h.raw_data(), h.nbytes());
  if (::fsync(file.get()) != 0) {
    const int error = errno;
    LOOM_FAIL(where, ": fsync of ", temporary.path, " failed: ", std::strerror(error), write_error_hint(error),
              "; the previous checkpoint, if any, is unchanged");
  }
  if (file.close() != 0) {
    const int error = errno;
    LOOM_FAIL(where, ": closing ", temporary.path, " failed: ", std::strerror(error), write_error_hint(error),
              "; the previous checkpoint, if any, is unchanged");
  }
  LOOM_CHECK(::rename(temporary.path.c_str(), path.c_str()) == 0, where, ": renaming ", temporary.path,
             " failed: ", errno_text());
  temporary.keep = true;
  // Makes the rename itself durable. Some filesystems cannot fsync a
  // directory (EINVAL): the rename is then as durable as they make it.
  FileDescriptor dir(::open(directory.c_str(), O_RDONLY | O_DIRECTORY));
  LOOM_CHECK(dir.valid(), where, ": opening directory ", directory.string(), " to sync it failed: ", errno_text());
  if (::fsync(dir.get()) != 0 && errno != EINVAL) {
    const int error = errno;
    LOOM_FAIL(where, ": fsync of directory ", directory.string(), " failed: ", std::strerror(error),
              write_error_hint(error));
  }
}

namespace {

// An open safetensors file with its header parsed.
struct OpenedFile {
  FileDescriptor file;
  Json header;
  uint64_t file_bytes = 0;
  uint64_t header_bytes = 0;
};

OpenedFile open_safetensors(const fs::path& path) {
  const std::string where = describe(path);
  OpenedFile opened;
  FileDescriptor& file = opened.file;
  // O_NONBLOCK: a FIFO named like a checkpoint would block open() until a writer came.
  file = FileDescriptor(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  LOOM_CHECK(file.valid(), where, " cannot be opened: ", errno_text());
  struct stat info {};
  LOOM_CHECK(::fstat(file.get(), &info) == 0, where, ": stat failed: ", errno_text());
  LOOM_CHECK(S_ISREG(info.st_mode), where, " is not a regular file");
  const uint64_t file_bytes = opened.file_bytes = static_cast<uint64_t>(info.st_size);
  LOOM_CHECK(file_bytes >= 8, where, " has ", file_bytes,
             " bytes, too few for a safetensors file (it starts with an 8-byte header length)");
  uint64_t& header_bytes = opened.header_bytes;
  LOOM_CHECK(read_at(file.get(), &header_bytes, 8, 0), where, ": reading the header length failed");
  LOOM_CHECK(header_bytes <= file_bytes - 8 && header_bytes <= kMaxHeaderBytes, where, " declares a ",
             header_bytes, "-byte header but has ", file_bytes, " bytes in all: truncated, or not a safetensors file");
  LOOM_CHECK(header_bytes >= 2, where, " declares a ", header_bytes, "-byte header, too short for JSON");
  std::string text(header_bytes, '\0');
  LOOM_CHECK(read_at(file.get(), text.data(), header_bytes, 8), where, ": reading the ", header_bytes,
             "-byte header failed");
  Json& header = opened.header;
  try {
    header = Json::parse(text);
  } catch (const Json::exception& e) {
    LOOM_FAIL(where, ": the header is not valid JSON (", e.what(), ")");
  }
  LOOM_CHECK(header.is_object(), where, ": the header is not a JSON object");

  return opened;
}

}  // namespace

Metadata read_safetensors_metadata(const fs::path& path) {
  const OpenedFile opened = open_safetensors(path);
  Metadata metadata;
  if (auto it = opened.header.find("__metadata__"); it != opened.header.end()) {
    LOOM_CHECK(it->is_object(), describe(path), ": __metadata__ is not a JSON object");
    for (auto& [key, value] : it->items()) {
      LOOM_CHECK(value.is_string(), describe(path), ": __metadata__ entry '", key, "' is not a string");
      metadata[key] = value.get<std::string>();
    }
  }
  return metadata;
}

std::vector<fs::path> remove_stale_temporaries(const fs::path& directory) {
  std::vector<fs::path> removed;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(directory, ec)) {
    const std::string name = entry.path().filename().string();
    const size_t mark = name.rfind(".tmp-");
    if (name.size() < 2 || name[0] != '.' || mark == std::string::npos || name.size() - mark != 11) continue;
    if (!entry.is_regular_file(ec)) continue;
    if (fs::remove(entry.path(), ec)) removed.push_back(entry.path());
  }
  return removed;
}

SafetensorsFile load_safetensors(const fs::path& path, Device device) {
  const std::string where = describe(path);
  OpenedFile opened = open_safetensors(path);
  const FileDescriptor& file = opened.file;
  const Json& header = opened.header;
  const uint64_t file_bytes = opened.file_bytes, header_bytes = opened.header_bytes;
  const uint64_t data_start = 8 + header_bytes;
  const uint64_t data_bytes = file_bytes - data_start;
  SafetensorsFile out;
  struct Span {
    uint64_t begin, end;
    size_t index;
  };
  std::vector<Span> spans;
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      LOOM_CHECK(entry.is_object(), where, ": __metadata__ is not a JSON object");
      for (auto& [key, value] : entry.items()) {
        LOOM_CHECK(value.is_string(), where, ": __metadata__ entry '", key, "' is not a string");
        out.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    const std::string tensor = where + ": tensor '" + name + "'";
    LOOM_CHECK(entry.is_object() && entry.contains("dtype") && entry.contains("shape") &&
                   entry.contains("data_offsets"),
               tensor, " needs dtype, shape and data_offsets");
    LOOM_CHECK(entry["dtype"].is_string(), tensor, ": dtype is not a string");
    const std::string dtype_text = entry["dtype"].get<std::string>();
    const std::optional<DType> dtype = parse_safetensors_dtype(dtype_text);
    LOOM_CHECK(dtype.has_value(), tensor, " has dtype '", dtype_text,
               "'; loom reads F32, F64, F16, BF16, I64, I32 and U8");
    const Json& shape_json = entry["shape"];
    LOOM_CHECK(shape_json.is_array(), tensor, ": shape is not an array");
    Shape shape;
    uint64_t numel = 1;
    for (const Json& d : shape_json) {
      LOOM_CHECK(d.is_number_unsigned(), tensor, ": shape ", shape_json.dump(), " has an entry that is not a size");
      const uint64_t size = d.get<uint64_t>();
      LOOM_CHECK(size <= (uint64_t{1} << 40) && !__builtin_mul_overflow(numel, size, &numel), tensor, ": shape ",
                 shape_json.dump(), " is too large");
      shape.push_back(static_cast<int64_t>(size));
    }
    const Json& offsets = entry["data_offsets"];
    LOOM_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                   offsets[1].is_number_unsigned(),
               tensor, ": data_offsets ", offsets.dump(), " is not a pair of byte offsets");
    const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    LOOM_CHECK(begin <= end, tensor, ": data_offsets [", begin, ", ", end, "] end before they begin");
    LOOM_CHECK(end <= data_bytes, tensor, ": data_offsets [", begin, ", ", end, "] run past the end of the data (",
               data_bytes, " bytes): the file is truncated or corrupt");
    uint64_t expected = 0;
    LOOM_CHECK(!__builtin_mul_overflow(numel, element_size(*dtype), &expected) && end - begin == expected, tensor,
               ": data_offsets [", begin, ", ", end, "] hold ", end - begin, " bytes but ", dtype_text, " ",
               shape_str(shape), " needs ", expected);
    spans.push_back({begin, end, out.tensors.size()});
    shapes.push_back(shape);
    dtypes.push_back(*dtype);
    out.tensors.emplace_back(name, Tensor());
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < spans.size(); ++i) {
    LOOM_CHECK(spans[i].begin >= spans[i - 1].end || spans[i].begin == spans[i].end, where, ": tensors '",
               out.tensors[spans[i - 1].index].first, "' and '", out.tensors[spans[i].index].first,
               "' overlap in the data");
  }
  // The checksum, when the writer stored one (loom does; other writers don't),
  // covers the data section in file order.
  std::optional<uLong> stored_crc;
  if (auto it = out.metadata.find(kDataCrc32Key); it != out.metadata.end()) {
    stored_crc = static_cast<uLong>(parse_uint(it->second, kDataCrc32Key, path));
    out.metadata.erase(it);
  }
  std::vector<std::pair<const void*, uint64_t>> pieces;  // in file order
  uint64_t covered = 0;
  for (const Span& s : spans) {
    Tensor t = Tensor::empty(shapes[s.index], dtypes[s.index]);
    LOOM_CHECK(read_at(file.get(), t.raw_data(), s.end - s.begin, data_start + s.begin), where,
               ": reading tensor '", out.tensors[s.index].first, "' failed");
    pieces.emplace_back(t.raw_data(), s.end - s.begin);
    covered = std::max(covered, s.end);
    out.tensors[s.index].second = t;  // on `device` once the checksum is checked
  }
  if (stored_crc) {
    const uLong crc = data_crc32(pieces);
    LOOM_CHECK(covered == data_bytes, where, " has ", data_bytes - covered,
               " bytes after its last tensor: the file is corrupt");
    LOOM_CHECK(crc == *stored_crc, where, ": the data's CRC-32 is ", crc, " but the file says ", *stored_crc,
               ": the file is corrupt");
  }
  if (!device.is_cpu()) {
    for (auto& [name, t] : out.tensors) t = t.to(device);
  }
  return out;
}

// ---- checkpoints ----

namespace {
const std::string kPrefix = kTrainingPrefix;
const std::string kOptimizer = kPrefix + "optimizer.";
const std::string kExtra = kPrefix + "extra.";
const std::string kGenerator = kPrefix + "generator.";

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }
}  // namespace

void save_checkpoint(const fs::path& path, const Checkpoint& checkpoint) {
  NamedTensors tensors;
  for (auto& [name, t] : checkpoint.model) {
    LOOM_CHECK(!starts_with(name, kPrefix), describe(path), ": model tensor '", name, "' uses the reserved prefix ",
               kPrefix);
    tensors.emplace_back(name, t);
  }
  // "format": "pt" is what safetensors.torch writes; it lets safetensors.torch.load_file read the file.
  Metadata metadata{{"format", "pt"}};
  if (checkpoint.training) {
    const TrainingState& s = *checkpoint.training;
    metadata[kPrefix + "format_version"] = std::to_string(kCheckpointFormatVersion);
    metadata[kPrefix + "epoch"] = std::to_string(s.epoch);
    metadata[kPrefix + "step"] = std::to_string(s.step);
    if (s.epoch_step != 0) metadata[kPrefix + "epoch_step"] = std::to_string(s.epoch_step);
    if (s.scheduler_last_epoch) metadata[kPrefix + "scheduler_last_epoch"] = std::to_string(*s.scheduler_last_epoch);
    if (s.sampler_epoch) metadata[kPrefix + "sampler_epoch"] = std::to_string(*s.sampler_epoch);
    if (s.epoch_samples) metadata[kPrefix + "epoch_samples"] = std::to_string(*s.epoch_samples);
    if (s.world_size) metadata[kPrefix + "world_size"] = std::to_string(*s.world_size);
    if (s.global_batch_size) metadata[kPrefix + "global_batch_size"] = std::to_string(*s.global_batch_size);
    for (auto& [name, g] : s.generators) {
      LOOM_CHECK(!name.empty() && name.find('.') == std::string::npos, describe(path), ": generator name '", name,
                 "' must be non-empty and contain no '.'");
      metadata[kGenerator + name + ".seed"] = std::to_string(g.seed);
      metadata[kGenerator + name + ".counter"] = std::to_string(g.counter);
    }
    for (auto& [key, value] : s.extra_metadata) metadata[kExtra + key] = value;
    for (auto& [name, t] : s.optimizer) tensors.emplace_back(kOptimizer + name, t);
    for (auto& [name, t] : s.extra_tensors) tensors.emplace_back(kExtra + name, t);
  }
  save_safetensors(path, tensors, metadata);
}

void check_checkpoint_version(const Metadata& metadata, const fs::path& path) {
  auto it = metadata.find(kPrefix + "format_version");
  if (it == metadata.end()) return;  // version 1
  const int64_t version = parse_int(it->second, it->first, path);
  LOOM_CHECK(version <= kCheckpointFormatVersion, describe(path), " has format version ", version,
             ", newer than this loom reads (", kCheckpointFormatVersion,
             "): resume it with the loom that wrote it, or start without --resume");
}

Checkpoint load_checkpoint(const fs::path& path, Device device) {
  SafetensorsFile file = load_safetensors(path, device);
  Checkpoint out;
  TrainingState state;
  bool has_training = false;
  for (auto& [name, t] : file.tensors) {
    if (starts_with(name, kOptimizer)) {
      state.optimizer.emplace_back(name.substr(kOptimizer.size()), t);
    } else if (starts_with(name, kExtra)) {
      state.extra_tensors.emplace_back(name.substr(kExtra.size()), t);
    } else if (starts_with(name, kPrefix)) {
      LOOM_FAIL(describe(path), ": unknown training-state tensor '", name, "'");
    } else {
      out.model.emplace_back(name, t);
    }
  }
  check_checkpoint_version(file.metadata, path);  // before a newer version's fields look malformed
  for (auto& [key, value] : file.metadata) {
    if (!starts_with(key, kPrefix)) continue;
    has_training = true;
    const std::string field = key.substr(kPrefix.size());
    if (field == "format_version") {
      continue;  // checked first
    } else if (field == "epoch") {
      state.epoch = parse_int(value, key, path);
      LOOM_CHECK(state.epoch >= 0, describe(path), ": metadata '", key, "' is negative");
    } else if (field == "step") {
      state.step = parse_int(value, key, path);
      LOOM_CHECK(state.step >= 0, describe(path), ": metadata '", key, "' is negative");
    } else if (field == "epoch_step") {
      state.epoch_step = parse_int(value, key, path);
      LOOM_CHECK(state.epoch_step >= 0, describe(path), ": metadata '", key, "' is negative");
    } else if (field == "scheduler_last_epoch") {
      state.scheduler_last_epoch = parse_int(value, key, path);
      LOOM_CHECK(*state.scheduler_last_epoch >= 0, describe(path), ": metadata '", key, "' is negative");
    } else if (field == "sampler_epoch") {
      state.sampler_epoch = parse_int(value, key, path);
      LOOM_CHECK(*state.sampler_epoch >= 0, describe(path), ": metadata '", key, "' is negative");
    } else if (field == "epoch_samples" || field == "world_size" || field == "global_batch_size") {
      const int64_t count = parse_int(value, key, path);
      LOOM_CHECK(count >= (field == "epoch_samples" ? 0 : 1), describe(path), ": metadata '", key, "' is out of range");
      (field == "epoch_samples" ? state.epoch_samples : field == "world_size" ? state.world_size
                                                                              : state.global_batch_size) = count;
    } else if (starts_with(key, kGenerator)) {
      const std::string rest = key.substr(kGenerator.size());  // "<name>.seed" or "<name>.counter"
      const size_t dot = rest.rfind('.');
      const std::string name = dot == std::string::npos ? "" : rest.substr(0, dot);
      const std::string part = dot == std::string::npos ? "" : rest.substr(dot + 1);
      LOOM_CHECK(!name.empty() && (part == "seed" || part == "counter"), describe(path),
                 ": unknown training-state metadata '", key, "'");
      (part == "seed" ? state.generators[name].seed : state.generators[name].counter) = parse_uint(value, key, path);
    } else if (starts_with(key, kExtra)) {
      state.extra_metadata[key.substr(kExtra.size())] = value;
    } else {
      LOOM_FAIL(describe(path), ": unknown training-state metadata '", key, "'");
    }
  }
  has_training = has_training || !state.optimizer.empty() || !state.extra_tensors.empty();
  if (has_training) {
    LOOM_CHECK(file.metadata.count(kPrefix + "epoch") && file.metadata.count(kPrefix + "step"), describe(path),
               ": the training state lacks its epoch or step");
    // The batches done in the current epoch are among the steps done in all.
    LOOM_CHECK(state.epoch_step <= state.step, describe(path), ": the training state records batch ",
               state.epoch_step, " of its epoch after only ", state.step, " steps in all; the file is corrupt");
    out.training = std::move(state);
  }
  return out;
}

void load_model_state(Module& module, const NamedTensors& state, const std::string& source) {
  std::map<std::string, const Tensor*> given;
  for (auto& [name, t] : state) given[name] = &t;
  std::vector<std::string> problems;    // missing and unexpected names
  std::vector<std::string> mismatches;  // a tensor of the same name and another shape or dtype: listed first
  std::set<std::string> expected;
  for (auto& [name, slot] : module.state_dict()) {
    expected.insert(name);
    auto it = given.find(name);
    if (it == given.end()) {
      problems.push_back("missing '" + name + "'");
      continue;
    }
    const Tensor& source_tensor = *it->second;
    if (source_tensor.sizes() != slot.sizes()) {
      mismatches.push_back("'" + name + "' has shape " + shape_str(source_tensor.sizes()) + ", the model expects " +
                         shape_str(slot.sizes()));
    } else if (source_tensor.dtype() != slot.dtype()) {
      mismatches.push_back(str("'", name, "' has dtype ", safetensors_dtype_name(source_tensor.dtype()),
                             ", the model expects ", safetensors_dtype_name(slot.dtype())));
    }
  }
  for (auto& [name, t] : state) {
    if (!expected.count(name)) problems.push_back("unexpected '" + name + "'");
  }
  problems.insert(problems.begin(), mismatches.begin(), mismatches.end());
  if (!problems.empty()) {
    // A checkpoint of another architecture mismatches everywhere: name the first few.
    constexpr size_t kShown = 8;
    std::string message = source + " does not match the model:";
    for (size_t i = 0; i < std::min(problems.size(), kShown); ++i) message += (i ? "; " : " ") + problems[i];
    if (problems.size() > kShown) message += str("; and ", problems.size() - kShown, " more");
    LOOM_FAIL(message);
  }
  module.load_state_dict(state, true);
}

}  // namespace loom::nn
