// The element-wise unary ops, written once for both backends: each is a
// functor whose forward and backward run on the host (ops/cpu/elementwise.cpp)
// and on the device (ops/cuda/elementwise.cu), in A = float (f32, f16, bf16)
// or double (f64). An op is added here (enum value, functor, visit_unary
// case) and in ops/elementwise.{h,cpp}; the kernels of both backends are generic.
#pragma once

#include <math.h>

#include <type_traits>

#include <loom/core/error.h>
#include <loom/core/host_device.h>

namespace loom::ops {

enum class Unary { relu };

// What backward reads besides the output gradient: the op's input or its output.
enum class UnarySaved { input, output };

// relu(x) = max(x, 0); dx = dy where y > 0, else 0 (from the output).
struct Relu {
  static constexpr UnarySaved saved = UnarySaved::output;
  template <class A>
  LOOM_HOST_DEVICE static A forward(A x) {
    return x > A(0) ? x : A(0);
  }
  template <class A>
  LOOM_HOST_DEVICE static A backward(A dy, A y) {
    return y > A(0) ? dy : A(0);
  }
};

// Calls fn.template operator()<Op>() with Op the functor of `op` (host only).
template <class Fn>
decltype(auto) visit_unary(Unary op, Fn&& fn) {
  switch (op) {
    case Unary::relu: return fn.template operator()<Relu>();
  }
  LOOM_FAIL("unknown unary op ", static_cast<int>(op));
}

inline UnarySaved unary_saved(Unary op) {
  return visit_unary(op, [&]<class Op>() { return Op::saved; });
}

}  // namespace loom::ops
