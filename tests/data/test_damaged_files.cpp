// Damaged and hostile data files (#50): each is refused with a line naming the
// file and what is wrong, or read without costing more than its data; none
// blocks (a FIFO named like a data file), none shrinks a dataset in silence.
// Peak memory is measured in-process: /proc/self/clear_refs resets the
// high-water mark (VmHWM) and the test reads how far it rose.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <zlib.h>

#include <fstream>
#include <optional>
#include <string>

#include <loom/data/cifar10.h>
#include <loom/data/idx.h>
#include <loom/data/image_folder.h>
#include <loom/data/pickle.h>
#include "tests/data/helpers.h"

using namespace loom::data;
using namespace loom::data::testing;
namespace fs = std::filesystem;

namespace {

// A field of /proc/self/status in KiB ("VmHWM", "VmRSS").
int64_t status_kib(const std::string& field) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  }
  return -1;
}

// How far the resident set rose above its level at the start while `action`
// ran, in MiB; nullopt where the kernel does not let the peak be reset.
template <class Action>
std::optional<int64_t> peak_growth_mib(Action&& action) {
  {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";  // reset VmHWM to the current RSS
    if (!clear.flush()) return std::nullopt;
  }
  const int64_t before = status_kib("VmRSS");
  action();
  const int64_t peak = status_kib("VmHWM");
  if (before < 0 || peak < 0) return std::nullopt;
  return (peak - before) / 1024;
}

// Writes `header` then `zeros` zero bytes then `noise` incompressible bytes, gzip-compressed, in pieces.
void write_gzip_stream(const fs::path& path, const std::vector<uint8_t>& header, size_t zeros, size_t noise) {
  gzFile file = gzopen(path.c_str(), "wb9");
  REQUIRE(file != nullptr);
  gzwrite(file, header.data(), static_cast<unsigned>(header.size()));
  const std::vector<uint8_t> block(size_t{1} << 20, 0);
  for (size_t left = zeros; left > 0;) {
    const size_t chunk = std::min(left, block.size());
    gzwrite(file, block.data(), static_cast<unsigned>(chunk));
    left -= chunk;
  }
  std::vector<uint8_t> random(noise);
  uint64_t state = 88172645463325252ull;
  for (uint8_t& byte : random) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;  // xorshift64
    byte = static_cast<uint8_t>(state >> 32);
  }
  gzwrite(file, random.data(), static_cast<unsigned>(random.size()));
  gzclose(file);
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("a gzipped IDX header declaring billions of labels is refused at once by what the stream can hold") {
  TempDir dir;
  const fs::path path = dir / "train-labels-idx1-ubyte.gz";
  write_gzip_stream(path, idx_header({2049, 4000000000u}), size_t{1} << 20, 0);  // 1 MiB of labels in ~1 KB
  std::string message;
  const auto growth = peak_growth_mib([&] { message = error_message([&] { read_idx_labels(path); }); });
  CHECK_MESSAGE(contains(message, "IDX file " + path.string() + ": the header declares 4000000000 labels"), message);
  CHECK_MESSAGE(contains(message, "bytes inflates to at most about"), message);
  if (growth) CHECK(*growth < 16);
  // The same for images: 3 billion 1x1 images.
  const fs::path images = dir / "train-images-idx3-ubyte.gz";
  write_gzip_stream(images, idx_header({2051, 3000000000u, 1, 1}), 4096, 0);
  CHECK(contains(error_message([&] { read_idx_images(images); }), "the header declares 3000000000 images of 1x1"));
}

TEST_CASE("a gzipped IDX whose stream ends before its header's count fails without allocating that count") {
  // 70 MB declared; 68 MB of zeros and 16 KB of noise inflate from ~80 KB, enough for the ratio bound to pass,
  // so the stream is measured while it is inflated, without keeping it.
  TempDir dir;
  const fs::path path = dir / "labels.gz";
  write_gzip_stream(path, idx_header({2049, 70000000u}), 68000000, 16384);
  REQUIRE(fs::file_size(path) > 70000000 / 1032);
  std::string message;
  const auto growth = peak_growth_mib([&] { message = error_message([&] { read_idx_labels(path); }); });
  CHECK_MESSAGE(contains(message, "IDX file " + path.string() +
                                      ": truncated; the header declares 70000000 labels (70000000 bytes of data) but "
                                      "the file holds only 68016384"),
                message);
  if (growth) CHECK_MESSAGE(*growth < 32, "peak growth ", *growth, " MiB");
}

TEST_CASE("image and label counts that differ are refused from the headers, before the payloads") {
  TempDir dir;
  write_gzip_stream(dir / "images.gz", idx_header({2051, 1000000, 28, 28}), 1000, 0);  // truncated payload
  write_idx_labels(dir / "labels", std::vector<int64_t>(3, 1));
  const std::string message = error_message([&] { read_idx_dataset(dir / "images.gz", dir / "labels"); });
  CHECK_MESSAGE(contains(message, "IDX files do not match: " + (dir / "images.gz").string() + " holds 1000000 images but " +
                                      (dir / "labels").string() + " holds 3 labels"),
                message);
}

TEST_CASE("MNIST test images of another size than the training images name both files and sizes") {
  TempDir dir;
  write_idx_images(dir / "train-images-idx3-ubyte", IdxImages{2, 28, 28, std::vector<uint8_t>(2 * 28 * 28, 7)});
  write_idx_labels(dir / "train-labels-idx1-ubyte", {1, 2});
  write_idx_images(dir / "t10k-images-idx3-ubyte.gz", IdxImages{1, 32, 30, std::vector<uint8_t>(32 * 30, 9)});
  write_idx_labels(dir / "t10k-labels-idx1-ubyte.gz", {3});
  const std::string message = error_message([&] { load_mnist(dir.path()); });
  CHECK_MESSAGE(contains(message, "IDX files do not match: " + (dir / "train-images-idx3-ubyte").string() +
                                      " holds images of 28x28 pixels but " +
                                      (dir / "t10k-images-idx3-ubyte.gz").string() + " holds images of 32x30"),
                message);
}

TEST_CASE("a CIFAR-10 python batch followed by 1 GiB of stray bytes reads only the pickle") {
  const std::string python = python_with("numpy");
  REQUIRE_MESSAGE(!python.empty(), "no python3 with numpy: apt-get install python3-numpy");
  TempDir dir;
  run_python(python, str_args("make_cifar_pickles.py", (dir / "batches").string(), "default",
                              "--train-per-file 40 --test 3"));
  const fs::path batch = dir / "batches" / "data_batch_1";
  const uintmax_t pickle_bytes = fs::file_size(batch);
  fs::resize_file(batch, pickle_bytes + (uintmax_t{1} << 30));  // sparse: costs no disk
  std::optional<ImageDataset> dataset;
  const auto growth = peak_growth_mib([&] { dataset = read_cifar10_pickle_files({batch}, "with trailing bytes"); });
  REQUIRE(dataset.has_value());
  CHECK(dataset->size() == 40);
  for (int64_t i = 0; i < 40; ++i) CHECK(dataset->label(i) == (i * 3 + 1) % 10);  // make_cifar_pickles.py's labels
  CHECK(dataset->image(5)[100] == static_cast<uint8_t>((5 * 131 + 100 * 7) % 256));
  // The batch is 40 x 3073 bytes; reading the file whole took over 1 GiB.
  if (growth) CHECK_MESSAGE(*growth < 64, "peak growth ", *growth, " MiB");
}

TEST_CASE("no reader opens a FIFO named like its data file: each refuses it by name at once") {
  TempDir dir;
  const fs::path fifo = dir / "data_batch_1";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const std::string fifo_line = fifo.string() + " is a FIFO (named pipe), not a regular file";
  CHECK(contains(error_message([&] { read_idx_images(fifo); }), "IDX file " + fifo_line));
  CHECK(contains(error_message([&] { read_idx_labels(fifo); }), "IDX file " + fifo_line));
  CHECK(contains(error_message([&] { pickle::load(fifo); }), "pickle file " + fifo_line));
  CHECK(contains(error_message([&] { read_cifar10_files({fifo}, "x"); }), "CIFAR-10 file " + fifo_line));
  CHECK(contains(error_message([&] { read_image(fifo, ColorMode::rgb); }), "image " + fifo_line));
}

TEST_CASE("an image file larger than any image loom decodes is refused before it is read") {
  TempDir dir;
  const fs::path huge = dir / "huge.png";
  { std::ofstream touch(huge); }
  fs::resize_file(huge, uintmax_t{1} << 30);  // sparse
  std::string message;
  const auto growth = peak_growth_mib([&] { message = error_message([&] { read_image(huge, ColorMode::rgb); }); });
  CHECK_MESSAGE(contains(message, "image " + huge.string() + " has 1073741824 bytes, over the limit of 768 MiB"), message);
  if (growth) CHECK(*growth < 16);
}
