// Tensor: a cheap handle to a shared TensorImpl (storage, sizes, strides,
// offset, dtype, device, autograd state). Views share storage.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <loom/core/device.h>
#include <loom/core/dtype.h>
#include <loom/core/storage.h>

namespace loom {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& shape);
int64_t shape_numel(const Shape& shape);
Shape contiguous_strides(const Shape& shape);

class Node;
class Tensor;
struct TensorImpl;

// Runs after a leaf's .grad has been accumulated during backward: where DDP
// learns that a parameter's gradient is ready.
using PostAccumulateGradHook = std::function<void(Tensor& parameter)>;

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // Factories. Memory from empty() is uninitialised.
  static Tensor empty(const Shape& sizes, DType dtype = DType::f32, Device device = Device::cpu());
  // A CPU tensor in page-locked memory (cuda::allocate_pinned): copies from it
  // to a CUDA device do not block the host. Throws without CUDA.
  static Tensor empty_pinned(const Shape& sizes, DType dtype = DType::f32);
  static Tensor zeros(const Shape& sizes, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor ones(const Shape& sizes, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor full(const Shape& sizes, double value, DType dtype = DType::f32, Device device = Device::cpu());
  // A CPU tensor holding `values` (row-major), converted to `dtype`.
  template <class T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& sizes);
  static Tensor from_vector_as(const std::vector<double>& values, const Shape& sizes, DType dtype);
  static Tensor scalar(double value, DType dtype = DType::f32);

  bool defined() const { return impl_ != nullptr; }
  const Shape& sizes() const;
  const Shape& strides() const;
  int64_t size(int64_t dim) const;
  int64_t dim() const;
  int64_t numel() const;
  int64_t offset() const;
  DType dtype() const;
  Device device() const;
  bool is_contiguous() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(dtype()); }
  const std::shared_ptr<Storage>& storage() const;

  // Pointer to the first element; T must match the dtype.
  template <class T>
  T* data() const {
    check_dtype(dtype_of<T>(), "data<T>()");
    return static_cast<T*>(raw_data());
  }
  void* raw_data() const;

  // Conversions and copies; all are recorded by autograd.
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;
  Tensor detach() const;

  // Views (share storage; recorded by autograd). A -1 in a shape is inferred.
  Tensor view(Shape sizes) const;     // requires a contiguous tensor
  Tensor reshape(Shape sizes) const;  // a view when possible, else a copy
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor permute(const std::vector<int64_t>& order) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor unsqueeze(int64_t dim) const;

  // In-place updates of the values; not recorded by autograd (optimizers,
  // initialisation, gradient buffers).
  Tensor& fill_(double value);
  Tensor& zero_() { return fill_(0.0); }
  Tensor& copy_(const Tensor& source);  // same numel; converts dtype, crosses devices
  Tensor& add_(const Tensor& other, double alpha = 1.0);
  Tensor& mul_(double factor);

  // Host access (synchronises with CUDA).
  double item() const;
  template <class T>
  std::vector<T> to_vector() const;

  // Autograd.
  bool requires_grad() const;
  Tensor& set_requires_grad(bool requires_grad);
  bool is_leaf() const;
  const Tensor& grad() const;
  Tensor& mutable_grad();
  void set_grad(const Tensor& grad);
  const std::shared_ptr<Node>& grad_fn() const;
  uint32_t output_nr() const;
  // Backpropagates from this tensor; without `gradient` it must hold one element.
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;
  void register_post_accumulate_grad_hook(PostAccumulateGradHook hook);
  // Gives this tensor -- every handle to it -- `source`'s data: its storage,
  // geometry, dtype and device (PyTorch's `t.data = source`), so an optimizer
  // or module holding this tensor sees the new data. Autograd identity stays
  // (requires_grad, hooks); a gradient that no longer fits the new shape,
  // dtype or device is dropped. For leaves only.
  void set_data(const Tensor& source);

  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  std::string str() const;  // "f32[2, 3] cpu"

 private:
  void check_defined(const char* what) const;
  void check_dtype(DType expected, const char* what) const;
  std::shared_ptr<TensorImpl> impl_;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape sizes;
  Shape strides;
  int64_t offset = 0;  // in elements
  DType dtype = DType::f32;

  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;
  uint32_t output_nr = 0;
  std::weak_ptr<Node> grad_accumulator;
  std::vector<PostAccumulateGradHook> post_accumulate_grad_hooks;
};

// A view of `base`'s storage with new geometry; no autograd.
Tensor make_view(const Tensor& base, Shape sizes, Shape strides, int64_t offset);

// Copies src into dst elementwise (any strides, any dtypes, same shape or at
// least same numel); CPU only.
void copy_cpu(const Tensor& dst, const Tensor& src);

template <class T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& sizes) {
  LOOM_CHECK(static_cast<int64_t>(values.size()) == shape_numel(sizes), "from_vector: ", values.size(),
             " values do not fill shape ", shape_str(sizes));
  Tensor t = empty(sizes, dtype_of<T>());
  std::copy(values.begin(), values.end(), t.data<T>());
  return t;
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  Tensor host = to(Device::cpu()).to(dtype_of<T>()).contiguous();
  const T* p = host.data<T>();
  return std::vector<T>(p, p + host.numel());
}

}  // namespace loom
