// What every ops/cuda/<op>.cu shares: the element helpers of
// core/cuda/device_elements.cuh, launch sizes, warp and block reductions, the
// dtype switch over the floating types and the checks of the public entry
// points. Memory formats (NCHW / channels-last): core/memory_format.h. CUDA
// and loom headers only.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include <loom/core/autograd.h>
#include <loom/core/cuda/check.h>
#include <loom/core/cuda/device_elements.cuh>
#include <loom/core/cuda/runtime.h>
#include <loom/core/memory_format.h>
#include <loom/core/tensor.h>

namespace loom::ops::cuda_detail {

constexpr int kThreads = 256;

// ---- element types (core/cuda/device_elements.cuh) ----

using ::loom::cuda::acc_t;
using ::loom::cuda::first_index;
using ::loom::cuda::from_acc;
using ::loom::cuda::grid_stride;
using ::loom::cuda::load_as_double;
using ::loom::cuda::store_from_double;
using ::loom::cuda::to_acc;

// ---- launches ----

// Blocks for a grid-stride loop over n items, kThreads each.
inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + threads - 1) / threads, 1, 1 << 16));
}

inline cudaStream_t stream_of(const Tensor& t) { return ::loom::cuda::current_stream(t.device().index).handle(); }

// ---- reductions ----

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

template <class T>
__device__ __forceinline__ T warp_max(T v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const T other = __shfl_xor_sync(0xffffffffu, v, offset);
    v = other > v ? other : v;
  }
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread
// gets the result. `scratch` holds 32 values. The order of additions is fixed,
// so results are deterministic.
template <class T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : T(0);
  return warp_sum(v);
}

// Sum of values[0, count) by one block, added in a fixed order (so
// deterministic); every thread gets the result.
__device__ __forceinline__ double block_sum_of(const double* values, int64_t count) {
  __shared__ double scratch[32];
  double total = 0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) total += values[i];
  return block_sum(total, scratch);
}

// ---- host side ----

// Calls fn.template operator()<T>() with T the loom type of a floating dtype.
template <class Fn>
decltype(auto) visit_float(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::f32: return fn.template operator()<float>();
    case DType::f64: return fn.template operator()<double>();
    case DType::f16: return fn.template operator()<Half>();
    case DType::bf16: return fn.template operator()<BFloat16>();
    default: LOOM_FAIL(op, ": CUDA kernels take f32, f64, f16 or bf16 tensors, got ", dtype_name(t));
  }
}

// The tensor as the kernels read it: contiguous (a copy when it is not).
inline Tensor contiguous_input(const Tensor& t) {
  NoGradGuard no_grad;
  return t.contiguous();
}

// True when the elements fill their storage range without gaps or overlap in
// some order of the dims (contiguous, channels-last, any permutation): an
// elementwise kernel can then walk the numel() elements from raw_data() in
// memory order and write an output with the same strides.
inline bool is_dense(const Tensor& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of dims longer than 1
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) != 1) dims.emplace_back(t.strides()[d], t.size(d));
  }
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expected) return false;
    expected *= size;
  }
  return true;
}

// An uninitialised tensor with the sizes and strides of the dense tensor `like`.
inline Tensor empty_like_dense(const Tensor& like, DType dtype) {
  Tensor memory = Tensor::empty({like.numel()}, dtype, like.device());
  return make_view(memory, like.sizes(), like.strides(), 0);
}

// Checks that an entry point's tensor lives on CUDA.
inline void check_cuda(const char* op, const Tensor& t) {
  LOOM_CHECK(t.defined() && t.device().is_cuda(), op, ": expected a CUDA tensor, got ",
             t.defined() ? t.str() : "an undefined tensor");
}

// What every entry point opens with: checks that `t` lives on CUDA and makes
// its device the current one until the guard dies. Kernel launches, cuBLAS and
// cuDNN run on the current device, so without it a rank training on cuda:1
// from a thread whose current device is 0 would launch on the wrong GPU.
//   const auto device_guard = on_device_of("relu", x);
[[nodiscard]] inline ::loom::cuda::DeviceGuard on_device_of(const char* op, const Tensor& t) {
  check_cuda(op, t);
  return ::loom::cuda::DeviceGuard(t.device().index);
}

}  // namespace loom::ops::cuda_detail
