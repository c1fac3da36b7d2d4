// Move-only owners of cuDNN descriptors (tensor, filter, convolution). Needs
// cudnn.h: include it from .cu files only.
#pragma once

#include <cudnn.h>

#include <utility>

#include <loom/core/cuda/check.h>

namespace loom::cuda {

// Owns one descriptor of type T made by Create and released by Destroy.
template <class T, cudnnStatus_t (*Create)(T*), cudnnStatus_t (*Destroy)(T)>
class CudnnDescriptor {
 public:
  CudnnDescriptor() { LOOM_CHECK_CUDNN(Create(&descriptor_)); }
  ~CudnnDescriptor() {
    if (descriptor_ != nullptr) Destroy(descriptor_);  // never throws
  }
  CudnnDescriptor(CudnnDescriptor&& other) noexcept : descriptor_(std::exchange(other.descriptor_, nullptr)) {}
  CudnnDescriptor& operator=(CudnnDescriptor&& other) noexcept {
    std::swap(descriptor_, other.descriptor_);
    return *this;
  }
  CudnnDescriptor(const CudnnDescriptor&) = delete;
  CudnnDescriptor& operator=(const CudnnDescriptor&) = delete;

  T get() const { return descriptor_; }

 private:
  T descriptor_ = nullptr;
};

using CudnnTensorDescriptor =
    CudnnDescriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using CudnnFilterDescriptor =
    CudnnDescriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using CudnnConvolutionDescriptor = CudnnDescriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
                                                   cudnnDestroyConvolutionDescriptor>;

}  // namespace loom::cuda
