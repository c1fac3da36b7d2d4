// Opening data files for reading without ever blocking: a FIFO, socket or
// device named like a data file (data_batch_1.bin, a .jpg in an image folder)
// is refused by name before a byte is read, instead of hanging the reader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

namespace loom::data {

// "a FIFO (named pipe)", "a socket", "a device", "a directory", "a broken
// symbolic link" or "not a regular file": what a path that is not a regular
// file is, for error messages.
std::string describe_file_type(const std::filesystem::file_status& status);

// One regular file open for reading, with its size. Opening never blocks:
// the file is opened non-blocking and checked with fstat before any read.
class InputFile {
 public:
  // Throws loom::Error "`what` PATH ..." when the file does not exist, cannot
  // be opened, or is not a regular file (naming what it is).
  InputFile(const std::filesystem::path& path, const std::string& what);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // The size fstat reported when the file was opened.
  uint64_t size() const { return size_; }
  // Reads up to `bytes` at the current position; fewer only at the end of the
  // file. Throws naming the file on a read error.
  size_t read(void* out, size_t bytes);
  // Hands the descriptor over (e.g. to zlib's gzdopen); this object no longer closes it.
  int release();

 private:
  std::filesystem::path path_;
  std::string what_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

}  // namespace loom::data
