#include <loom/core/tensor.h>

#include <cstring>
#include <memory>
#include <numeric>
#include <sstream>

#include <loom/core/autograd.h>
#include <loom/core/cuda/runtime.h>
#include <loom/core/cuda/tensor_kernels.h>
#include <loom/core/parallel.h>

namespace loom {

std::string shape_str(const Shape& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  return strides;
}

namespace {

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  int64_t wrapped = dim < 0 ? dim + ndim : dim;
  LOOM_CHECK(wrapped >= 0 && wrapped < ndim, op, ": dimension ", dim, " is out of range for a ", ndim,
             "-d tensor");
  return wrapped;
}

Shape infer_shape(Shape sizes, int64_t numel, const char* op) {
  int64_t known = 1;
  int infer_at = -1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == -1) {
      LOOM_CHECK(infer_at < 0, op, ": only one dimension can be -1 in ", shape_str(sizes));
      infer_at = static_cast<int>(i);
    } else {
      LOOM_CHECK(sizes[i] >= 0, op, ": negative size in ", shape_str(sizes));
      known *= sizes[i];
    }
  }
  if (infer_at >= 0) {
    LOOM_CHECK(known != 0 && numel % known == 0, op, ": shape ", shape_str(sizes), " is invalid for ", numel,
               " elements");
    sizes[infer_at] = numel / known;
  }
  LOOM_CHECK(shape_numel(sizes) == numel, op, ": shape ", shape_str(sizes), " is invalid for ", numel, " elements");
  return sizes;
}

}  // namespace

// ---- construction and geometry ----

Tensor Tensor::empty(const Shape& sizes, DType dtype, Device device) {
  for (int64_t s : sizes) LOOM_CHECK(s >= 0, "negative size in shape ", shape_str(sizes));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(static_cast<size_t>(shape_numel(sizes)) * element_size(dtype), device);
  impl->sizes = sizes;
  impl->strides = contiguous_strides(sizes);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::empty_pinned(const Shape& sizes, DType dtype) {
  for (int64_t s : sizes) LOOM_CHECK(s >= 0, "negative size in shape ", shape_str(sizes));
  const size_t nbytes = static_cast<size_t>(shape_numel(sizes)) * element_size(dtype);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(cuda::allocate_pinned(nbytes), nbytes, Device::cpu(),
                                            [](void* p) { cuda::free_pinned(p); });
  impl->sizes = sizes;
  impl->strides = contiguous_strides(sizes);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& sizes, DType dtype, Device device) { return full(sizes, 0.0, dtype, device); }
Tensor Tensor::ones(const Shape& sizes, DType dtype, Device device) { return full(sizes, 1.0, dtype, device); }

Tensor Tensor::full(const Shape& sizes, double value, DType dtype, Device device) {
  Tensor t = empty(sizes, dtype, device);
  t.fill_(value);
  return t;
}

Tensor Tensor::from_vector_as(const std::vector<double>& values, const Shape& sizes, DType dtype) {
  return from_vector(values, sizes).to(dtype);
}

Tensor Tensor::scalar(double value, DType dtype) { return full({}, value, dtype); }

Tensor make_view(const Tensor& base, Shape sizes, Shape strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->sizes = std::move(sizes);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

void Tensor::check_defined(const char* what) const {
  LOOM_CHECK(impl_ != nullptr, what, " on an undefined tensor");
}

void Tensor::check_dtype(DType expected, const char* what) const {
  check_defined(what);
  LOOM_CHECK(impl_->dtype == expected, what, ": tensor is ", dtype_name(impl_->dtype), ", expected ",
             dtype_name(expected));
}

const Shape& Tensor::sizes() const {
  check_defined("sizes()");
  return impl_->sizes;
}
const Shape& Tensor::strides() const {
  check_defined("strides()");
  return impl_->strides;
}
int64_t Tensor::size(int64_t d) const { return sizes()[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::dim() const { return static_cast<int64_t>(sizes().size()); }
int64_t Tensor::numel() const { return shape_numel(sizes()); }
int64_t Tensor::offset() const { return impl_->offset; }
DType Tensor::dtype() const {
  check_defined("dtype()");
  return impl_->dtype;
}
Device Tensor::device() const {
  check_defined("device()");
  return impl_->storage->device();
}
const std::shared_ptr<Storage>& Tensor::storage() const {
  check_defined("storage()");
  return impl_->storage;
}
void* Tensor::raw_data() const {
  check_defined("data()");
  return static_cast<char*>(impl_->storage->data()) + impl_->offset * static_cast<int64_t>(element_size(impl_->dtype));
}

bool Tensor::is_contiguous() const {
  const Shape& s = sizes();
  const Shape& st = strides();
  int64_t expected = 1;
  for (size_t i = s.size(); i-- > 0;) {
    if (s[i] == 1) continue;
    if (st[i] != expected) return false;
    expected *= s[i];
  }
  return true;
}

std::string Tensor::str() const {
  if (!defined()) return "undefined tensor";
  return ::loom::str(dtype_name(dtype()), shape_str(sizes()), " ", device().str());
}

// ---- copies and conversions (recorded by autograd) ----

namespace {
// Copies `src` into a new contiguous tensor of `dtype` on `device`.
Tensor copy_to_new(const Tensor& src, DType dtype, Device device) {
  Tensor out = Tensor::empty(src.sizes(), dtype, device);
  out.copy_(src);
  return out;
}
}  // namespace

Tensor Tensor::clone() const {
  Tensor out = copy_to_new(*this, dtype(), device());
  record("clone", {*this}, {&out}, [](const TensorList& g, const Node&) { return TensorList{g[0]}; });
  return out;
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::to(DType target) const {
  if (target == dtype()) return *this;
  Tensor out = copy_to_new(*this, target, device());
  DType source = dtype();
  if (is_floating(source) && is_floating(target)) {
    // Backward converts into the source's gradient destination when offered
    // (autocast's casts of fp32 parameters).
    record("to_dtype", {*this}, {&out}, [source](const TensorList& g, const Node& node) {
      return TensorList{gradient_to_destination(node, 0, g[0], source)};
    });
  }
  return out;
}

Tensor Tensor::to(Device target) const {
  if (target == device()) return *this;
  Tensor out = copy_to_new(*this, dtype(), target);
  Device source = device();
  record("to_device", {*this}, {&out}, [source](const TensorList& g, const Node&) {
    return TensorList{g[0].to(source)};
  });
  return out;
}

Tensor Tensor::detach() const {
  check_defined("detach()");
  return make_view(*this, sizes(), strides(), offset());
}

// ---- views ----

namespace {
// Records a view's backward: the gradient is reshaped back (contiguous views)
// or scattered into zeros of the base's shape through the same view.
void record_view(const char* name, const Tensor& base, Tensor& view) {
  if (!any_requires_grad({base})) return;
  Shape base_sizes = base.sizes();
  Shape view_sizes = view.sizes();
  Shape view_strides = view.strides();
  int64_t relative_offset = view.offset() - base.offset();
  Shape base_strides = base.strides();
  bool base_contiguous = base.is_contiguous();
  record(name, {base}, {&view},
         [=](const TensorList& g, const Node&) {
           // Scatter: a zero tensor laid out like a contiguous base, written through the view geometry
           // re-expressed on contiguous strides.
           Tensor grad_base = Tensor::zeros(base_sizes, g[0].dtype(), g[0].device());
           if (base_contiguous) {
             Tensor target = make_view(grad_base, view_sizes, view_strides, relative_offset);
             target.copy_(g[0]);
             return TensorList{grad_base};
           }
           // A view of a non-contiguous base: map through a contiguous copy of the geometry.
           // Only permutations/slices of strided bases reach here; express them on a buffer
           // with the base's own strides.
           int64_t span = 1;
           for (size_t i = 0; i < base_sizes.size(); ++i) span += (base_sizes[i] - 1) * base_strides[i];
           Tensor buffer = Tensor::zeros({span}, g[0].dtype(), g[0].device());
           make_view(buffer, view_sizes, view_strides, relative_offset).copy_(g[0]);
           grad_base.copy_(make_view(buffer, base_sizes, base_strides, 0));
           return TensorList{grad_base};
         });
}
}  // namespace

Tensor Tensor::view(Shape new_sizes) const {
  new_sizes = infer_shape(std::move(new_sizes), numel(), "view");
  LOOM_CHECK(is_contiguous(), "view: tensor ", str(), " is not contiguous; use reshape()");
  Tensor out = make_view(*this, new_sizes, contiguous_strides(new_sizes), offset());
  Shape old_sizes = sizes();
  record("view", {*this}, {&out}, [old_sizes](const TensorList& g, const Node&) {
    return TensorList{g[0].reshape(old_sizes)};
  });
  return out;
}

Tensor Tensor::reshape(Shape new_sizes) const {
  if (is_contiguous()) return view(std::move(new_sizes));
  return contiguous().view(std::move(new_sizes));
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  start_dim = wrap_dim(start_dim, dim(), "flatten");
  end_dim = wrap_dim(end_dim, dim(), "flatten");
  LOOM_CHECK(start_dim <= end_dim, "flatten: start_dim ", start_dim, " is after end_dim ", end_dim);
  Shape out;
  for (int64_t d = 0; d < start_dim; ++d) out.push_back(size(d));
  int64_t merged = 1;
  for (int64_t d = start_dim; d <= end_dim; ++d) merged *= size(d);
  out.push_back(merged);
  for (int64_t d = end_dim + 1; d < dim(); ++d) out.push_back(size(d));
  return reshape(out);
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = wrap_dim(d, dim() + 1, "unsqueeze");
  Shape s = sizes();
  s.insert(s.begin() + d, 1);
  return reshape(s);
}

Tensor Tensor::permute(const std::vector<int64_t>& order) const {
  LOOM_CHECK(static_cast<int64_t>(order.size()) == dim(), "permute: ", order.size(), " dimensions given for a ",
             dim(), "-d tensor");
  Shape s(order.size()), st(order.size());
  std::vector<bool> seen(order.size(), false);
  std::vector<int64_t> inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    int64_t d = wrap_dim(order[i], dim(), "permute");
    LOOM_CHECK(!seen[d], "permute: dimension ", d, " repeated");
    seen[d] = true;
    s[i] = size(d);
    st[i] = strides()[d];
    inverse[d] = static_cast<int64_t>(i);
  }
  Tensor out = make_view(*this, s, st, offset());
  record("permute", {*this}, {&out}, [inverse](const TensorList& g, const Node&) {
    return TensorList{g[0].permute(inverse)};
  });
  return out;
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  std::vector<int64_t> order(dim());
  std::iota(order.begin(), order.end(), 0);
  std::swap(order[wrap_dim(dim0, dim(), "transpose")], order[wrap_dim(dim1, dim(), "transpose")]);
  return permute(order);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  d = wrap_dim(d, dim(), "slice");
  LOOM_CHECK(step > 0, "slice: step must be positive, got ", step);
  const int64_t n = size(d);
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape s = sizes();
  Shape st = strides();
  s[d] = (end - start + step - 1) / step;
  st[d] *= step;
  Tensor out = make_view(*this, s, st, offset() + start * strides()[d]);
  record_view("slice", *this, out);
  return out;
}

double Tensor::item() const {
  LOOM_CHECK(numel() == 1, "item(): tensor ", str(), " has ", numel(), " elements, expected 1");
  return to_vector<double>()[0];
}

// ---- autograd ----

bool Tensor::requires_grad() const { return impl_ && impl_->requires_grad; }

Tensor& Tensor::set_requires_grad(bool enable) {
  check_defined("set_requires_grad");
  LOOM_CHECK(is_leaf() || enable, "set_requires_grad(false) on a non-leaf tensor; use detach()");
  if (enable) LOOM_CHECK(is_floating(dtype()), "only floating-point tensors can require grad, got ", dtype_name(dtype()));
  impl_->requires_grad = enable;
  return *this;
}

bool Tensor::is_leaf() const { return impl_ && impl_->grad_fn == nullptr; }

const Tensor& Tensor::grad() const {
  check_defined("grad()");
  return impl_->grad;
}
Tensor& Tensor::mutable_grad() {
  check_defined("grad()");
  return impl_->grad;
}
void Tensor::set_grad(const Tensor& g) {
  check_defined("set_grad");
  if (g.defined()) {
    LOOM_CHECK(g.sizes() == sizes(), "set_grad: gradient ", g.str(), " for tensor ", str());
  }
  impl_->grad = g;
}

const std::shared_ptr<Node>& Tensor::grad_fn() const {
  check_defined("grad_fn()");
  return impl_->grad_fn;
}
uint32_t Tensor::output_nr() const { return impl_->output_nr; }

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  check_defined("backward()");
  Tensor seed = gradient;
  if (!seed.defined()) {
    LOOM_CHECK(numel() == 1, "backward() without a gradient needs a one-element tensor, got ", str());
    seed = Tensor::ones(sizes(), dtype(), device());
  }
  run_backward({*this}, {seed}, retain_graph);
}

void Tensor::set_data(const Tensor& source) {
  check_defined("set_data");
  LOOM_CHECK(source.defined(), "set_data: the source of ", str(), " is undefined");
  LOOM_CHECK(impl_->grad_fn == nullptr, "set_data: ", str(), " is not a leaf (it was computed by ",
             impl_->grad_fn->name(), ")");
  const TensorImpl& from = *source.impl_;
  impl_->storage = from.storage;
  impl_->sizes = from.sizes;
  impl_->strides = from.strides;
  impl_->offset = from.offset;
  impl_->dtype = from.dtype;
  auto fits = [this](const Tensor& t) {
    return t.defined() && t.sizes() == sizes() && t.dtype() == dtype() && t.device() == device();
  };
  if (!fits(impl_->grad)) impl_->grad = Tensor();
}

void Tensor::register_post_accumulate_grad_hook(PostAccumulateGradHook hook) {
  LOOM_CHECK(is_leaf() && requires_grad(), "post-accumulate-grad hooks are for leaves that require grad");
  impl_->post_accumulate_grad_hooks.push_back(std::move(hook));
}

}  // namespace loom
