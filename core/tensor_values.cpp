// Tensor values: element copies across dtypes, strides and devices (one copy
// geometry for the CPU and CUDA paths), and the in-place updates fill_,
// copy_, add_ and mul_.
#include <loom/core/tensor.h>

#include <cstring>
#include <memory>

#include <loom/core/autograd.h>
#include <loom/core/cuda/runtime.h>
#include <loom/core/cuda/tensor_kernels.h>
#include <loom/core/memory_format.h>
#include <loom/core/parallel.h>

namespace loom {

namespace {

// Calls fn(dst_offset, src_offset) over every element, walking `sizes` in
// row-major order with two stride sets.
template <class Fn>
void for_each_offset(const Shape& sizes, const Shape& dst_strides, const Shape& src_strides, Fn&& fn) {
  const int64_t ndim = static_cast<int64_t>(sizes.size());
  const int64_t numel = shape_numel(sizes);
  if (numel == 0) return;
  if (ndim == 0) {
    fn(0, 0);
    return;
  }
  std::vector<int64_t> index(ndim, 0);
  int64_t dst = 0, src = 0;
  const int64_t inner = sizes[ndim - 1];
  const int64_t dst_inner = dst_strides[ndim - 1], src_inner = src_strides[ndim - 1];
  for (int64_t done = 0; done < numel; done += inner) {
    for (int64_t i = 0; i < inner; ++i) fn(dst + i * dst_inner, src + i * src_inner);
    for (int64_t d = ndim - 2; d >= 0; --d) {
      if (++index[d] < sizes[d]) {
        dst += dst_strides[d];
        src += src_strides[d];
        break;
      }
      dst -= dst_strides[d] * (sizes[d] - 1);
      src -= src_strides[d] * (sizes[d] - 1);
      index[d] = 0;
    }
  }
}

template <class To, class From>
To convert(From value) {
  if constexpr (std::is_same_v<To, Half> || std::is_same_v<To, BFloat16>) {
    return To(static_cast<float>(value));
  } else if constexpr (std::is_same_v<From, Half> || std::is_same_v<From, BFloat16>) {
    return static_cast<To>(static_cast<float>(value));
  } else {
    return static_cast<To>(value);
  }
}

// Element geometry that copy kernels walk: equal shapes keep their strides;
// equal numel with different shapes needs both sides contiguous (1-d walk).
void copy_geometry(const Tensor& dst, const Tensor& src, Shape& sizes, Shape& dst_strides, Shape& src_strides) {
  sizes = dst.sizes();
  dst_strides = dst.strides();
  src_strides = src.strides();
  if (dst.sizes() != src.sizes()) {
    LOOM_CHECK(dst.is_contiguous() && src.is_contiguous(), "copy: shapes ", shape_str(dst.sizes()), " and ",
               shape_str(src.sizes()), " differ and one of them is not contiguous");
    sizes = {dst.numel()};
    dst_strides = src_strides = {1};
  }
}

}  // namespace

void copy_cpu(const Tensor& dst, const Tensor& src) {
  LOOM_CHECK(dst.numel() == src.numel(), "copy: destination has ", dst.numel(), " elements, source ", src.numel());
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    if (dst.raw_data() == src.raw_data()) return;
    // Split over the thread team: one core does not saturate memory.
    char* out = static_cast<char*>(dst.raw_data());
    const char* in = static_cast<const char*>(src.raw_data());
    parallel_for(0, static_cast<int64_t>(dst.nbytes()), int64_t{1} << 20,
                 [&](int64_t begin, int64_t end) { std::memcpy(out + begin, in + begin, end - begin); });
    return;
  }
  Shape sizes, dst_strides, src_strides;
  copy_geometry(dst, src, sizes, dst_strides, src_strides);
  visit_dtype(dst.dtype(), [&]<class D>() {
    visit_dtype(src.dtype(), [&]<class S>() {
      D* out = static_cast<D*>(dst.raw_data());
      const S* in = static_cast<const S*>(src.raw_data());
      if (dst.is_contiguous() && src.is_contiguous()) {
        const int64_t n = dst.numel();
        parallel_for(0, n, 1 << 15, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) out[i] = convert<D>(in[i]);
        });
        return;
      }
      for_each_offset(sizes, dst_strides, src_strides,
                      [&](int64_t d, int64_t s) { out[d] = convert<D>(in[s]); });
    });
  });
}

namespace {
// Host-to-device copies of pageable memory up to this size are staged in pinned memory.
constexpr size_t kPinnedStagingLimit = size_t{64} << 20;

// Copies across devices or within a CUDA device. Work goes to the current
// stream of the CUDA side (the destination's when both are CUDA); copies to
// the CPU wait for it, copies from pinned CPU memory do not.
void copy_cuda(const Tensor& dst, const Tensor& source) {
  NoGradGuard no_grad;
  LOOM_CHECK(dst.numel() == source.numel(), "copy: destination has ", dst.numel(), " elements, source ",
             source.numel());
  if (dst.numel() == 0) return;
  const Device to = dst.device(), from = source.device();
  if (to == from) {  // one CUDA device: a strided, converting kernel
    Shape sizes, dst_strides, src_strides;
    copy_geometry(dst, source, sizes, dst_strides, src_strides);
    cuda::copy_strided(dst.raw_data(), dst.dtype(), dst_strides, source.raw_data(), source.dtype(), src_strides, sizes,
                       cuda::current_stream(to.index));
    return;
  }
  if (!dst.is_contiguous()) {  // land contiguous on the destination, then scatter there
    Tensor staged = Tensor::empty(dst.sizes(), dst.dtype(), to);
    copy_cuda(staged, source);
    Tensor(dst).copy_(staged);
    return;
  }
  // Bytes in the destination's dtype, contiguous, on the source's side.
  const Tensor src = source.to(dst.dtype()).contiguous();
  const size_t nbytes = dst.nbytes();
  if (to.is_cuda() && from.is_cuda()) {
    cuda::copy_between_devices(dst.raw_data(), to.index, src.raw_data(), from.index, nbytes,
                               cuda::current_stream(to.index));
  } else if (to.is_cuda()) {
    const cuda::StreamView stream = cuda::current_stream(to.index);
    if (cuda::is_pinned(src.raw_data()) || nbytes > kPinnedStagingLimit) {
      cuda::copy_bytes_async(dst.raw_data(), true, src.raw_data(), false, nbytes, stream);
      cuda::record_pinned_use(src.raw_data(), stream);  // no-op for pageable memory
    } else {
      // Pageable memory goes through a pinned block, so that the copy neither
      // blocks the host nor waits for the stream; the block is reused once
      // the copy is done.
      std::unique_ptr<void, void (*)(void*)> staging(cuda::allocate_pinned(nbytes),
                                                      [](void* p) { cuda::free_pinned(p); });
      std::memcpy(staging.get(), src.raw_data(), nbytes);
      cuda::copy_bytes_async(dst.raw_data(), true, staging.get(), false, nbytes, stream);
      cuda::record_pinned_use(staging.get(), stream);
    }
  } else {  // after the work queued on the source's current stream; the host waits for it
    cuda::copy_bytes(dst.raw_data(), false, src.raw_data(), true, nbytes, from.index);
  }
}
}  // namespace

// ---- in-place value updates ----

Tensor& Tensor::fill_(double value) {
  check_defined("fill_");
  if (device().is_cuda()) {
    cuda::fill(raw_data(), dtype(), sizes(), strides(), value, cuda::current_stream(device().index));
    return *this;
  }
  visit_dtype(dtype(), [&]<class T>() {
    const T v = convert<T>(value);
    if (is_contiguous()) {
      T* p = data<T>();
      parallel_for(0, numel(), 1 << 15, [&](int64_t b, int64_t e) { std::fill(p + b, p + e, v); });
    } else {
      T* p = data<T>();
      for_each_offset(sizes(), strides(), strides(), [&](int64_t d, int64_t) { p[d] = v; });
    }
  });
  return *this;
}

Tensor& Tensor::copy_(const Tensor& source) {
  check_defined("copy_");
  LOOM_CHECK(source.defined(), "copy_ from an undefined tensor");
  if (device().is_cpu() && source.device().is_cpu()) {
    copy_cpu(*this, source);
    return *this;
  }
  copy_cuda(*this, source);
  return *this;
}

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  check_defined("add_");
  LOOM_CHECK(other.numel() == numel(), "add_: tensors of ", numel(), " and ", other.numel(), " elements");
  Tensor src = other.device() == device() ? other : other.to(device());
  // Two tensors in one dense layout (both contiguous, or both channels-last:
  // a channels-last parameter and its gradient) add element by element in memory.
  const bool same_layout = (is_contiguous() && src.is_contiguous()) || same_dense_layout(*this, src);
  if (!same_layout || src.dtype() != dtype()) {
    Tensor converted = empty_with_format(sizes(), dtype(), device(), memory_format_of(*this));
    converted.copy_(src);
    src = converted;
  }
  if (!is_contiguous() && !same_dense_layout(*this, src)) {
    Tensor sum = contiguous().clone();
    sum.add_(src, alpha);
    copy_(sum);
    return *this;
  }
  if (device().is_cuda()) {
    cuda::add_scaled(raw_data(), src.raw_data(), dtype(), numel(), alpha, cuda::current_stream(device().index));
    return *this;
  }
  visit_dtype(dtype(), [&]<class T>() {
    T* out = data<T>();
    const T* in = src.data<T>();
    parallel_for(0, numel(), 1 << 14, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        if constexpr (std::is_floating_point_v<T>) {
          out[i] += static_cast<T>(alpha) * in[i];
        } else if constexpr (std::is_integral_v<T>) {
          out[i] = static_cast<T>(out[i] + static_cast<double>(alpha) * in[i]);
        } else {
          out[i] = T(static_cast<float>(out[i]) + static_cast<float>(alpha) * static_cast<float>(in[i]));
        }
      }
    });
  });
  return *this;
}

Tensor& Tensor::mul_(double factor) {
  check_defined("mul_");
  LOOM_CHECK(in_a_memory_format(*this), "mul_ needs a contiguous or channels-last tensor");
  if (device().is_cuda()) {
    cuda::scale(raw_data(), dtype(), numel(), factor, cuda::current_stream(device().index));
    return *this;
  }
  visit_dtype(dtype(), [&]<class T>() {
    T* p = data<T>();
    parallel_for(0, numel(), 1 << 14, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) p[i] = convert<T>(static_cast<double>(convert<double>(p[i])) * factor);
    });
  });
  return *this;
}

}  // namespace loom
