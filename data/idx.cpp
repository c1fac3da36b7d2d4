// IDX reader and writer. Reads go through zlib's gzread, which also reads
// uncompressed files transparently, so one code path serves .gz and raw files.
#include <loom/data/idx.h>

#include <zlib.h>

#include <algorithm>
#include <array>
#include <new>
#include <cerrno>
#include <optional>
#include <string>
#include <system_error>

#include <loom/core/error.h>
#include <loom/data/input_file.h>

namespace loom::data {
namespace fs = std::filesystem;

namespace {

bool is_gzip_path(const fs::path& path) { return path.extension() == ".gz"; }

// Owns a zlib file handle opened for reading (gzip or raw) or writing.
class GzFile {
 public:
  GzFile(const fs::path& path, const char* mode) : path_(path) {
    errno = 0;
    if (mode[0] == 'r') {
      // Refuses a FIFO or device before zlib would block reading it.
      InputFile file(path, "IDX file");
      file_bytes_ = file.size();
      handle_ = gzdopen(file.release(), mode);
    } else {
      handle_ = gzopen(path.c_str(), mode);
    }
    if (!handle_) {
      LOOM_FAIL("IDX file ", path.string(), ": cannot open for ", mode[0] == 'r' ? "reading" : "writing", " (",
                std::error_code(errno, std::generic_category()).message(), ")");
    }
    gzbuffer(handle_, 1 << 20);
  }
  ~GzFile() {
    if (handle_) gzclose(handle_);
  }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  // Reads up to `bytes`; returns how many were read (fewer at end of file).
  size_t read(void* out, size_t bytes) {
    size_t done = 0;
    while (done < bytes) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(bytes - done, 1u << 30));
      const int got = gzread(handle_, static_cast<char*>(out) + done, chunk);
      if (got < 0) LOOM_FAIL("IDX file ", path_.string(), ": read failed (", error_message(), ")");
      if (got == 0) break;
      done += static_cast<size_t>(got);
    }
    return done;
  }

  void write(const void* data, size_t bytes) {
    size_t done = 0;
    while (done < bytes) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(bytes - done, 1u << 30));
      const int put = gzwrite(handle_, static_cast<const char*>(data) + done, chunk);
      if (put <= 0) LOOM_FAIL("IDX file ", path_.string(), ": write failed (", error_message(), ")");
      done += static_cast<size_t>(put);
    }
  }

  // The file's size on disk (compressed or not), for reads.
  uint64_t file_bytes() const { return file_bytes_; }
  // True when the file is read as it is, without gzip framing (valid after the first read).
  bool uncompressed() const { return gzdirect(handle_) != 0; }
  // Back to the first byte.
  void rewind() {
    if (gzrewind(handle_) != 0) LOOM_FAIL("IDX file ", path_.string(), ": rewinding failed (", error_message(), ")");
  }

  // Flushes and closes, reporting errors a destructor would have to swallow.
  void close() {
    const int status = gzclose(handle_);
    handle_ = nullptr;
    if (status != Z_OK) LOOM_FAIL("IDX file ", path_.string(), ": closing failed (zlib status ", status, ")");
  }

 private:
  std::string error_message() const {
    int code = 0;
    const char* message = gzerror(handle_, &code);
    return message ? message : "unknown zlib error";
  }

  fs::path path_;
  gzFile handle_ = nullptr;
  uint64_t file_bytes_ = 0;
};

uint32_t read_big_endian(const uint8_t* bytes) {
  return (uint32_t{bytes[0]} << 24) | (uint32_t{bytes[1]} << 16) | (uint32_t{bytes[2]} << 8) | uint32_t{bytes[3]};
}

void append_big_endian(std::vector<uint8_t>& out, uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(value >> shift));
}

std::string describe_magic(uint32_t magic) {
  if (magic == idx_image_magic) return " (an IDX image file)";
  if (magic == idx_label_magic) return " (an IDX label file)";
  return "";
}

// Reads the header words (magic then `dimensions` sizes) and checks the magic.
std::vector<uint32_t> read_header(GzFile& file, const fs::path& path, uint32_t expected_magic, size_t dimensions,
                                  const char* kind) {
  std::vector<uint8_t> bytes(4 * (1 + dimensions));
  const size_t got = file.read(bytes.data(), bytes.size());
  if (got < 4) {
    LOOM_FAIL("IDX file ", path.string(), ": only ", got, " bytes, too short for an IDX header");
  }
  const uint32_t magic = read_big_endian(bytes.data());
  if (magic != expected_magic) {
    LOOM_FAIL("IDX file ", path.string(), ": magic number ", magic, describe_magic(magic), ", expected ",
              expected_magic, " for ", kind);
  }
  if (got < bytes.size()) {
    LOOM_FAIL("IDX file ", path.string(), ": truncated header (", got, " bytes; expected ", bytes.size(), ")");
  }
  std::vector<uint32_t> words(1 + dimensions);
  for (size_t i = 0; i < words.size(); ++i) words[i] = read_big_endian(bytes.data() + 4 * i);
  return words;
}

// Deflate's best ratio: a gzip stream of n bytes inflates to at most about
// 1032 n bytes (RFC 1951: 258 bytes per 2-bit match code, less framing).
constexpr uint64_t kMaxGzipRatio = 1032;
// Payloads up to this size are read as they arrive; larger ones are first
// measured without being kept, so a header that lies costs no memory.
constexpr size_t kMeasureAbove = size_t{64} << 20;

// Inflates and counts the bytes left, up to `limit` + 1, keeping none of them.
size_t count_remaining(GzFile& file, size_t limit) {
  std::vector<uint8_t> scratch(size_t{1} << 20);
  size_t counted = 0;
  while (counted <= limit) {
    const size_t read = file.read(scratch.data(), std::min(scratch.size(), limit + 1 - counted));
    if (read == 0) break;
    counted += read;
  }
  return counted;
}

[[noreturn]] void fail_payload_size(const fs::path& path, const std::string& what, size_t expected, size_t held) {
  if (held < expected) {
    LOOM_FAIL("IDX file ", path.string(), ": truncated; the header declares ", what, " (", expected,
              " bytes of data) but the file holds only ", held);
  }
  LOOM_FAIL("IDX file ", path.string(), ": has bytes after the ", what, " its header declares; the file is ",
            "corrupt or not an IDX file");
}

// Reads exactly `expected` payload bytes (after a header of `header_bytes`)
// and checks nothing follows them. Before allocating, the size the header
// declares is checked against what the file can hold: exactly its remaining
// bytes when it is not compressed, at most 1032 times its size when it is
// gzip; a large gzip payload is inflated once to count it before it is kept.
// So a corrupt or hostile header fails at once or after a streaming pass,
// never after allocating what it declares (a header declaring 4 billion
// labels once made a 4 MB gzip file cost 4.5 GB, then std::bad_alloc).
std::vector<uint8_t> read_payload(GzFile& file, const fs::path& path, size_t header_bytes, size_t expected,
                                  const std::string& what) {
  const uint64_t file_bytes = file.file_bytes();
  if (file.uncompressed()) {
    const uint64_t held = file_bytes - std::min<uint64_t>(file_bytes, header_bytes);
    if (held != expected) fail_payload_size(path, what, expected, static_cast<size_t>(held));
  } else if (expected / kMaxGzipRatio > file_bytes) {
    LOOM_FAIL("IDX file ", path.string(), ": the header declares ", what, " (", expected,
              " bytes of data) but a gzip file of ", file_bytes, " bytes inflates to at most about ",
              file_bytes * kMaxGzipRatio, "; the header is corrupt or the file truncated");
  } else if (expected > kMeasureAbove) {
    const size_t held = count_remaining(file, expected);
    if (held != expected) fail_payload_size(path, what, expected, held);
    file.rewind();
    std::vector<uint8_t> skipped(header_bytes);
    LOOM_CHECK(file.read(skipped.data(), skipped.size()) == header_bytes, "IDX file ", path.string(),
               ": could not read its header again after counting its data");
  }
  std::vector<uint8_t> out;
  try {
    out.resize(expected);
  } catch (const std::bad_alloc&) {
    LOOM_FAIL("IDX file ", path.string(), ": the ", what, " it holds (", expected,
              " bytes) do not fit in this machine's memory");
  }
  const size_t got = file.read(out.data(), expected);
  uint8_t extra = 0;
  if (got < expected || file.read(&extra, 1) != 0) fail_payload_size(path, what, expected, got + (got < expected ? 0 : 1));
  return out;
}

void write_file(const fs::path& path, const std::vector<uint8_t>& header, const uint8_t* payload, size_t bytes) {
  GzFile file(path, is_gzip_path(path) ? "wb6" : "wbT");  // 'T': plain file, no gzip framing
  file.write(header.data(), header.size());
  file.write(payload, bytes);
  file.close();
}

}  // namespace

IdxImages read_idx_images(const fs::path& path) {
  GzFile file(path, "rb");
  const std::vector<uint32_t> header = read_header(file, path, idx_image_magic, 3, "an image file");
  IdxImages images;
  images.count = header[1];
  images.rows = header[2];
  images.columns = header[3];
  if (images.rows == 0 || images.columns == 0) {
    LOOM_FAIL("IDX file ", path.string(), ": images of ", images.rows, "x", images.columns,
              " pixels; both dimensions must be positive");
  }
  // Each dimension is below 2^32, so rows * columns fits; the total must stay
  // far below 2^63 for the products here to be meaningful.
  const uint64_t image_pixels = static_cast<uint64_t>(images.rows) * static_cast<uint64_t>(images.columns);
  if (images.count > 0 && image_pixels > (uint64_t{1} << 40) / static_cast<uint64_t>(images.count)) {
    LOOM_FAIL("IDX file ", path.string(), ": the header declares ", images.count, " images of ", images.rows, "x",
              images.columns, " pixels, more than 1 TiB; the header is corrupt");
  }
  images.pixels = read_payload(file, path, 16, static_cast<size_t>(images.count * images.rows * images.columns),
                               str(images.count, " images of ", images.rows, "x", images.columns));
  return images;
}

std::vector<int64_t> read_idx_labels(const fs::path& path, int64_t num_classes) {
  GzFile file(path, "rb");
  const std::vector<uint32_t> header = read_header(file, path, idx_label_magic, 1, "a label file");
  const std::vector<uint8_t> bytes = read_payload(file, path, 8, header[1], str(header[1], " labels"));
  std::vector<int64_t> labels(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] >= num_classes) {
      LOOM_FAIL("IDX file ", path.string(), ": label ", int{bytes[i]}, " at index ", i, " is outside 0..",
                num_classes - 1);
    }
    labels[i] = bytes[i];
  }
  return labels;
}

ImageDataset read_idx_dataset(const fs::path& images_path, const fs::path& labels_path, int64_t num_classes) {
  // The counts first, from the headers alone: a mismatch fails before either payload is inflated.
  GzFile image_file(images_path, "rb"), label_file(labels_path, "rb");
  const uint32_t image_count = read_header(image_file, images_path, idx_image_magic, 3, "an image file")[1];
  const uint32_t label_count = read_header(label_file, labels_path, idx_label_magic, 1, "a label file")[1];
  if (image_count != label_count) {
    LOOM_FAIL("IDX files do not match: ", images_path.string(), " holds ", image_count, " images but ",
              labels_path.string(), " holds ", label_count, " labels");
  }
  IdxImages images = read_idx_images(images_path);
  std::vector<int64_t> labels = read_idx_labels(labels_path, num_classes);
  if (static_cast<int64_t>(labels.size()) != images.count) {
    LOOM_FAIL("IDX files do not match: ", images_path.string(), " holds ", images.count, " images but ",
              labels_path.string(), " holds ", labels.size(), " labels");
  }
  return ImageDataset(1, images.rows, images.columns, std::move(images.pixels), std::move(labels),
                      images_path.filename().string());
}

namespace {

constexpr std::array<const char*, 4> mnist_names = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                                    "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};

// The four files in `directory`, raw or .gz; `missing` lists those absent.
std::array<fs::path, 4> mnist_files(const fs::path& directory, std::string& missing) {
  std::array<fs::path, 4> found;
  missing.clear();
  for (size_t i = 0; i < mnist_names.size(); ++i) {
    const fs::path raw = directory / mnist_names[i];
    const fs::path gz = directory / (std::string(mnist_names[i]) + ".gz");
    if (fs::is_regular_file(raw)) {
      found[i] = raw;
    } else if (fs::is_regular_file(gz)) {
      found[i] = gz;
    } else {
      missing += str(missing.empty() ? "" : ", ", mnist_names[i], "[.gz]");
    }
  }
  return found;
}

std::vector<fs::path> mnist_candidates(const fs::path& directory) {
  return {directory, directory / "MNIST" / "raw", directory / "FashionMNIST" / "raw"};
}

}  // namespace

std::optional<fs::path> find_mnist(const fs::path& directory) {
  std::string missing;
  for (const fs::path& candidate : mnist_candidates(directory)) {
    mnist_files(candidate, missing);
    if (missing.empty()) return candidate;
  }
  return std::nullopt;
}

TrainTestSplit load_mnist(const fs::path& directory) {
  if (!fs::is_directory(directory)) {
    LOOM_FAIL("MNIST directory ", directory.string(), " does not exist or is not a directory");
  }
  std::string missing;
  std::string looked;
  for (const fs::path& candidate : mnist_candidates(directory)) {
    const std::array<fs::path, 4> found = mnist_files(candidate, missing);
    if (missing.empty()) {
      TrainTestSplit split{read_idx_dataset(found[0], found[1]), read_idx_dataset(found[2], found[3])};
      // A model built for the training images would fail on other test images with a shape error.
      if (split.train.height() != split.test.height() || split.train.width() != split.test.width()) {
        LOOM_FAIL("IDX files do not match: ", found[0].string(), " holds images of ", split.train.height(), "x",
                  split.train.width(), " pixels but ", found[2].string(), " holds images of ", split.test.height(),
                  "x", split.test.width(), "; the training and test images must have one size");
      }
      return split;
    }
    if (fs::is_directory(candidate)) looked += str(looked.empty() ? "" : "; ", candidate.string(), " is missing ", missing);
  }
  LOOM_FAIL("MNIST directory ", directory.string(), " holds no complete set of IDX files (train-images-idx3-ubyte, "
            "train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, each raw or .gz) in itself or "
            "in MNIST/raw/ or FashionMNIST/raw/ (torchvision's root): ", looked,
            "; download the IDX files of MNIST or Fashion-MNIST into it");
}

void write_idx_images(const fs::path& path, const IdxImages& images) {
  LOOM_CHECK(static_cast<int64_t>(images.pixels.size()) == images.count * images.rows * images.columns,
             "write_idx_images: ", images.pixels.size(), " pixels do not hold ", images.count, " images of ",
             images.rows, "x", images.columns);
  std::vector<uint8_t> header;
  for (int64_t word : {int64_t{idx_image_magic}, images.count, images.rows, images.columns}) {
    append_big_endian(header, static_cast<uint32_t>(word));
  }
  write_file(path, header, images.pixels.data(), images.pixels.size());
}

void write_idx_labels(const fs::path& path, const std::vector<int64_t>& labels) {
  std::vector<uint8_t> header;
  append_big_endian(header, idx_label_magic);
  append_big_endian(header, static_cast<uint32_t>(labels.size()));
  std::vector<uint8_t> bytes(labels.size());
  for (size_t i = 0; i < labels.size(); ++i) {
    LOOM_CHECK(labels[i] >= 0 && labels[i] <= 255, "write_idx_labels: label ", labels[i], " at index ", i,
               " does not fit in a byte");
    bytes[i] = static_cast<uint8_t>(labels[i]);
  }
  write_file(path, header, bytes.data(), bytes.size());
}

}  // namespace loom::data
