// A FILE* that writes into memory (open_memstream), for capturing what code
// that takes a stream prints; str() is everything written so far.
#pragma once

#include <stdio.h>
#include <stdlib.h>

#include <string>

namespace loom::testing {

struct MemoryStream {
  char* text = nullptr;
  size_t size = 0;
  std::FILE* file = open_memstream(&text, &size);
  MemoryStream() = default;
  MemoryStream(const MemoryStream&) = delete;
  MemoryStream& operator=(const MemoryStream&) = delete;
  ~MemoryStream() {
    std::fclose(file);
    std::free(text);
  }
  std::string str() {
    std::fflush(file);
    return std::string(text, size);
  }
};

}  // namespace loom::testing
