// Fuzzes the CIFAR-10 binary reader: the input is one batch file. Only
// loom::Error may come out; every label read must be a class (0-9), and a
// file that reads must hold at least one image (an empty batch is an error).
#include <loom/core/error.h>
#include <loom/data/cifar10.h>
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = loom::fuzz::write_input(data, size, "data_batch_1.bin");
  try {
    const loom::data::ImageDataset dataset = loom::data::read_cifar10_files({path}, "fuzz");
    if (dataset.size() == 0) __builtin_trap();
    for (int64_t i = 0; i < dataset.size(); ++i)
      if (dataset.label(i) < 0 || dataset.label(i) > 9) __builtin_trap();
  } catch (const loom::Error&) {
  }
  std::filesystem::remove(path);
  return 0;
}
