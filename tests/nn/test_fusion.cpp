// Fusion decided by what modules declare (Module::fuses, computes_relu,
// computes_max_pool_2x2), not by their types: a user's subclass of
// BatchNorm2d that changes forward runs its own code in a Sequential and in a
// ResNet block; one that changes nothing keeps the fused op; a ReLU subclass
// that computes something else is not folded into the batch norm.
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include <loom/nn/layers.h>
#include <loom/nn/resnet.h>
#include <loom/ops/elementwise.h>
#include "tests/support/gradcheck.h"

using namespace loom;

namespace {

// Batch norm whose output is shifted by -1 before whatever follows: its
// forward() is not BatchNorm2d's, so it declares no fused tail.
class ShiftedBatchNorm : public nn::BatchNorm2d {
 public:
  using nn::BatchNorm2d::BatchNorm2d;
  Tensor forward(const Tensor& input) override { return add_scalar(nn::BatchNorm2d::forward(input), -1.0); }
  bool fuses(nn::FusedTail) const override { return false; }
  std::string type_name() const override { return "ShiftedBatchNorm"; }
};

// A batch norm of the user's that only adds a method: it keeps BatchNorm2d's
// forward and so its declared fusions.
class NamedBatchNorm : public nn::BatchNorm2d {
 public:
  using nn::BatchNorm2d::BatchNorm2d;
  std::string label() const { return "named"; }
};

// leaky_relu(x, 0.5) = max(x, 0.5 x): not relu, so it declares nothing.
class HalfLeakyReLU : public nn::ReLU {
 public:
  Tensor forward(const Tensor& input) override { return add(relu(input), scale(relu(scale(input, -1.0)), -0.5)); }
  bool computes_relu() const override { return false; }
};

Tensor input() { return loom::testing::random_tensor({2, 3, 4, 4}, 21, -2, 2, DType::f32); }

}  // namespace

TEST_CASE("a Sequential runs the fused op only for what its modules declare") {
  const Tensor x = input();
  // Reference: the user's own forward, then ReLU, computed by hand.
  auto shifted = std::make_shared<ShiftedBatchNorm>(3);
  nn::BatchNorm2d plain(3);
  const Tensor expected = relu(add_scalar(plain.forward(x), -1.0));
  nn::Sequential user{shifted, std::make_shared<nn::ReLU>()};
  const Tensor y = user.forward(x);
  CHECK(loom::testing::max_abs_diff(y, expected) == 0);
  // The shift makes a difference: the fused BatchNorm2d + ReLU would give relu(bn(x)).
  nn::BatchNorm2d fresh(3);
  CHECK(loom::testing::max_abs_diff(y, relu(fresh.forward(x))) > 0.5);

  // A subclass that keeps forward keeps the fused op (its autograd node is batch norm's, not relu's).
  nn::Sequential named{std::make_shared<NamedBatchNorm>(3), std::make_shared<nn::ReLU>()};
  Tensor x_grad = x.clone().set_requires_grad(true);
  const Tensor fused = named.forward(x_grad);
  REQUIRE(fused.grad_fn() != nullptr);
  CHECK(fused.grad_fn()->name() != "relu");
  nn::BatchNorm2d reference(3);
  CHECK(loom::testing::max_abs_diff(fused, relu(reference.forward(x))) == 0);

  // A ReLU subclass that computes something else is run as itself.
  nn::BatchNorm2d bn(3);
  const Tensor normalized = bn.forward(x);
  nn::Sequential leaky{std::make_shared<nn::BatchNorm2d>(3), std::make_shared<HalfLeakyReLU>()};
  const Tensor z = leaky.forward(x);
  CHECK(loom::testing::max_abs_diff(z, HalfLeakyReLU().forward(normalized)) < 1e-6);
  const std::vector<float> values = z.contiguous().to_vector<float>();
  CHECK(*std::min_element(values.begin(), values.end()) < -0.1f);  // negative outputs: not relu
}

TEST_CASE("a ResNet block whose batch norm is the user's runs the user's forward") {
  // BasicBlock(8, 8): conv1 bn1 relu conv2 bn2 (+ identity) relu. Replacing
  // bn2 by the shifted batch norm (same tensors) must shift the pre-ReLU sum.
  manual_seed(3);
  auto block = std::make_shared<nn::BasicBlock>(8, 8, 1, nullptr);
  manual_seed(3);
  auto reference = std::make_shared<nn::BasicBlock>(8, 8, 1, nullptr);
  auto shifted = std::make_shared<ShiftedBatchNorm>(8);
  block->replace_module("bn2", shifted);
  const Tensor x = loom::testing::random_tensor({2, 8, 5, 5}, 22, -1, 1, DType::f32);
  const Tensor y = block->forward(x);
  // By hand with the reference block's modules: relu(bn2(conv2(relu(bn1(conv1(x))))) - 1 + x).
  const Tensor h = relu(reference->bn1->forward(reference->conv1->forward(x)));
  const Tensor expected = relu(add(add_scalar(reference->bn2->forward(reference->conv2->forward(h)), -1.0), x));
  CHECK(loom::testing::max_abs_diff(y, expected) < 1e-5);
}
