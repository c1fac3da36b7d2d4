// The error for a CUDA device ordinal beyond the visible devices, in every
// build (the CUDA runtime's require_device throws it; CPU tests check it).
#include <loom/core/cuda/runtime.h>
#include <loom/core/error.h>

namespace loom::cuda {

std::string device_ordinal_error(int index, int count, const char* visible_devices) {
  if (index >= 0 && index < count) return "";
  const std::string visible = visible_devices == nullptr ? std::string("CUDA_VISIBLE_DEVICES is not set")
                                                         : str("CUDA_VISIBLE_DEVICES=", visible_devices);
  const std::string seen = count == 0   ? std::string("no CUDA device is visible")
                           : count == 1 ? std::string("only 1 CUDA device is visible")
                                        : str("only ", count, " CUDA devices are visible");
  const std::string valid = count == 0   ? std::string("use --device cpu")
                            : count == 1 ? std::string("the one visible is cuda:0")
                                         : str("the visible ones are cuda:0 to cuda:", count - 1);
  if (index < 0) return str("cuda:", index, " is not a CUDA device: ordinals start at 0 (", visible, "); ", valid);
  return str("cuda:", index, " requested but ", seen, " (", visible, "); ", valid);
}

}  // namespace loom::cuda
