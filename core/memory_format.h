// The memory format of a 4-d (N, C, H, W) tensor (PyTorch's memory_format):
// NCHW (contiguous) or NHWC (channels-last strides; tensor cores want it).
// The one vocabulary for "how the elements lie in memory" across the data
// loader's batches, a model's parameters (nn::Module::to(MemoryFormat)), their
// gradients (AccumulateGrad, DDP's bucket views) and the CUDA kernels of conv,
// batch norm and pooling.
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

// Whether `t` lies in `format`: contiguous for nchw, channels-last for nhwc.
// (A tensor may lie in both: one whose orders agree, e.g. (O, C, 1, 1).)
inline bool is_in_memory_format(const Tensor& t, MemoryFormat format) {
  return format == MemoryFormat::nchw ? t.is_contiguous() : is_channels_last(t);
}

// Whether `t` lies in one of the formats (contiguous or channels-last): a
// loop over numel() elements from raw_data() visits each element once.
inline bool in_a_memory_format(const Tensor& t) { return is_in_memory_format(t, memory_format_of(t)); }

// Whether `a` and `b` have one shape and lie densely in one format, so that
// element i after raw_data() is the same element of both: a loop over the
// raw memory of several such tensors is an elementwise op (optimizers,
// in-place adds), whichever format they share.
inline bool same_dense_layout(const Tensor& a, const Tensor& b) {
  const MemoryFormat format = memory_format_of(a);
  return a.sizes() == b.sizes() && is_in_memory_format(a, format) && is_in_memory_format(b, format);
}

// The strides of a dense tensor of `sizes` (4-d for nhwc) in `format`.
inline Shape strides_for_format(const Shape& sizes, MemoryFormat format) {
  if (format == MemoryFormat::nchw) return contiguous_strides(sizes);
  const int64_t c = sizes[1], h = sizes[2], w = sizes[3];
  return {h * w * c, 1, w * c, c};
}

// An uninitialised tensor of `sizes` (4-d for nhwc) in `format`.
inline Tensor empty_with_format(const Shape& sizes, DType dtype, Device device, MemoryFormat format) {
  if (format == MemoryFormat::nchw) return Tensor::empty(sizes, dtype, device);
  Tensor memory = Tensor::empty({shape_numel(sizes)}, dtype, device);
  return make_view(memory, sizes, strides_for_format(sizes, format), 0);
}

// A new tensor holding `t`'s values in `format` (PyTorch's
// t.clone(memory_format=...)); not recorded by autograd.
inline Tensor copy_in_memory_format(const Tensor& t, MemoryFormat format) {
  NoGradGuard no_grad;
  Tensor out = empty_with_format(t.sizes(), t.dtype(), t.device(), format);
  out.copy_(t);
  return out;
}

// `t` in `format` (PyTorch's t.contiguous(memory_format)): `t` itself when it
// already is, else a copy.
inline Tensor in_memory_format(const Tensor& t, MemoryFormat format) {
  NoGradGuard no_grad;
  if (format == MemoryFormat::nchw) return t.contiguous();
  return is_channels_last(t) ? t : copy_in_memory_format(t, format);
}

}  // namespace loom
