// Internals of the shm backend (dist/process_group_shm.cpp), by seam:
// waiting on shared words and peers and the segment files (shm_files.cpp),
// and the bytes of a collective: reduction arithmetic and tensors seen as
// byte streams (shm_reduce.cpp). Not part of loom's API.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <loom/core/tensor.h>
#include <loom/dist/process_group.h>

namespace loom::dist::shm {

// ---- waiting (shm_files.cpp) ----

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout);
void futex_wake_all(std::atomic<uint32_t>* word);
// False once `pid` has exited (gone, or a zombie not yet reaped).
bool process_alive(int pid);

// ---- segment files (shm_files.cpp) ----
//
// Shared-memory files never keep a name while a process waits: the creator
// unlinks the name as soon as the file is created and sized, keeps the
// descriptor open until every rank has mapped it, and publishes
// "<name> <pid> <descriptor>"; the others open the file through
// /proc/<pid>/fd/<descriptor>. A rank killed while it waits (SIGKILL runs no
// destructor) thus leaves nothing in /dev/shm: its descriptor closes with it.

std::string random_hex();
std::string errno_text();
// Creates /dev/shm<name> with `bytes` reserved, unlinks the name, returns the
// descriptor (or -1 with `why` set).
int create_unlinked(const std::string& name, size_t bytes, std::string& why);
// What a creator publishes for the file behind `fd`.
std::string published_file(const std::string& name, int fd);
// Opens the file another rank published with published_file(); -1 with `why`
// set when it cannot (that rank runs on another host, in another PID or IPC
// namespace, or has ended).
int open_published(const std::string& published, std::string& why);

// ---- the bytes of a collective (shm_reduce.cpp) ----

// out[i] = op over ranks of sources[r][i], i < count, accumulated in float
// for f16 / bf16 (the element type otherwise) and rounded once. `out` may be
// one of the sources.
void reduce_bytes(DType dtype, std::byte* out, const std::vector<const std::byte*>& sources, size_t count,
                  ReduceOp op, int world);

// A tensor's bytes as the collective sees them: its own memory when it is
// contiguous, else a contiguous copy written back with finish().
class Staged {
 public:
  Staged(const Tensor& tensor, bool read);
  std::byte* data() const { return static_cast<std::byte*>(buffer_.raw_data()); }
  size_t bytes() const { return buffer_.nbytes(); }
  void finish() const;

 private:
  Tensor tensor_;
  Tensor buffer_;
};

// Several buffers read or written as one stream of bytes.
struct Span {
  std::byte* data;
  size_t bytes;
};
using Spans = std::vector<Span>;

void copy_from_spans(const Spans& spans, size_t offset, size_t bytes, std::byte* destination);
void copy_to_spans(const std::byte* source, const Spans& spans, size_t offset, size_t bytes);
size_t total_bytes(const Spans& spans);

}  // namespace loom::dist::shm
