// A differentiable op of one's own: SiLU (x * sigmoid(x)) with its forward
// and backward written by hand, registered with loom's autograd by
// loom::record, and checked against finite differences by loom::gradcheck.
// (loom has SiLU built in, loom::silu; this one shows how an op is added.)
//   custom_op
#include <cmath>
#include <cstdio>
#include <exception>

#include <loom/loom.h>

// y = x * s with s = sigmoid(x); dy/dx = s + x * s * (1 - s).
// `derivative_is_right` = false drops the second term: a wrong backward that
// gradcheck must reject.
loom::Tensor hand_silu(const loom::Tensor& input, bool derivative_is_right = true) {
  LOOM_CHECK(input.dtype() == loom::DType::f64 && input.device().is_cpu(), "hand_silu: this example takes f64 CPU tensors, got ",
             input.str());
  const loom::Tensor x = input.contiguous().detach();
  loom::Tensor y = loom::Tensor::empty(x.sizes(), x.dtype());
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = x.data<double>()[i];
    y.data<double>()[i] = v / (1 + std::exp(-v));
  }
  // The backward closure keeps what it needs (x) and returns one gradient per input.
  loom::record("hand_silu", {input}, {&y}, [x, derivative_is_right](const loom::TensorList& grads, const loom::Node&) {
    const loom::Tensor g = grads[0].contiguous();
    loom::Tensor dx = loom::Tensor::empty(x.sizes(), x.dtype());
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double v = x.data<double>()[i], s = 1 / (1 + std::exp(-v));
      dx.data<double>()[i] = g.data<double>()[i] * (derivative_is_right ? s + v * s * (1 - s) : s);
    }
    return loom::TensorList{dx};
  });
  return y;
}

int main() try {
  loom::Tensor x = loom::Tensor::empty({4, 5}, loom::DType::f64);
  loom::Generator(7).uniform_(x, -3, 3);
  x.set_requires_grad(true);

  // silu inside a larger expression: gradcheck differentiates all of it.
  auto f = [](const loom::TensorList& in) { return loom::mul(hand_silu(in[0]), in[0]); };
  loom::gradcheck(f, {x});
  std::printf("gradcheck passed: silu's backward agrees with finite differences\n");

  auto wrong = [](const loom::TensorList& in) { return hand_silu(in[0], /*derivative_is_right=*/false); };
  try {
    loom::gradcheck(wrong, {x});
    std::printf("gradcheck missed a wrong backward\n");
    return 1;
  } catch (const loom::Error& e) {
    std::printf("gradcheck rejected the wrong backward, as it should:\n%s\n", e.what());
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "custom_op: %s\n", e.what());
  return 1;
}
