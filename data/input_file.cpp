// InputFile: open(O_NONBLOCK), fstat, then plain blocking-free reads of a regular file.
#include <loom/data/input_file.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <system_error>

#include <loom/core/error.h>

namespace loom::data {
namespace fs = std::filesystem;

namespace {
std::string errno_message(int code) { return std::error_code(code, std::generic_category()).message(); }
}  // namespace

std::string describe_file_type(const fs::file_status& status) {
  switch (status.type()) {
    case fs::file_type::fifo: return "a FIFO (named pipe)";
    case fs::file_type::socket: return "a socket";
    case fs::file_type::block:
    case fs::file_type::character: return "a device";
    case fs::file_type::directory: return "a directory";
    case fs::file_type::not_found: return "a broken symbolic link";
    default: return "not a regular file";
  }
}

InputFile::InputFile(const fs::path& path, const std::string& what) : path_(path), what_(what) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd_ < 0) {
    const int code = errno;
    if (code == ENOENT) LOOM_FAIL(what, " ", path.string(), " does not exist");
    LOOM_FAIL(what, " ", path.string(), " cannot be opened: ", errno_message(code));
  }
  struct stat info {};
  if (::fstat(fd_, &info) != 0) {
    const int code = errno;
    ::close(fd_);
    LOOM_FAIL(what, " ", path.string(), ": stat failed: ", errno_message(code));
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd_);
    std::error_code ignored;
    LOOM_FAIL(what, " ", path.string(), " is ", describe_file_type(fs::status(path, ignored)),
              ", not a regular file; loom reads data only from regular files");
  }
  // A regular file never blocks; clear the flag so reads behave as usual.
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
  size_ = static_cast<uint64_t>(info.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

size_t InputFile::read(void* out, size_t bytes) {
  size_t done = 0;
  while (done < bytes) {
    const ssize_t got = ::read(fd_, static_cast<char*>(out) + done, std::min<size_t>(bytes - done, size_t{1} << 30));
    if (got < 0) {
      if (errno == EINTR) continue;
      LOOM_FAIL(what_, " ", path_.string(), ": reading failed: ", errno_message(errno));
    }
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

int InputFile::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

}  // namespace loom::data
