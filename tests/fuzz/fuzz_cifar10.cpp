// Fuzzes the CIFAR-10 binary reader: the input is one batch file. Only
// loom::Error may come out; every label read must be a class (0-9).
#include <loom/core/error.h>
#include <loom/data/cifar10.h>
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = loom::fuzz::write_input(data, size, "data_batch_1.bin");
  try {
    const loom::data::ImageDataset dataset = loom::data::read_cifar10_files({path}, "fuzz");
    (void)dataset;
  } catch (const loom::Error&) {
  }
  std::filesystem::remove(path);
  return 0;
}
