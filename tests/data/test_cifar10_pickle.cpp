// CIFAR-10 python layout (torchvision's cifar-10-batches-py): batches written
// by Python's own pickle from numpy arrays (tests/data/make_cifar_pickles.py)
// in every style Python writes them, read back pixel for pixel; malformed and
// hostile pickles refused with the file and byte offset; mutated files never
// crash the reader.
#include <doctest/doctest.h>

#include <fstream>
#include <random>
#include <utility>
#include <string>

#include <loom/core/error.h>
#include <loom/data/cifar10.h>
#include <loom/data/pickle.h>
#include "tests/data/helpers.h"

using namespace loom::data;
using namespace std::string_literals;
using namespace loom::data::testing;
namespace fs = std::filesystem;

namespace {

std::string numpy_python() {
  const std::string python = python_with("numpy");
  REQUIRE_MESSAGE(!python.empty(), "no python3 with numpy: apt-get install python3-numpy");
  return python;
}

// What make_cifar_pickles.py writes for image i, byte j, independently of the reader.
uint8_t expected_pixel(int64_t i, int64_t j) { return static_cast<uint8_t>((i * 131 + j * 7 + (j / 1024) * 3) % 256); }
int64_t expected_label(int64_t i) { return (i * 3 + 1) % 10; }

void check_images(const ImageDataset& dataset, int64_t count) {
  REQUIRE(dataset.size() == count);
  REQUIRE(dataset.channels() == 3);
  REQUIRE(dataset.height() == 32);
  REQUIRE(dataset.width() == 32);
  for (int64_t i = 0; i < count; ++i) {
    CAPTURE(i);
    REQUIRE(dataset.label(i) == expected_label(i));
    const uint8_t* image = dataset.image(i);
    for (int64_t j = 0; j < 3072; ++j) {
      if (image[j] != expected_pixel(i, j)) FAIL("pixel ", j, " is ", int{image[j]}, "; expected ", int{expected_pixel(i, j)});
    }
  }
}

std::string parse_error(const TempDir& dir, const std::string& bytes) {
  const fs::path path = dir / "hostile";
  write_bytes(path, std::vector<uint8_t>(bytes.begin(), bytes.end()));
  return error_message([&] { pickle::load(path); });
}

}  // namespace

TEST_CASE("CIFAR-10 python batches written by Python's pickle read back exactly, in every protocol style") {
  const std::string python = numpy_python();
  for (const char* style : {"py2", "protocol2", "protocol2-bytes-keys", "default", "protocol5", "numpy-labels"}) {
    CAPTURE(style);
    TempDir dir;
    run_python(python, str_args("make_cifar_pickles.py", (dir / "cifar-10-batches-py").string(), style,
                                "--train-per-file 4 --test 3"));
    // torchvision's root (holding cifar-10-batches-py/) and the batches folder itself.
    for (const fs::path& root : {dir.path(), dir / "cifar-10-batches-py"}) {
      const std::optional<Cifar10Location> found = find_cifar10(root);
      REQUIRE(found.has_value());
      CHECK(found->layout == Cifar10Layout::python);
      const TrainTestSplit split = load_cifar10(root);
      check_images(split.train, 20);
      check_images(split.test, 3);
    }
  }
}

TEST_CASE("torchvision's own CIFAR10 dataset sees the same images and labels in the pickled batches") {
  const std::string python = python_with("numpy torchvision");
  if (python.empty()) {
    MESSAGE("skipped: no python3 with torchvision (apt-get install python3-torchvision, scripts/setup.sh --peers)");
    return;
  }
  for (const char* style : {"py2", "default"}) {
    CAPTURE(style);
    TempDir dir;
    run_python(python, str_args("make_cifar_pickles.py", (dir / "cifar-10-batches-py").string(), style,
                                "--train-per-file 4 --test 3"));
    run_python(python, str_args("torchvision_view.py cifar", dir.path().string(), (dir / "view").string()));
    const TrainTestSplit split = load_cifar10(dir.path());
    for (const auto& named : {std::pair<std::string, const ImageDataset*>{"train", &split.train},
                              std::pair<std::string, const ImageDataset*>{"test", &split.test}}) {
      // Variables, not structured bindings: clang 14 cannot capture those in doctest's INFO.
      const std::string& name = named.first;
      const ImageDataset* dataset = named.second;
      CAPTURE(name);
      const std::vector<uint8_t> hwc = read_bytes(dir / "view" / (name + ".hwc"));  // torchvision's .data
      std::ifstream labels(dir / "view" / (name + ".labels"));
      REQUIRE(static_cast<int64_t>(hwc.size()) == dataset->size() * 3072);
      for (int64_t i = 0; i < dataset->size(); ++i) {
        int64_t label = -1;
        labels >> label;
        REQUIRE(dataset->label(i) == label);
        for (int64_t y = 0; y < 32; ++y)
          for (int64_t x = 0; x < 32; ++x)
            for (int64_t c = 0; c < 3; ++c)
              REQUIRE(dataset->pixel(i, c, y, x) == hwc[static_cast<size_t>(((i * 32 + y) * 32 + x) * 3 + c)]);
      }
    }
  }
}

TEST_CASE("without CIFAR-10 batches the error lists both layouts and the directories looked in") {
  TempDir dir;
  std::filesystem::create_directories(dir / "cifar-10-batches-py");
  write_bytes(dir / "cifar-10-batches-py" / "data_batch_1", std::vector<uint8_t>(10));
  const std::string message = error_message([&] { load_cifar10(dir.path()); });
  CAPTURE(message);
  CHECK(message.find('\n') == std::string::npos);
  CHECK(message.find("binary version (data_batch_1.bin .. data_batch_5.bin and test_batch.bin") != std::string::npos);
  CHECK(message.find("python version torchvision downloads (data_batch_1 .. data_batch_5 and test_batch") !=
        std::string::npos);
  CHECK(message.find("looked in: " + dir.path().string() + " is missing data_batch_1.bin") != std::string::npos);
  CHECK(message.find("; " + (dir / "cifar-10-batches-py").string() +
                     " is missing data_batch_1.bin, data_batch_2.bin, data_batch_3.bin, data_batch_4.bin, "
                     "data_batch_5.bin, test_batch.bin (binary version), or data_batch_2, data_batch_3, "
                     "data_batch_4, data_batch_5, test_batch (python version)") != std::string::npos);
}

TEST_CASE("malformed and hostile pickles are refused with the file and the byte offset") {
  TempDir dir;
  const std::string file = "pickle file " + (dir / "hostile").string() + ", byte ";
  SUBCASE("a GLOBAL outside the allow-list (os.system) is refused before anything runs") {
    const std::string message = parse_error(dir, "\x80\x02" "cos\nsystem\nq\x00X\x02\x00\x00\x00hi\x85R."s);
    CHECK(message.find(file + "2: GLOBAL 'os system' is not allowed") != std::string::npos);
  }
  SUBCASE("STACK_GLOBAL of builtins.eval") {
    const std::string message =
        parse_error(dir, "\x80\x04\x8c\x08" "builtins\x8c\x04" "eval\x93."s);
    CHECK(message.find(file + "18: GLOBAL 'builtins eval' is not allowed") != std::string::npos);
  }
  SUBCASE("an opcode the format does not use (INST)") {
    const std::string message = parse_error(dir, "\x80\x02}iq\n."s);
    CHECK(message.find(file + "3: opcode 0x69 ('i') is not one this reader accepts") != std::string::npos);
  }
  SUBCASE("protocol 0 (no PROTO opcode)") {
    const std::string message = parse_error(dir, "(dp0\n.");
    CHECK(message.find(file + "0: does not start with the PROTO opcode") != std::string::npos);
  }
  SUBCASE("a BINBYTES8 length far beyond the file") {
    const std::string message = parse_error(dir, "\x80\x04\x8e\xff\xff\xff\xff\xff\xff\xff\x7f" "ab."s);
    CHECK(message.find(file + "2: BINBYTES8 needs 9223372036854775807 bytes but only 3 remain") != std::string::npos);
  }
  SUBCASE("a negative BINSTRING length") {
    const std::string message = parse_error(dir, "\x80\x02T\xfe\xff\xff\xff."s);
    CHECK(message.find(file + "2: BINSTRING with negative length -2") != std::string::npos);
  }
  SUBCASE("a FRAME longer than the file") {
    const std::string message = parse_error(dir, "\x80\x04\x95\x00\x00\x00\x00\x01\x00\x00\x00}."s);
    CHECK(message.find(file + "2: FRAME needs 4294967296 bytes but only 2 remain") != std::string::npos);
  }
  SUBCASE("GET of a memo entry never stored") {
    const std::string message = parse_error(dir, "\x80\x02j\xff\xff\xff\x0f."s);
    CHECK(message.find(file + "2: GET of memo entry 268435455 that was never stored") != std::string::npos);
  }
  SUBCASE("a list appended to itself") {
    const std::string message = parse_error(dir, "\x80\x02]q\x00h\x00" "a."s);
    CHECK(message.find(file + "7: APPEND modifies a container that is already inside another one (or itself)") !=
          std::string::npos);
  }
  SUBCASE("containers nested too deep") {
    const std::string message = parse_error(dir, "\x80\x02" + std::string(40, ']') + std::string(39, 'a') + ".");
    CHECK(message.find("containers nested more than 32 deep") != std::string::npos);
  }
  SUBCASE("a numpy array whose shape does not match its data") {
    // numpy _reconstruct(ndarray, (0,), b'b'), then __setstate__((1, (2, 3), dtype('u1'), False, b'12345')).
    const std::string bytes = "\x80\x02"s + "cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n" +
                              "K\x00\x85"s + "C\x01" "b" "\x87R(" "K\x01" "K\x02" "K\x03" "\x86" +
                              "cnumpy\ndtype\n" + "X\x02\x00\x00\x00"s + "u1\x89\x88\x87R" "\x89" "C\x05" "12345t" "b.";
    const std::string message = parse_error(dir, bytes);
    CAPTURE(message);
    CHECK(message.find("numpy array of 6 'u1' elements has 5 data bytes; expected 6") != std::string::npos);
  }
  SUBCASE("truncated files, cut anywhere") {
    const std::string python = numpy_python();
    run_python(python, str_args("make_cifar_pickles.py", (dir / "py").string(), "default", "--train-per-file 1 --test 2"));
    const std::vector<uint8_t> whole = read_bytes(dir / "py" / "test_batch");
    for (size_t cut = 0; cut + 1 < whole.size(); cut += 97) {
      CAPTURE(cut);
      write_bytes(dir / "hostile", std::vector<uint8_t>(whole.begin(), whole.begin() + static_cast<ptrdiff_t>(cut)));
      const std::string message = error_message([&] { read_cifar10_pickle_files({dir / "hostile"}, "x"); });
      CHECK(message.find(file) != std::string::npos);
    }
  }
}

TEST_CASE("CIFAR-10 python batches with the wrong contents name the file and the problem") {
  const std::string python = numpy_python();
  TempDir dir;
  run_python(python, str_args("make_cifar_pickles.py", (dir / "py").string(), "py2", "--train-per-file 2 --test 3"));
  SUBCASE("batches.meta where a batch belongs") {
    const std::string message = error_message([&] { read_cifar10_pickle_files({dir / "py" / "batches.meta"}, "x"); });
    CHECK(message.find("CIFAR-10 file " + (dir / "py" / "batches.meta").string() +
                       " has no \"data\" or no \"labels\" entry (it looks like batches.meta)") != std::string::npos);
  }
  SUBCASE("a label above 9, with the image index") {
    std::vector<uint8_t> bytes = read_bytes(dir / "py" / "test_batch");
    const std::string text(bytes.begin(), bytes.end());
    const size_t labels = text.find("K\x01K\x04K\x07"s);  // labels 1, 4, 7 as BININT1
    REQUIRE(labels != std::string::npos);
    bytes[labels + 5] = 12;
    write_bytes(dir / "test_batch", bytes);
    const std::string message = error_message([&] { read_cifar10_pickle_files({dir / "test_batch"}, "x"); });
    CHECK(message.find((dir / "test_batch").string() + ": image 2 has label 12; labels must be 0..9") !=
          std::string::npos);
  }
}

TEST_CASE("mutated CIFAR pickles are read or refused, never crash") {
  const std::string python = numpy_python();
  TempDir dir;
  std::mt19937_64 random(24);
  for (const char* style : {"py2", "protocol2", "protocol5"}) {
    CAPTURE(style);
    run_python(python, str_args("make_cifar_pickles.py", (dir / style).string(), style, "--train-per-file 1 --test 2"));
    const std::vector<uint8_t> whole = read_bytes(dir / style / "test_batch");
    // Mutations in the opcode stream (the first 400 bytes and the last 100), where the structure lives.
    for (int trial = 0; trial < 400; ++trial) {
      std::vector<uint8_t> bytes = whole;
      const int changes = 1 + static_cast<int>(random() % 3);
      for (int c = 0; c < changes; ++c) {
        const size_t region = random() % 2 == 0 ? random() % 400 : whole.size() - 1 - random() % 100;
        bytes[region] = static_cast<uint8_t>(random());
      }
      write_bytes(dir / "mutated", bytes);
      try {
        read_cifar10_pickle_files({dir / "mutated"}, "x");
      } catch (const loom::Error&) {
      }
    }
  }
}
