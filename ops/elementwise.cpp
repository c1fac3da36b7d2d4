#include <loom/core/profiler.h>
#include <loom/ops/elementwise.h>

#include <loom/ops/dispatch.h>

namespace loom {

using ops::Binary;

namespace {
Tensor dispatch_binary(Binary op, const Tensor& a, const Tensor& b) {
  ops::check_same_device_and_dtype("elementwise op", {a, b});
  LOOM_CHECK(a.sizes() == b.sizes(), "elementwise op: shapes ", shape_str(a.sizes()), " and ", shape_str(b.sizes()),
             " differ");
  NoGradGuard no_grad;
  return LOOM_DISPATCH(a, binary, op, a, b);
}

Tensor dispatch_affine(const Tensor& x, double factor, double offset) {
  NoGradGuard no_grad;
  return LOOM_DISPATCH(x, affine, x, factor, offset);
}

Tensor dispatch_broadcast(const Tensor& g, const Shape& sizes, double factor) {
  return LOOM_DISPATCH(g, broadcast_scalar, g, sizes, factor);
}

Tensor dispatch_sum(const Tensor& x) { return LOOM_DISPATCH(x, sum_all, x); }

// An element-wise unary op (ops/elementwise_math.h) and its backward, which
// reads the input or the output as the op says.
Tensor unary(ops::Unary op, const char* name, const Tensor& x) {
  profiler::Scope profile(name, x);
  Tensor out;
  {
    NoGradGuard no_grad;
    out = LOOM_DISPATCH(x, unary_forward, op, x);
  }
  const Tensor saved = ops::unary_saved(op) == ops::UnarySaved::output ? out.detach() : x.detach();
  record(name, {x}, {&out}, [op, saved](const TensorList& g, const Node&) {
    return TensorList{LOOM_DISPATCH(saved, unary_backward, op, g[0], saved)};
  });
  return out;
}
}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  profiler::Scope profile("add", a);
  Tensor out = dispatch_binary(Binary::add, a, b);
  record("add", {a, b}, {&out}, [](const TensorList& g, const Node&) { return TensorList{g[0], g[0]}; });
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = dispatch_binary(Binary::sub, a, b);
  record("sub", {a, b}, {&out}, [](const TensorList& g, const Node& node) {
    return TensorList{g[0], node.needs_input_grad(1) ? dispatch_affine(g[0], -1.0, 0.0) : Tensor()};
  });
  return out;
}

namespace {
// How `small` broadcasts over `big` (see mul): aligned to big's last dims, its
// dims are ones (or left out) before and after one run equal to big's. `big`
// is then viewed as (outer, rows, row_size), rows = small.numel(). An empty
// batch broadcasts too ((0, C, 1, 1) over (0, C, H, W)).
struct Broadcast {
  bool ok = false;
  int64_t row_size = 1;
};

Broadcast broadcast_over(const Shape& small, const Shape& big) {
  if (small.size() > big.size()) return {};
  const size_t lead = big.size() - small.size();
  auto size_of = [&](size_t d) { return d < lead ? int64_t{1} : small[d - lead]; };
  // The run of dims that are not 1: [first, last).
  size_t first = big.size(), last = 0;
  for (size_t d = 0; d < big.size(); ++d) {
    if (size_of(d) != 1) {
      first = std::min(first, d);
      last = d + 1;
    }
  }
  if (first >= last) return {true, shape_numel(big)};  // all ones: one scale for everything
  for (size_t d = 0; d < big.size(); ++d) {
    const bool inside = d >= first && d < last;
    if (inside ? size_of(d) != big[d] : size_of(d) != 1) return {};
  }
  int64_t row_size = 1;
  for (size_t d = last; d < big.size(); ++d) row_size *= big[d];
  return {true, row_size};
}

// x * scale, scale broadcast over x (see mul), with its backward.
Tensor mul_rows(const Tensor& x, const Tensor& scale, int64_t row_size) {
  profiler::Scope profile("mul", x);
  ops::check_same_device_and_dtype("mul", {x, scale});
  Tensor out;
  {
    NoGradGuard no_grad;
    out = LOOM_DISPATCH(x, mul_rows, x, scale, row_size);
  }
  record("mul", {x, scale}, {&out},
         [x = x.detach(), scale = scale.detach(), row_size](const TensorList& g, const Node& node) {
           const Tensor dy = g[0].to(x.dtype());
           return TensorList{
               node.needs_input_grad(0) ? LOOM_DISPATCH(dy, mul_rows, dy, scale, row_size) : Tensor(),
               node.needs_input_grad(1) ? LOOM_DISPATCH(dy, mul_rows_backward_scale, dy, x, scale.sizes(), row_size)
                                        : Tensor()};
         });
  return out;
}
}  // namespace

Tensor mul(const Tensor& a, const Tensor& b) {
  if (a.defined() && b.defined() && a.sizes() != b.sizes()) {
    // The operand of fewer dims (or elements) is tried as the one broadcast first.
    const bool b_first = b.dim() < a.dim() || (b.dim() == a.dim() && b.numel() <= a.numel());
    for (const bool b_small : {b_first, !b_first}) {
      const Tensor& big = b_small ? a : b;
      const Tensor& small = b_small ? b : a;
      const Broadcast broadcast = broadcast_over(small.sizes(), big.sizes());
      if (broadcast.ok) return mul_rows(big, small, broadcast.row_size);
    }
    LOOM_FAIL("mul: shapes ", shape_str(a.sizes()), " and ", shape_str(b.sizes()),
              " neither match nor broadcast (one shape, aligned to the other's last dims, the other's with the dims "
              "before and after one run set to 1)");
  }
  Tensor out = dispatch_binary(Binary::mul, a, b);
  record("mul", {a, b}, {&out}, [a = a.detach(), b = b.detach()](const TensorList& g, const Node& node) {
    return TensorList{node.needs_input_grad(0) ? dispatch_binary(Binary::mul, g[0], b) : Tensor(),
                      node.needs_input_grad(1) ? dispatch_binary(Binary::mul, g[0], a) : Tensor()};
  });
  return out;
}

Tensor scale(const Tensor& x, double factor) {
  Tensor out = dispatch_affine(x, factor, 0.0);
  record("scale", {x}, {&out}, [factor](const TensorList& g, const Node&) { return TensorList{dispatch_affine(g[0], factor, 0.0)}; });
  return out;
}

Tensor add_scalar(const Tensor& x, double value) {
  Tensor out = dispatch_affine(x, 1.0, value);
  record("add_scalar", {x}, {&out}, [](const TensorList& g, const Node&) { return TensorList{g[0]}; });
  return out;
}

Tensor relu(const Tensor& x) { return unary(ops::Unary::relu, "relu", x); }

Tensor gelu(const Tensor& x) { return unary(ops::Unary::gelu, "gelu", x); }

Tensor silu(const Tensor& x) { return unary(ops::Unary::silu, "silu", x); }

Tensor hardswish(const Tensor& x) { return unary(ops::Unary::hardswish, "hardswish", x); }

Tensor hardsigmoid(const Tensor& x) { return unary(ops::Unary::hardsigmoid, "hardsigmoid", x); }

Tensor relu6(const Tensor& x) { return unary(ops::Unary::relu6, "relu6", x); }

Tensor sigmoid(const Tensor& x) { return unary(ops::Unary::sigmoid, "sigmoid", x); }

Tensor sum(const Tensor& x) {
  Tensor out;
  {
    NoGradGuard no_grad;
    out = dispatch_sum(x);
  }
  Shape sizes = x.sizes();
  record("sum", {x}, {&out}, [sizes](const TensorList& g, const Node&) {
    return TensorList{dispatch_broadcast(g[0], sizes, 1.0)};
  });
  return out;
}

Tensor mean(const Tensor& x) {
  LOOM_CHECK(x.numel() > 0, "mean of an empty tensor");
  Tensor out;
  const double inverse = 1.0 / static_cast<double>(x.numel());
  {
    NoGradGuard no_grad;
    out = dispatch_affine(dispatch_sum(x), inverse, 0.0);
  }
  Shape sizes = x.sizes();
  record("mean", {x}, {&out}, [sizes, inverse](const TensorList& g, const Node&) {
    return TensorList{dispatch_broadcast(g[0], sizes, inverse)};
  });
  return out;
}

}  // namespace loom
