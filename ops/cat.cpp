#include <loom/ops/cat.h>

#include <loom/core/profiler.h>
#include <loom/ops/dispatch.h>

namespace loom {

Tensor cat(const TensorList& tensors, int64_t dim) {
  LOOM_CHECK(!tensors.empty(), "cat: expected at least one tensor");
  for (size_t k = 0; k < tensors.size(); ++k) {
    LOOM_CHECK(tensors[k].defined(), "cat: tensor ", k, " is undefined");
  }
  const Tensor& first = tensors[0];
  profiler::Scope profile("cat", first);
  const int64_t rank = first.dim();
  LOOM_CHECK(rank > 0, "cat: zero-dimensional tensors cannot be concatenated");
  LOOM_CHECK(dim >= -rank && dim < rank, "cat: dim ", dim, " is out of range for tensors of rank ", rank);
  if (dim < 0) dim += rank;
  ops::check_same_device_and_dtype("cat", tensors);
  Shape out_sizes = first.sizes();
  out_sizes[dim] = 0;
  for (size_t k = 0; k < tensors.size(); ++k) {
    const Tensor& t = tensors[k];
    bool matches = t.dim() == rank;
    for (int64_t d = 0; matches && d < rank; ++d) matches = d == dim || t.size(d) == first.size(d);
    LOOM_CHECK(matches, "cat: tensor ", k, " has shape ", shape_str(t.sizes()), " but tensor 0 has ",
               shape_str(first.sizes()), "; they may differ only along dim ", dim);
    out_sizes[dim] += t.size(dim);
  }
  Tensor out = Tensor::empty(out_sizes, first.dtype(), first.device());
  std::vector<int64_t> offsets;
  {
    NoGradGuard no_grad;
    int64_t offset = 0;
    for (const Tensor& t : tensors) {
      offsets.push_back(offset);
      if (t.size(dim) > 0) out.slice(dim, offset, offset + t.size(dim)).copy_(t);
      offset += t.size(dim);
    }
  }
  std::vector<int64_t> lengths;
  for (const Tensor& t : tensors) lengths.push_back(t.size(dim));
  record("cat", tensors, {&out}, [dim, offsets, lengths](const TensorList& g, const Node& node) {
    NoGradGuard no_grad;
    TensorList grads(offsets.size());
    for (size_t k = 0; k < offsets.size(); ++k) {
      if (node.needs_input_grad(k)) grads[k] = g[0].slice(dim, offsets[k], offsets[k] + lengths[k]).contiguous();
    }
    return grads;
  });
  return out;
}

}  // namespace loom
