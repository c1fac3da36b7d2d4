// The shm backend's waiting (futexes, whether a peer lives) and its segment
// files (created unlinked, opened through the creator's descriptor).
#include <loom/dist/shm_internal.h>

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include <loom/core/error.h>

namespace loom::dist::shm {

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

bool process_alive(int pid) {
  if (::kill(pid, 0) == -1 && errno == ESRCH) return false;
  std::ifstream stat(str("/proc/", pid, "/stat"));
  std::string text;
  if (!std::getline(stat, text)) return true;
  size_t paren = text.rfind(')');
  if (paren == std::string::npos || paren + 2 >= text.size()) return true;
  char state = text[paren + 2];
  return state != 'Z' && state != 'X';
}

std::string random_hex() {
  std::random_device device;
  uint64_t value = (static_cast<uint64_t>(device()) << 32) ^ device();
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(value));
  return text;
}

std::string errno_text() { return std::strerror(errno); }

int create_unlinked(const std::string& name, size_t bytes, std::string& why) {
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    why = str("cannot create /dev/shm", name, ": ", errno_text());
    return -1;
  }
  ::shm_unlink(name.c_str());
  int reserved = ::ftruncate(fd, static_cast<off_t>(bytes)) == 0 ? ::posix_fallocate(fd, 0, static_cast<off_t>(bytes))
                                                                  : errno;
  if (reserved != 0) {
    why = str("cannot reserve ", bytes, " bytes in /dev/shm for ", name, ": ", std::strerror(reserved),
              " (is /dev/shm mounted and large enough?)");
    ::close(fd);
    return -1;
  }
  return fd;
}

std::string published_file(const std::string& name, int fd) { return str(name, " ", ::getpid(), " ", fd); }

int open_published(const std::string& published, std::string& why) {
  std::istringstream fields(published);
  std::string name;
  int pid = 0, fd = -1;
  if (!(fields >> name >> pid >> fd) || pid <= 0 || fd < 0) {
    why = str("'", published, "' does not name a shared-memory file");
    return -1;
  }
  const std::string link = str("/proc/", pid, "/fd/", fd);
  char target[PATH_MAX] = {};
  const ssize_t length = ::readlink(link.c_str(), target, sizeof(target) - 1);
  // The descriptor must still be that file: "/dev/shm/loom-... (deleted)".
  if (length <= 0 || std::string(target, static_cast<size_t>(length)) != "/dev/shm" + name + " (deleted)") {
    why = str("cannot find /dev/shm", name, " as descriptor ", fd, " of process ", pid,
              " (that rank runs on another host or in another IPC namespace, or in another PID namespace, or has ended)");
    return -1;
  }
  int opened = ::open(link.c_str(), O_RDWR | O_CLOEXEC);
  if (opened < 0) why = str("cannot open /dev/shm", name, " through ", link, ": ", errno_text());
  return opened;
}

}  // namespace loom::dist::shm
