// Fuzzes the IDX reader (MNIST's format): the input is one file, read as an
// image file and as a label file; gzip input (magic 1f 8b) is named .gz so the
// reader decompresses it. Only loom::Error may come out: a crash, a hang, an
// allocation a header asks for beyond what the file holds, or another
// exception is a bug.
#include <loom/core/error.h>
#include <loom/data/idx.h>
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const bool gzip = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
  const auto path = loom::fuzz::write_input(data, size, gzip ? "input.idx.gz" : "input.idx");
  try {
    const loom::data::IdxImages images = loom::data::read_idx_images(path);
    if (images.pixels.size() != static_cast<size_t>(images.count * images.rows * images.columns)) __builtin_trap();
  } catch (const loom::Error&) {
  }
  try {
    const std::vector<int64_t> labels = loom::data::read_idx_labels(path, 10);
    for (int64_t label : labels)
      if (label < 0 || label >= 10) __builtin_trap();
  } catch (const loom::Error&) {
  }
  std::filesystem::remove(path);
  return 0;
}
