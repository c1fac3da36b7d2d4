// Device kernels behind Tensor::fill_ / copy_ / add_ / mul_ on CUDA tensors
// (tensor_kernels.h). Conversions follow the CPU's: 16-bit floats through
// float with round-to-nearest-even, everything else by static_cast.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include <loom/core/cuda/check.h>
#include <loom/core/cuda/device_elements.cuh>
#include <loom/core/cuda/tensor_kernels.h>
#include <loom/core/error.h>

namespace loom::cuda {
namespace {

constexpr int kMaxDims = 8;
constexpr int kThreads = 256;

// Sizes and two stride sets, after merging dimensions that are contiguous in both.
struct Geometry {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t dst_strides[kMaxDims] = {};
  int64_t src_strides[kMaxDims] = {};
};

Geometry make_geometry(const std::vector<int64_t>& sizes, const std::vector<int64_t>& dst_strides,
                       const std::vector<int64_t>& src_strides) {
  // Drop size-1 dims, then merge dim d into d+1 when both stride sets allow it.
  std::vector<int64_t> s, ds, ss;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 1) continue;
    if (!s.empty() && ds.back() == dst_strides[d] * sizes[d] && ss.back() == src_strides[d] * sizes[d]) {
      s.back() *= sizes[d];
      ds.back() = dst_strides[d];
      ss.back() = src_strides[d];
      continue;
    }
    s.push_back(sizes[d]);
    ds.push_back(dst_strides[d]);
    ss.push_back(src_strides[d]);
  }
  LOOM_CHECK(static_cast<int>(s.size()) <= kMaxDims, "CUDA copy: a tensor of ", s.size(),
             " non-mergeable dimensions; at most ", kMaxDims, " are supported");
  Geometry g;
  g.ndim = static_cast<int>(s.size());
  for (int d = 0; d < g.ndim; ++d) {
    g.sizes[d] = s[d];
    g.dst_strides[d] = ds[d];
    g.src_strides[d] = ss[d];
  }
  return g;
}

// Element offsets of linear (row-major) index `index`.
__device__ __forceinline__ void offsets_of(const Geometry& g, int64_t index, int64_t& dst, int64_t& src) {
  dst = 0;
  src = 0;
#pragma unroll
  for (int d = kMaxDims - 1; d >= 0; --d) {
    if (d < g.ndim) {
      const int64_t i = index % g.sizes[d];
      index /= g.sizes[d];
      dst += i * g.dst_strides[d];
      src += i * g.src_strides[d];
    }
  }
}

// Same dtype: moves `Bits`-sized words.
template <class Bits>
static __global__ void copy_bits_kernel(Bits* dst, const Bits* src, Geometry g, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    int64_t d, s;
    offsets_of(g, i, d, s);
    dst[d] = src[s];
  }
}

// Different dtypes: converts through double (exact for every source value but
// integers beyond 2^53, which no float dtype holds exactly either).
static __global__ void convert_kernel(void* dst, DType dst_dtype, const void* src, DType src_dtype, Geometry g,
                                      int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    int64_t d, s;
    offsets_of(g, i, d, s);
    store_from_double(dst, dst_dtype, d, load_as_double(src, src_dtype, s));
  }
}

template <class Bits>
static __global__ void fill_kernel(Bits* data, Bits value, Geometry g, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    int64_t d, unused;
    offsets_of(g, i, d, unused);
    data[d] = value;
  }
}

template <class T>
__device__ __forceinline__ T add_scaled_value(T x, T y, double alpha) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    return x + static_cast<T>(alpha) * y;
  } else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    return from_acc<T>(to_acc(x) + static_cast<float>(alpha) * to_acc(y));
  } else {
    return static_cast<T>(static_cast<double>(x) + alpha * static_cast<double>(y));
  }
}

template <class T>
static __global__ void add_scaled_kernel(T* x, const T* y, int64_t n, double alpha) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    x[i] = add_scaled_value(x[i], y[i], alpha);
  }
}

static __global__ void scale_kernel(void* x, DType dtype, int64_t n, double factor) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    store_from_double(x, dtype, i, load_as_double(x, dtype, i) * factor);
  }
}

unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 1 << 16));
}

template <class Fn>
void visit_bits(size_t element_bytes, Fn&& fn) {
  switch (element_bytes) {
    case 1: return fn.template operator()<uint8_t>();
    case 2: return fn.template operator()<uint16_t>();
    case 4: return fn.template operator()<uint32_t>();
    case 8: return fn.template operator()<uint64_t>();
  }
  LOOM_FAIL("CUDA kernels: unsupported element size ", element_bytes);
}

}  // namespace

void fill(void* data, DType dtype, const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides, double value,
          StreamView stream) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  if (n == 0) return;
  const Geometry g = make_geometry(sizes, strides, strides);
  // The value's bit pattern in `dtype`, converted on the host as the CPU does.
  uint64_t bits = 0;
  visit_dtype(dtype, [&]<class T>() {
    T converted;
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      converted = T(static_cast<float>(value));
    } else {
      converted = static_cast<T>(value);
    }
    std::memcpy(&bits, &converted, sizeof(T));
  });
  DeviceGuard guard(stream.device());
  visit_bits(element_size(dtype), [&]<class Bits>() {
    fill_kernel<Bits><<<blocks_for(n), kThreads, 0, stream.handle()>>>(static_cast<Bits*>(data),
                                                                        static_cast<Bits>(bits), g, n);
  });
  LOOM_CHECK_LAUNCH();
}

void copy_strided(void* dst, DType dst_dtype, const std::vector<int64_t>& dst_strides, const void* src, DType src_dtype,
                  const std::vector<int64_t>& src_strides, const std::vector<int64_t>& sizes, StreamView stream) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  if (n == 0) return;
  const Geometry g = make_geometry(sizes, dst_strides, src_strides);
  DeviceGuard guard(stream.device());
  if (dst_dtype == src_dtype) {
    const bool both_contiguous = g.ndim == 0 || (g.ndim == 1 && g.dst_strides[0] == 1 && g.src_strides[0] == 1);
    if (both_contiguous) {
      if (dst != src) {
        detail::count_device_copy();
        LOOM_CHECK_CUDA(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * element_size(dst_dtype),
                                        cudaMemcpyDeviceToDevice, stream.handle()));
      }
      return;
    }
    visit_bits(element_size(dst_dtype), [&]<class Bits>() {
      copy_bits_kernel<Bits><<<blocks_for(n), kThreads, 0, stream.handle()>>>(static_cast<Bits*>(dst),
                                                                               static_cast<const Bits*>(src), g, n);
    });
  } else {
    convert_kernel<<<blocks_for(n), kThreads, 0, stream.handle()>>>(dst, dst_dtype, src, src_dtype, g, n);
  }
  LOOM_CHECK_LAUNCH();
}

void add_scaled(void* x, const void* y, DType dtype, int64_t n, double alpha, StreamView stream) {
  if (n == 0) return;
  DeviceGuard guard(stream.device());
  visit_dtype(dtype, [&]<class T>() {
    add_scaled_kernel<T><<<blocks_for(n), kThreads, 0, stream.handle()>>>(static_cast<T*>(x),
                                                                           static_cast<const T*>(y), n, alpha);
  });
  LOOM_CHECK_LAUNCH();
}

void scale(void* x, DType dtype, int64_t n, double factor, StreamView stream) {
  if (n == 0) return;
  DeviceGuard guard(stream.device());
  scale_kernel<<<blocks_for(n), kThreads, 0, stream.handle()>>>(x, dtype, n, factor);
  LOOM_CHECK_LAUNCH();
}

}  // namespace loom::cuda
