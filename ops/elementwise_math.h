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

// The ops the binary and the unary kernels of both backends switch on.
enum class Binary { add, sub, mul };
enum class Unary { relu, gelu, silu, hardswish, hardsigmoid, relu6, sigmoid };

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

// PyTorch's gelu (approximate='none'): gelu(x) = x * Phi(x), Phi the standard
// normal CDF = (1 + erf(x / sqrt 2)) / 2;  dx = dy * (Phi(x) + x * phi(x)),
// phi(x) = exp(-x^2 / 2) / sqrt(2 pi) (from the input).
struct Gelu {
  static constexpr UnarySaved saved = UnarySaved::input;
  template <class A>
  LOOM_HOST_DEVICE static A cdf(A x) {
    constexpr A inverse_sqrt2 = A(0.70710678118654752440);
    if constexpr (std::is_same_v<A, float>) {
      return A(0.5) * (A(1) + erff(x * inverse_sqrt2));
    } else {
      return A(0.5) * (A(1) + erf(x * inverse_sqrt2));
    }
  }
  template <class A>
  LOOM_HOST_DEVICE static A forward(A x) {
    return x * cdf(x);
  }
  template <class A>
  LOOM_HOST_DEVICE static A backward(A dy, A x) {
    constexpr A inverse_sqrt_2pi = A(0.39894228040143267794);
    A density;
    if constexpr (std::is_same_v<A, float>) {
      density = inverse_sqrt_2pi * expf(A(-0.5) * x * x);
    } else {
      density = inverse_sqrt_2pi * exp(A(-0.5) * x * x);
    }
    return dy * (cdf(x) + x * density);
  }
};

// exp in the precision of A (expf for float: the device has no double-rate
// exp worth paying for in f32).
template <class A>
LOOM_HOST_DEVICE A exp_of(A x) {
  if constexpr (std::is_same_v<A, float>) {
    return expf(x);
  } else {
    return exp(x);
  }
}

// PyTorch's silu (swish): y = x * s, s = 1 / (1 + exp(-x));
// dx = dy * s * (1 + x * (1 - s)) (from the input).
struct Silu {
  static constexpr UnarySaved saved = UnarySaved::input;
  template <class A>
  LOOM_HOST_DEVICE static A sigmoid(A x) {
    return A(1) / (A(1) + exp_of(-x));
  }
  template <class A>
  LOOM_HOST_DEVICE static A forward(A x) {
    return x * sigmoid(x);
  }
  template <class A>
  LOOM_HOST_DEVICE static A backward(A dy, A x) {
    const A s = sigmoid(x);
    return dy * s * (A(1) + x * (A(1) - s));
  }
};

// sigmoid(x) = 1 / (1 + exp(-x)); dx = dy * y * (1 - y) (from the output).
struct Sigmoid {
  static constexpr UnarySaved saved = UnarySaved::output;
  template <class A>
  LOOM_HOST_DEVICE static A forward(A x) {
    return Silu::sigmoid(x);
  }
  template <class A>
  LOOM_HOST_DEVICE static A backward(A dy, A y) {
    return dy * y * (A(1) - y);
  }
};

// PyTorch's hardswish: y = x * min(max(x + 3, 0), 6) / 6; dx = 0 for x < -3,
// dy * (x / 3 + 1/2) for -3 <= x <= 3, dy above (PyTorch's backward rule at
// the kinks; from the input).
struct Hardswish {
  static constexpr UnarySaved saved = UnarySaved::input;
  template <class A>
  LOOM_HOST_DEVICE static A forward(A x) {
    if (x <= A(-3)) return A(0);
    if (x >= A(3)) return x;
    return x * (x + A(3)) / A(6);
  }
  template <class A>
  LOOM_HOST_DEVICE static A backward(A dy, A x) {
    if (x < A(-3)) return A(0);
    if (x <= A(3)) return dy * (x / A(3) + A(0.5));
    return dy;
  }
};

// PyTorch's hardsigmoid: y = min(max(x + 3, 0), 6) / 6; dx = dy / 6 for
// -3 < x < 3, else 0 (from the input).
struct Hardsigmoid {
  static constexpr UnarySaved saved = UnarySaved::input;
  template <class A>
  LOOM_HOST_DEVICE static A forward(A x) {
    if (x <= A(-3)) return A(0);
    if (x >= A(3)) return A(1);
    return (x + A(3)) / A(6);
  }
  template <class A>
  LOOM_HOST_DEVICE static A backward(A dy, A x) {
    return x > A(-3) && x < A(3) ? dy / A(6) : A(0);
  }
};

// relu6(x) = min(max(x, 0), 6) (PyTorch's hardtanh(0, 6)); dx = dy where
// 0 < y < 6, else 0 (from the output: 0 < y < 6 exactly when 0 < x < 6).
struct Relu6 {
  static constexpr UnarySaved saved = UnarySaved::output;
  template <class A>
  LOOM_HOST_DEVICE static A forward(A x) {
    return x > A(0) ? (x < A(6) ? x : A(6)) : A(0);
  }
  template <class A>
  LOOM_HOST_DEVICE static A backward(A dy, A y) {
    return y > A(0) && y < A(6) ? dy : A(0);
  }
};

// Calls fn.template operator()<Op>() with Op the functor of `op` (host only).
template <class Fn>
decltype(auto) visit_unary(Unary op, Fn&& fn) {
  switch (op) {
    case Unary::relu: return fn.template operator()<Relu>();
    case Unary::gelu: return fn.template operator()<Gelu>();
    case Unary::silu: return fn.template operator()<Silu>();
    case Unary::hardswish: return fn.template operator()<Hardswish>();
    case Unary::hardsigmoid: return fn.template operator()<Hardsigmoid>();
    case Unary::relu6: return fn.template operator()<Relu6>();
    case Unary::sigmoid: return fn.template operator()<Sigmoid>();
  }
  LOOM_FAIL("unknown unary op ", static_cast<int>(op));
}

inline UnarySaved unary_saved(Unary op) {
  return visit_unary(op, [&]<class Op>() { return Op::saved; });
}

}  // namespace loom::ops
