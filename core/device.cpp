#include <loom/core/device.h>

#include <loom/core/error.h>

namespace loom {

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

Device parse_device(const std::string& text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.rfind("cuda:", 0) == 0) {
    const std::string number = text.substr(5);
    LOOM_CHECK(!number.empty() && number.find_first_not_of("0123456789") == std::string::npos,
               "device '", text, "' is not valid; expected cpu, cuda or cuda:N");
    return Device::cuda(std::stoi(number));
  }
  LOOM_FAIL("device '", text, "' is not valid; expected cpu, cuda or cuda:N");
}

}  // namespace loom
