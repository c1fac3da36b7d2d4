// Fuzzes the apps' --device flag parsing (apps/app_common: training_device),
// with the local rank and device count taken from the input's first bytes.
// Only loom::Error may come out.
#include <string>

#include "apps/app_common.h"
#include <loom/core/error.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int local_rank = data[0] % 16;
  const int device_count = data[1] % 9;
  const std::string name(reinterpret_cast<const char*>(data + 2), size - 2);
  try {
    (void)loom::apps::training_device(name, local_rank, device_count);
  } catch (const loom::Error&) {
  }
  return 0;
}
