// Element access that every CUDA kernel shares (core/cuda/tensor_kernels.cu,
// ops/cuda, optim/cuda): the accumulation type of each element type, 16-bit
// float conversions with the hardware's round-to-nearest-even (the rounding
// loom's host conversions use), values whose dtype is known only at run time,
// and grid-stride loops. Include from .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include <loom/core/dtype.h>

namespace loom::cuda {

// Arithmetic happens in float for f32 / f16 / bf16 and in double for f64.
template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ float to_acc(Half v) { return __half2float(__ushort_as_half(v.bits)); }
__device__ __forceinline__ float to_acc(BFloat16 v) { return __uint_as_float(static_cast<uint32_t>(v.bits) << 16); }

template <class T>
__device__ __forceinline__ T from_acc(acc_t<T> v) {
  if constexpr (std::is_same_v<T, Half>) {
    Half h;
    h.bits = __half_as_ushort(__float2half_rn(v));
    return h;
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    BFloat16 b;
    b.bits = __bfloat16_as_ushort(__float2bfloat16_rn(v));
    return b;
  } else {
    return v;
  }
}

// Element i of an array of dtype `t`, as a double (exact for every value but
// integers beyond 2^53, which no float dtype holds exactly either).
__device__ __forceinline__ double load_as_double(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::f64: return static_cast<const double*>(p)[i];
    case DType::f16: return to_acc(static_cast<const Half*>(p)[i]);
    case DType::bf16: return to_acc(static_cast<const BFloat16*>(p)[i]);
    case DType::i64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DType::i32: return static_cast<const int32_t*>(p)[i];
    case DType::u8: return static_cast<const uint8_t*>(p)[i];
  }
  return 0;
}

// Stores v into element i, converted as the CPU converts (16-bit floats through float).
__device__ __forceinline__ void store_from_double(void* p, DType t, int64_t i, double v) {
  switch (t) {
    case DType::f32: static_cast<float*>(p)[i] = static_cast<float>(v); return;
    case DType::f64: static_cast<double*>(p)[i] = v; return;
    case DType::f16: static_cast<Half*>(p)[i] = from_acc<Half>(static_cast<float>(v)); return;
    case DType::bf16: static_cast<BFloat16*>(p)[i] = from_acc<BFloat16>(static_cast<float>(v)); return;
    case DType::i64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); return;
    case DType::i32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); return;
    case DType::u8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); return;
  }
}

// Grid-stride loops: for (int64_t i = first_index(); i < n; i += grid_stride()).
__device__ __forceinline__ int64_t first_index() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

}  // namespace loom::cuda
