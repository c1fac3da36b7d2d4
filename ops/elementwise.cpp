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

Tensor mul(const Tensor& a, const Tensor& b) {
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
