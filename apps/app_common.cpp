#include "apps/app_common.h"

#include <fstream>
#include <sstream>

namespace loom::apps {

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

}  // namespace loom::apps
