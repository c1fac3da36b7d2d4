// The memory format of a 4-d (N, C, H, W) tensor (PyTorch's memory_format):
// NCHW (contiguous) or NHWC (channels-last strides; tensor cores want it).
// The one vocabulary for "how the elements lie in memory" across the data
// loader's batches and the CUDA kernels of conv, batch norm and pooling.
#pragma once

#include <loom/core/autograd.h>
#include <loom/core/tensor.h>

namespace loom {

enum class MemoryFormat { nchw, nhwc };

// True when `t` is 4-d with channels-last strides (size-1 dims may carry any stride).
inline bool is_channels_last(const Tensor& t) {
  if (t.dim() != 4) return false;
  const Shape& s = t.sizes();
  const Shape& st = t.strides();
  const int64_t c = s[1], h = s[2], w = s[3];
  return (c == 1 || st[1] == 1) && (w == 1 || st[3] == c) && (h == 1 || st[2] == w * c) &&
         (s[0] == 1 || st[0] == h * w * c);
}

// The format `t` is in: nhwc for a channels-last tensor that is not also
// contiguous, nchw otherwise (other strides are made contiguous by kernels).
inline MemoryFormat memory_format_of(const Tensor& t) {
  return !t.is_contiguous() && is_channels_last(t) ? MemoryFormat::nhwc : MemoryFormat::nchw;
}

// An uninitialised tensor of `sizes` (4-d for nhwc) in `format`.
inline Tensor empty_with_format(const Shape& sizes, DType dtype, Device device, MemoryFormat format) {
  if (format == MemoryFormat::nchw) return Tensor::empty(sizes, dtype, device);
  const int64_t n = sizes[0], c = sizes[1], h = sizes[2], w = sizes[3];
  Tensor memory = Tensor::empty({n, h, w, c}, dtype, device);
  return make_view(memory, sizes, {h * w * c, 1, w * c, c}, 0);
}

// `t` in `format` (PyTorch's t.contiguous(memory_format)): `t` itself when it
// already is, else a copy.
inline Tensor in_memory_format(const Tensor& t, MemoryFormat format) {
  NoGradGuard no_grad;
  if (format == MemoryFormat::nchw) return t.contiguous();
  if (is_channels_last(t)) return t;
  Tensor out = empty_with_format(t.sizes(), t.dtype(), t.device(), MemoryFormat::nhwc);
  out.copy_(t);
  return out;
}

}  // namespace loom
