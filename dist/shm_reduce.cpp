// The bytes of an shm collective: reduction arithmetic over ranks' slots, and
// tensors (or lists of them) seen as one stream of bytes.
#include <loom/dist/shm_internal.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

namespace loom::dist::shm {

namespace {

template <class T>
using Promoted = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float, T>;

// out[i] = op over ranks of sources[r][i], i < count, accumulated in
// Promoted<T> and rounded once. `out` may be one of the sources.
template <class T>
void reduce_elements(std::byte* out, const std::vector<const std::byte*>& sources, size_t count, ReduceOp op,
                     int world) {
  using P = Promoted<T>;
  constexpr size_t kBlock = 256;
  P acc[kBlock];
  for (size_t begin = 0; begin < count; begin += kBlock) {
    const size_t n = std::min(kBlock, count - begin);
    const T* first = reinterpret_cast<const T*>(sources[0]) + begin;
    for (size_t i = 0; i < n; ++i) acc[i] = static_cast<P>(first[i]);
    for (size_t r = 1; r < sources.size(); ++r) {
      const T* x = reinterpret_cast<const T*>(sources[r]) + begin;
      switch (op) {
        case ReduceOp::sum:
        case ReduceOp::avg:
          for (size_t i = 0; i < n; ++i) acc[i] = static_cast<P>(acc[i] + static_cast<P>(x[i]));
          break;
        case ReduceOp::max:
          for (size_t i = 0; i < n; ++i) acc[i] = acc[i] < static_cast<P>(x[i]) ? static_cast<P>(x[i]) : acc[i];
          break;
        case ReduceOp::min:
          for (size_t i = 0; i < n; ++i) acc[i] = static_cast<P>(x[i]) < acc[i] ? static_cast<P>(x[i]) : acc[i];
          break;
      }
    }
    if (op == ReduceOp::avg) {
      for (size_t i = 0; i < n; ++i) acc[i] = static_cast<P>(acc[i] / static_cast<P>(world));
    }
    T* result = reinterpret_cast<T*>(out) + begin;
    for (size_t i = 0; i < n; ++i) result[i] = static_cast<T>(acc[i]);
  }
}

}  // namespace

void reduce_bytes(DType dtype, std::byte* out, const std::vector<const std::byte*>& sources, size_t count,
                  ReduceOp op, int world) {
  visit_dtype(dtype, [&]<class T>() { reduce_elements<T>(out, sources, count, op, world); });
}

Staged::Staged(const Tensor& tensor, bool read) : tensor_(tensor) {
  if (tensor.is_contiguous()) {
    buffer_ = tensor;
  } else {
    buffer_ = Tensor::empty(tensor.sizes(), tensor.dtype());
    if (read) copy_cpu(buffer_, tensor);
  }
}

void Staged::finish() const {
  if (!buffer_.is_same(tensor_)) copy_cpu(tensor_, buffer_);
}

namespace {

// Calls fn(piece, n) for the pieces of `spans` covering bytes [offset, offset + bytes).
template <class Fn>
void for_each_piece(const Spans& spans, size_t offset, size_t bytes, Fn&& fn) {
  for (const Span& span : spans) {
    if (bytes == 0) return;
    if (offset >= span.bytes) {
      offset -= span.bytes;
      continue;
    }
    size_t n = std::min(bytes, span.bytes - offset);
    fn(span.data + offset, n);
    bytes -= n;
    offset = 0;
  }
}

}  // namespace

void copy_from_spans(const Spans& spans, size_t offset, size_t bytes, std::byte* destination) {
  for_each_piece(spans, offset, bytes, [&](const std::byte* piece, size_t n) {
    std::memcpy(destination, piece, n);
    destination += n;
  });
}

void copy_to_spans(const std::byte* source, const Spans& spans, size_t offset, size_t bytes) {
  for_each_piece(spans, offset, bytes, [&](std::byte* piece, size_t n) {
    std::memcpy(piece, source, n);
    source += n;
  });
}

size_t total_bytes(const Spans& spans) {
  size_t total = 0;
  for (const Span& span : spans) total += span.bytes;
  return total;
}

}  // namespace loom::dist::shm
