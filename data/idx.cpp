// IDX reader and writer. Reads go through zlib's gzread, which also reads
// uncompressed files transparently, so one code path serves .gz and raw files.
#include <loom/data/idx.h>

#include <zlib.h>

#include <array>
#include <cerrno>
#include <optional>
#include <string>
#include <system_error>

#include <loom/core/error.h>

namespace loom::data {
namespace fs = std::filesystem;

namespace {

bool is_gzip_path(const fs::path& path) { return path.extension() == ".gz"; }

// Owns a zlib file handle opened for reading (gzip or raw) or writing.
class GzFile {
 public:
  GzFile(const fs::path& path, const char* mode) : path_(path) {
    if (mode[0] == 'r' && !fs::exists(path)) LOOM_FAIL("IDX file ", path.string(), " does not exist");
    errno = 0;
    handle_ = gzopen(path.c_str(), mode);
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

// Reads exactly `expected` payload bytes and checks nothing follows them. The
// buffer grows as data arrives (doubling from 64 KiB, then 64 MiB at a time),
// so a corrupt header declaring terabytes fails as a truncated file, and a
// small file never costs more than twice its size (a fuzzed 34-byte file once
// made it allocate and clear 64 MiB).
std::vector<uint8_t> read_payload(GzFile& file, const fs::path& path, size_t expected, const std::string& what) {
  constexpr size_t max_step = size_t{64} << 20;
  size_t step = size_t{64} << 10;
  std::vector<uint8_t> out;
  size_t got = 0;
  while (got < expected) {
    out.resize(std::min(expected, got + step));
    const size_t want = out.size() - got;
    const size_t read = file.read(out.data() + got, want);
    got += read;
    if (read < want) break;
    step = std::min(2 * step, max_step);
  }
  out.resize(got);
  if (got < expected) {
    LOOM_FAIL("IDX file ", path.string(), ": truncated; the header declares ", what, " (", expected,
              " bytes of data) but the file holds only ", got);
  }
  uint8_t extra = 0;
  if (file.read(&extra, 1) != 0) {
    LOOM_FAIL("IDX file ", path.string(), ": has bytes after the ", what, " its header declares; the file is ",
              "corrupt or not an IDX file");
  }
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
  images.pixels = read_payload(file, path, static_cast<size_t>(images.count * images.rows * images.columns),
                               str(images.count, " images of ", images.rows, "x", images.columns));
  return images;
}

std::vector<int64_t> read_idx_labels(const fs::path& path, int64_t num_classes) {
  GzFile file(path, "rb");
  const std::vector<uint32_t> header = read_header(file, path, idx_label_magic, 1, "a label file");
  const std::vector<uint8_t> bytes = read_payload(file, path, header[1], str(header[1], " labels"));
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
      return {read_idx_dataset(found[0], found[1]), read_idx_dataset(found[2], found[3])};
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
