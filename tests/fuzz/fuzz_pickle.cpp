// Fuzzes the restricted pickle reader (data/pickle, torchvision's CIFAR-10
// python batches): the input is one pickle file's bytes. Only loom::Error may
// come out.
#include <string>

#include <loom/core/error.h>
#include <loom/data/pickle.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    (void)loom::data::pickle::parse(bytes, "fuzz.pkl");
  } catch (const loom::Error&) {
  }
  return 0;
}
