#include "apps/app_common.h"

#include <fstream>
#include <cstdlib>
#include <sstream>

#include "core/cuda/runtime.h"
#include "core/version.h"
#include "ops/cpu/gemm.h"

namespace loom::apps {

Device training_device(const std::string& name, int local_rank, int device_count) {
  if (name == "auto" && device_count == 0) return Device::cpu();
  Device device = name == "auto" ? Device::cuda(0) : parse_device(name);
  if (device.is_cuda() && name.find(':') == std::string::npos)
    device.index = device_count > 0 ? local_rank % device_count : local_rank;
  return device;
}

Device resolve_training_device(const std::string& name, int local_rank) {
  const Device device = training_device(name, local_rank, name == "cpu" ? 0 : cuda::device_count());
  // The current device for the whole process (torch.cuda.set_device(local_rank)): ops launch on it.
  if (device.is_cuda()) cuda::set_device(device.index);
  return device;
}

std::string format_duration(std::chrono::steady_clock::duration elapsed) {
  const long long micros = std::chrono::duration_cast<std::chrono::microseconds>(elapsed).count();
  const long long seconds = micros / 1000000;
  char text[64];
  std::snprintf(text, sizeof(text), "%lld:%02lld:%02lld.%06lld", seconds / 3600, (seconds / 60) % 60, seconds % 60,
                micros % 1000000);
  return text;
}

long peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      std::istringstream fields(line.substr(6));
      long kilobytes = 0;
      fields >> kilobytes;
      return kilobytes * 1024;
    }
  }
  return 0;
}

std::string version_text(const std::string& program) {
  const int devices = cuda::device_count();
  return program + " " + version() + "\n" + build_summary() + "this machine: f32 GEMM kernel " +
         ops::cpu::gemm_kernel_name() + ", " + std::to_string(devices) + " CUDA device" + (devices == 1 ? "" : "s") +
         " visible\n";
}

}  // namespace loom::apps

namespace loom::apps {

CLI::Validator at_least(double minimum) {
  return CLI::Validator(
      [minimum](std::string& text) -> std::string {
        char* end = nullptr;
        const double value = std::strtod(text.c_str(), &end);
        if (text.empty() || end == nullptr || *end != '\0') return "'" + text + "' is not a number";
        if (value < minimum) {
          std::ostringstream out;
          out << "must be a number >= " << minimum << ", got '" << text << "'";
          return out.str();
        }
        return "";
      },
      ">= " + std::to_string(minimum));
}

CLI::Validator whole_at_least(long long minimum) {
  return CLI::Validator(
      [minimum](std::string& text) -> std::string {
        char* end = nullptr;
        const long long value = std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || end == nullptr || *end != '\0') return "'" + text + "' is not a whole number";
        if (value < minimum) return "must be a whole number >= " + std::to_string(minimum) + ", got '" + text + "'";
        return "";
      },
      ">= " + std::to_string(minimum));
}

void add_version_flag(CLI::App& app, const std::string& program) {
  // app.exit() ends the text with a newline of its own.
  auto text = [program] {
    std::string text = version_text(program);
    if (!text.empty() && text.back() == '\n') text.pop_back();
    return text;
  };
  app.set_version_flag("--version", text, "print the version and what this build holds, then exit");
}

}  // namespace loom::apps
