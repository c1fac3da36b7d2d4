#include <loom/core/device.h>

#include <charconv>

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
    int index = 0;
    const auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), index);
    LOOM_CHECK(error == std::errc() && end == number.data() + number.size(), "device '", text,
               "' is not valid: the GPU index is out of range");
    return Device::cuda(index);
  }
  LOOM_FAIL("device '", text, "' is not valid; expected cpu, cuda or cuda:N");
}

}  // namespace loom
