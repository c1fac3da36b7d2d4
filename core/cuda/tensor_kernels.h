// The device kernels that core/tensor.cpp needs for CUDA tensors: fill_,
// copy_ (strided, with dtype conversion), add_ and mul_. Geometry is given in
// elements; everything runs asynchronously on `stream`. No CUDA headers.
#pragma once

#include <cstdint>
#include <vector>

#include <loom/core/cuda/stream.h>
#include <loom/core/dtype.h>

namespace loom::cuda {

// Sets every element of the strided array (sizes, strides) at `data` to
// `value` converted to `dtype` as the CPU would convert it.
void fill(void* data, DType dtype, const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides, double value,
          StreamView stream);

// dst[index] = convert(src[index]) for every index of `sizes`; both arrays
// strided, both on stream.device(). Equal dtypes copy bits.
void copy_strided(void* dst, DType dst_dtype, const std::vector<int64_t>& dst_strides, const void* src, DType src_dtype,
                  const std::vector<int64_t>& src_strides, const std::vector<int64_t>& sizes, StreamView stream);

// x[i] += alpha * y[i] for n contiguous elements of `dtype` (the CPU's
// arithmetic: f32 / f16 / bf16 in float, f64 and integers in double).
void add_scaled(void* x, const void* y, DType dtype, int64_t n, double alpha, StreamView stream);

// x[i] = convert(double(x[i]) * factor) for n contiguous elements.
void scale(void* x, DType dtype, int64_t n, double factor, StreamView stream);

}  // namespace loom::cuda
