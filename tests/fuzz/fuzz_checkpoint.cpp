// Fuzzes the safetensors / checkpoint loader (load_checkpoint reads the file
// with load_safetensors, then the training state in its metadata). Only
// loom::Error may come out; a header must not make the loader allocate more
// than the file holds.
#include <loom/core/error.h>
#include <loom/nn/checkpoint.h>
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = loom::fuzz::write_input(data, size, "checkpoint.safetensors");
  try {
    const loom::nn::Checkpoint checkpoint = loom::nn::load_checkpoint(path);
    (void)checkpoint;
  } catch (const loom::Error&) {
  }
  std::filesystem::remove(path);
  return 0;
}
