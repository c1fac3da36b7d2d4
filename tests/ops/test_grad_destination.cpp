// Gradient buffers (AccumulateGrad::set_gradient_buffer): backward computes a
// leaf's gradient straight into the given memory for conv2d, linear and
// batch_norm parameters (the engine offers it to the producing op as
// Node::gradient_destination), with the values it computes without one (f32
// and f64); accumulation without zeroing, a parameter used twice,
// retain_graph, dtype casts and ops that ignore the offer still give the
// right sums, in the buffer. The gradient already summed for an input
// (Node::gradient_sum) is offered only where it may be added to in place,
// and conv2d's CPU input gradient is added into it.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <memory>

#include <loom/core/autograd.h>
#include <loom/core/error.h>
#include <loom/ops/batch_norm.h>
#include <loom/ops/conv2d.h>
#include <loom/ops/elementwise.h>
#include <loom/ops/linear.h>

using namespace loom;

namespace {

Tensor values(const Shape& sizes, DType dtype, double phase) {
  std::vector<double> v(static_cast<size_t>(shape_numel(sizes)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37 * static_cast<double>(i) + phase);
  return Tensor::from_vector_as(v, sizes, dtype);
}

Tensor leaf(const Shape& sizes, DType dtype, double phase) {
  Tensor t = values(sizes, dtype, phase);
  t.set_requires_grad(true);
  return t;
}

// A leaf whose gradient goes into `destination` (zeros of its shape and
// dtype), and a `reference` leaf of the same values without one.
struct LeafWithDestination {
  Tensor leaf, reference, destination;
  std::shared_ptr<AccumulateGrad> accumulator;  // held: it keeps the destination
};
LeafWithDestination leaf_with_destination(const Shape& sizes, DType dtype, double phase = 0.0) {
  LeafWithDestination w{leaf(sizes, dtype, phase), leaf(sizes, dtype, phase), Tensor::zeros(sizes, dtype), nullptr};
  w.accumulator = grad_accumulator(w.leaf);
  w.accumulator->set_gradient_buffer(w.destination);
  return w;
}

// Weights the loss so that every output element gets a different gradient.
Tensor weighted_sum(const Tensor& y) { return sum(y * values(y.sizes(), y.dtype(), 0.5)); }

void check_close(const Tensor& actual, const Tensor& expected, double scale, const std::string& what) {
  REQUIRE(actual.defined());
  const double tolerance = actual.dtype() == DType::f64 ? 1e-12 : 1e-5;
  std::vector<double> a = actual.to_vector<double>(), b = expected.to_vector<double>();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(what, "[", i, "]");
    CHECK(std::abs(a[i] - scale * b[i]) <= tolerance * (1 + std::abs(scale * b[i])));
  }
}

using Loss = std::function<Tensor(const std::vector<Tensor>& parameters)>;

// Parameters of `shapes` get destinations: consecutive slices of one buffer,
// the first at an odd offset (DDP's bucket views sit anywhere). Backward must
// leave each .grad as exactly its destination, equal to the gradient computed
// without destinations; a second backward without zeroing adds in place.
void check_written_in_place(const std::vector<Shape>& shapes, DType dtype, const Loss& loss) {
  int64_t total = 3;
  for (const Shape& s : shapes) total += shape_numel(s);
  const Tensor buffer = Tensor::full({total}, 7.0, dtype);  // stale values, as in a bucket
  std::vector<Tensor> plain, placed, destinations;
  std::vector<std::shared_ptr<AccumulateGrad>> accumulators;  // held: they keep the buffers
  int64_t offset = 3;
  for (size_t k = 0; k < shapes.size(); ++k) {
    plain.push_back(leaf(shapes[k], dtype, static_cast<double>(k)));
    placed.push_back(leaf(shapes[k], dtype, static_cast<double>(k)));
    destinations.push_back(make_view(buffer, shapes[k], contiguous_strides(shapes[k]), offset));
    offset += shape_numel(shapes[k]);
    accumulators.push_back(grad_accumulator(placed[k]));
    accumulators.back()->set_gradient_buffer(destinations[k]);
  }
  loss(plain).backward();
  loss(placed).backward();
  for (size_t k = 0; k < shapes.size(); ++k) {
    INFO("parameter ", k, " of shape ", shape_str(shapes[k]));
    CHECK(placed[k].grad().is_same(destinations[k]));
    CHECK(placed[k].grad().raw_data() == destinations[k].raw_data());
    check_close(placed[k].grad(), plain[k].grad(), 1.0, "gradient");
  }
  // Accumulation (no zero_grad): .grad is defined, nothing is offered, it sums in place.
  loss(placed).backward();
  for (size_t k = 0; k < shapes.size(); ++k) {
    INFO("parameter ", k, " of shape ", shape_str(shapes[k]));
    CHECK(placed[k].grad().is_same(destinations[k]));
    check_close(placed[k].grad(), plain[k].grad(), 2.0, "accumulated gradient");
  }
  // set_to_none again: the next backward overwrites the stale sums.
  for (Tensor& p : placed) p.set_grad(Tensor());
  loss(placed).backward();
  for (size_t k = 0; k < shapes.size(); ++k) {
    CHECK(placed[k].grad().is_same(destinations[k]));
    check_close(placed[k].grad(), plain[k].grad(), 1.0, "gradient after set_to_none");
  }
}

}  // namespace

TEST_SUITE("grad destination") {
  TEST_CASE("conv2d weight and bias gradients are written into their destinations") {
    for (DType dtype : {DType::f32, DType::f64}) {
      CAPTURE(dtype_name(dtype));
      const Tensor x = values({2, 3, 6, 5}, dtype, 1.1);
      check_written_in_place({{4, 3, 3, 3}, {4}}, dtype, [&](const std::vector<Tensor>& p) {
        return weighted_sum(conv2d(x, p[0], p[1], Conv2dParams{.padding = {1, 1}}));
      });
    }
  }

  TEST_CASE("conv2d on the Winograd path with the input gradient too: both gradients in one backward call") {
    // f32, 5x5, 8 channels in and out, 8x8 planes: conv2d uses Winograd where the CPU has AVX2, and with the
    // input needing a gradient the backward computes both at once (conv2d_backward_input_weight).
    Tensor x = leaf({3, 8, 8, 8}, DType::f32, 1.3);
    check_written_in_place({{8, 8, 5, 5}, {8}}, DType::f32, [&](const std::vector<Tensor>& p) {
      return weighted_sum(conv2d(x, p[0], p[1], Conv2dParams{.padding = {2, 2}}));
    });
    REQUIRE(x.grad().defined());
  }

  TEST_CASE("grouped and depthwise conv2d weight gradients are written into their destinations") {
    // DDP's buckets: the grouped paths write the weight gradient into the offered buffer too,
    // with and without the input's gradient (conv2d_backward_input_weight / conv2d_backward_weight).
    for (bool input_gradient : {false, true}) {
      CAPTURE(input_gradient);
      Tensor x = values({2, 4, 6, 5}, DType::f32, 0.7);
      if (input_gradient) x.set_requires_grad(true);
      check_written_in_place({{4, 1, 3, 3}, {4}}, DType::f32, [&](const std::vector<Tensor>& p) {
        return weighted_sum(conv2d(x, p[0], p[1], Conv2dParams{.padding = {1, 1}, .groups = 4}));
      });
      check_written_in_place({{6, 2, 3, 3}, {6}}, DType::f32, [&](const std::vector<Tensor>& p) {
        return weighted_sum(conv2d(x, p[0], p[1], Conv2dParams{.padding = {1, 1}, .groups = 2}));
      });
    }
  }

  TEST_CASE("linear weight and bias gradients are written into their destinations") {
    for (DType dtype : {DType::f32, DType::f64}) {
      CAPTURE(dtype_name(dtype));
      const Tensor x = values({5, 7}, dtype, 0.3);
      check_written_in_place({{3, 7}, {3}}, dtype,
                             [&](const std::vector<Tensor>& p) { return weighted_sum(linear(x, p[0], p[1])); });
    }
  }

  TEST_CASE("batch_norm weight and bias gradients are written into their destinations") {
    for (DType dtype : {DType::f32, DType::f64}) {
      CAPTURE(dtype_name(dtype));
      const Tensor x = values({4, 3, 2, 2}, dtype, 0.7);
      check_written_in_place({{3}, {3}}, dtype, [&](const std::vector<Tensor>& p) {
        return weighted_sum(batch_norm(x, p[0], p[1], Tensor(), Tensor(), true, 0.1, 1e-5));
      });
    }
  }

  TEST_CASE("a conv -> batch_norm -> linear chain with the input gradient too") {
    const Tensor x = values({2, 2, 4, 4}, DType::f64, 0.2);
    check_written_in_place({{3, 2, 3, 3}, {3}, {3}, {3}, {5, 12}, {5}}, DType::f64,
                           [&](const std::vector<Tensor>& p) {
                             Tensor h = conv2d(x, p[0], p[1]);
                             h = batch_norm(h, p[2], p[3], Tensor(), Tensor(), true, 0.1, 1e-5, Activation::relu);
                             return weighted_sum(linear(h.reshape({2, 12}), p[4], p[5]));
                           });
  }

  TEST_CASE("a parameter used twice gets the right sum and keeps its destination memory") {
    const Tensor x = values({4, 5}, DType::f64, 0.9);
    LeafWithDestination w = leaf_with_destination({5, 5}, DType::f64);
    // y = W (W x): the first node to run writes the destination; the second
    // gets no offer (a gradient is already pending) and the engine sums.
    weighted_sum(linear(linear(x, w.leaf), w.leaf)).backward();
    weighted_sum(linear(linear(x, w.reference), w.reference)).backward();
    check_close(w.leaf.grad(), w.reference.grad(), 1.0, "shared parameter");
    // Elementwise w * w: one node, the same leaf twice.
    LeafWithDestination v = leaf_with_destination({6}, DType::f64, 0.4);
    weighted_sum(v.leaf * v.leaf).backward();
    weighted_sum(v.reference * v.reference).backward();
    check_close(v.leaf.grad(), v.reference.grad(), 1.0, "w * w");
  }

  TEST_CASE("retain_graph: the second backward adds into the destination") {
    const Tensor x = values({5, 7}, DType::f64, 0.3);
    LeafWithDestination w = leaf_with_destination({3, 7}, DType::f64);
    Tensor loss = weighted_sum(linear(x, w.leaf));
    loss.backward(Tensor(), true);
    loss.backward();
    weighted_sum(linear(x, w.reference)).backward();
    CHECK(w.leaf.grad().is_same(w.destination));
    check_close(w.leaf.grad(), w.reference.grad(), 2.0, "retained graph");
  }

  TEST_CASE("ops without destination support, casts and zero_grad(set_to_none=false)") {
    // mul's backward ignores the offer: AccumulateGrad copies its gradient into the buffer.
    LeafWithDestination w = leaf_with_destination({6}, DType::f64);
    const Tensor c = values({6}, DType::f64, 1.0);
    sum(w.leaf * c).backward();
    CHECK(w.leaf.grad().is_same(w.destination));
    check_close(w.leaf.grad(), c, 1.0, "mul");

    // A cast (autocast's f32 -> f16 of a parameter) converts into the destination.
    LeafWithDestination master = leaf_with_destination({3, 7}, DType::f64);
    const Tensor x = values({5, 7}, DType::f32, 0.3);
    weighted_sum(linear(x, master.leaf.to(DType::f32))).backward();
    weighted_sum(linear(x, master.reference.to(DType::f32))).backward();
    CHECK(master.leaf.grad().is_same(master.destination));
    check_close(master.leaf.grad(), master.reference.grad(), 1.0, "through a cast");

    // zero_grad(set_to_none=false): .grad stays defined and is summed into.
    master.leaf.mutable_grad().zero_();
    weighted_sum(linear(x, master.leaf.to(DType::f32))).backward();
    CHECK(master.leaf.grad().is_same(master.destination));
    check_close(master.leaf.grad(), master.reference.grad(), 1.0, "after zeroing in place");
  }

  TEST_CASE("f16 parameters: conv2d computes in f32 and converts into the destination") {
    const Tensor x = values({2, 3, 5, 5}, DType::f16, 1.1);
    LeafWithDestination w = leaf_with_destination({4, 3, 3, 3}, DType::f16);
    sum(conv2d(x, w.leaf)).backward();
    sum(conv2d(x, w.reference)).backward();
    CHECK(w.leaf.grad().is_same(w.destination));
    std::vector<double> a = w.leaf.grad().to_vector<double>(), b = w.reference.grad().to_vector<double>();
    CHECK(a == b);
  }

  TEST_CASE("buffers must match the tensor, and can be cleared") {
    Tensor w = leaf({3, 4}, DType::f32, 0.0);
    auto accumulator = grad_accumulator(w);
    CHECK(grad_accumulator(w) == accumulator);  // one per leaf
    CHECK_THROWS_WITH_AS(accumulator->set_gradient_buffer(Tensor::zeros({4, 3}, DType::f32)),
                         doctest::Contains("must have the tensor's shape, dtype and device"), Error);
    CHECK_THROWS_AS(accumulator->set_gradient_buffer(Tensor::zeros({3, 4}, DType::f64)), Error);
    CHECK_THROWS_WITH_AS(accumulator->set_gradient_buffer(Tensor::zeros({4, 3}, DType::f32).transpose(0, 1)),
                         doctest::Contains("not contiguous"), Error);
    Tensor destination = Tensor::zeros({3, 4}, DType::f32);
    accumulator->set_gradient_buffer(destination);
    CHECK(accumulator->gradient_buffer().is_same(destination));
    accumulator->set_gradient_buffer(Tensor());
    CHECK_FALSE(accumulator->gradient_buffer().defined());
  }

  TEST_CASE("the engine offers the buffer to the op producing the gradient, which writes it there") {
    // An op of its own records what its backward was offered and fills it.
    Tensor w = leaf({4}, DType::f64, 0.0);
    Tensor destination = Tensor::full({4}, 7.0, DType::f64);
    auto accumulator = grad_accumulator(w);
    accumulator->set_gradient_buffer(destination);
    Tensor offered;
    auto identity = [&] {
      Tensor y = w.detach().clone();
      record("identity", {w}, {&y}, [&offered](const TensorList& g, const Node& node) {
        offered = node.gradient_destination(0);
        Tensor written = offered.defined() ? offered : Tensor::empty({4}, DType::f64);
        written.copy_(g[0]);
        return TensorList{written};
      });
      return y;
    };
    sum(identity() * values({4}, DType::f64, 0.2)).backward();
    CHECK(offered.is_same(destination));
    CHECK(w.grad().is_same(destination));
    check_close(w.grad(), values({4}, DType::f64, 0.2), 1.0, "identity");
    // .grad is defined now: the next pass adds into it and offers nothing.
    sum(identity() * values({4}, DType::f64, 0.2)).backward();
    CHECK_FALSE(offered.defined());
    CHECK(w.grad().is_same(destination));
    check_close(w.grad(), values({4}, DType::f64, 0.2), 2.0, "identity accumulated");
  }

  TEST_CASE("the engine offers an input's pending sum; an op that adds into it is not added again") {
    // h = 1.5 x feeds an op of its own (a = h * v1) and, recorded after it so
    // that its backward runs first, b = h * v2: h's gradient is then pending
    // when the op's backward runs. The op adds into the offered sum or
    // ignores it; when b's gradient is also held elsewhere nothing is offered.
    const Tensor v1 = values({4}, DType::f64, 0.2), v2 = values({4}, DType::f64, 0.9);
    for (bool add_into : {true, false}) {
      for (bool held_elsewhere : {false, true}) {
        INFO("add into the sum: ", add_into, ", b's gradient held elsewhere: ", held_elsewhere);
        Tensor x = leaf({4}, DType::f64, 0.0);
        Tensor offered, returned, kept;
        Tensor h = x * 1.5;
        Tensor a;
        {
          NoGradGuard no_grad;
          a = h * v1;
        }
        record("times_v1", {h}, {&a}, [&](const TensorList& g, const Node& node) {
          offered = node.gradient_sum(0);
          const Tensor own = g[0] * v1;
          returned = own;
          if (add_into && offered.defined()) {
            returned = offered;
            returned.add_(own);
          }
          return TensorList{returned};
        });
        Tensor b;
        {
          NoGradGuard no_grad;
          b = h * v2;
        }
        record("times_v2", {h}, {&b}, [&](const TensorList& g, const Node&) {
          Tensor own = g[0] * v2;
          if (held_elsewhere) kept = own;
          return TensorList{own};
        });
        (sum(a) + sum(b)).backward();
        CHECK(offered.defined() == !held_elsewhere);
        if (offered.defined() && add_into) CHECK(returned.is_same(offered));
        check_close(x.grad(), (v1 + v2) * 1.5, 1.0, "x's gradient");
      }
    }
  }

  TEST_CASE("the CPU conv2d input gradient is added into the sum given, except under Winograd") {
    struct Case {
      const char* name;
      Shape input, weight;
      Conv2dParams params;
      bool winograd;  // for f32
    };
    const Case cases[] = {
        {"1x1, one image per GEMM: the GEMM's beta", {2, 8, 16, 16}, {6, 8, 1, 1}, {}, false},
        {"1x1 on 4x4 planes, images side by side: scattered and added", {6, 8, 4, 4}, {5, 8, 1, 1}, {}, false},
        {"1x1 stride 2 (ResNet's downsample): folded back", {2, 8, 8, 8}, {6, 8, 1, 1}, {.stride = {2, 2}}, false},
        {"3x3 stride 2: folded back (col2im)", {2, 4, 9, 9}, {3, 4, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}},
         false},
        {"3x3 on 2x2 planes: position classes", {3, 6, 2, 2}, {5, 6, 3, 3}, {.padding = {1, 1}}, false},
        {"3x3 on 8x8 planes, 8 channels: Winograd in f32, a fresh gradient", {2, 8, 8, 8}, {8, 8, 3, 3},
         {.padding = {1, 1}}, true},
    };
    for (const Case& c : cases) {
      for (DType dtype : {DType::f32, DType::f64}) {
        INFO(c.name, ", ", dtype_name(dtype));
        const Tensor x = values(c.input, dtype, 0.3), w = values(c.weight, dtype, 0.7);
        const Tensor y = ops::cpu::conv2d_forward(x, w, Tensor(), c.params);
        const Tensor dy = values(y.sizes(), dtype, 1.3);
        const Tensor plain = ops::cpu::conv2d_backward_input(dy, w, x.sizes(), c.params);
        const Tensor prior = values(x.sizes(), dtype, 2.1);
        const bool adds = !(c.winograd && dtype == DType::f32);
        Tensor sum_alone = prior.clone(), sum_both = prior.clone();
        const Tensor alone = ops::cpu::conv2d_backward_input(dy, w, x.sizes(), c.params, sum_alone);
        const Tensor both = ops::cpu::conv2d_backward_input_weight(dy, x, w, c.params, Tensor(), sum_both).first;
        CHECK(alone.is_same(sum_alone) == adds);
        CHECK(both.is_same(sum_both) == adds);
        const Tensor expected = adds ? prior + plain : plain;
        check_close(alone, expected, 1.0, "input gradient alone");
        check_close(both, expected, 1.0, "input gradient with the weight's");
        if (!adds) {
          check_close(sum_alone, prior, 1.0, "the sum, untouched");
          check_close(sum_both, prior, 1.0, "the sum, untouched");
        }
      }
    }
    // A sum that does not fit (another dtype, or another shape) is left alone.
    const Tensor x = values({2, 8, 16, 16}, DType::f32, 0.3), w = values({6, 8, 1, 1}, DType::f32, 0.7);
    const Tensor dy = values({2, 6, 16, 16}, DType::f32, 1.3);
    Tensor other_dtype = values(x.sizes(), DType::f64, 2.1), other_shape = values({2, 8, 16, 15}, DType::f32, 2.1);
    CHECK_FALSE(ops::cpu::conv2d_backward_input(dy, w, x.sizes(), {}, other_dtype).is_same(other_dtype));
    CHECK_FALSE(ops::cpu::conv2d_backward_input(dy, w, x.sizes(), {}, other_shape).is_same(other_shape));
    check_close(other_dtype, values(x.sizes(), DType::f64, 2.1), 1.0, "a sum of another dtype, untouched");
  }

  TEST_CASE("a residual block's convolution adds its input gradient into the shortcut's") {
    // out = conv(h) + relu(h), h = 2 x: relu's backward sends h's gradient
    // before the convolution's runs, which is offered that sum and adds into
    // it. The gradient is the one computed by the kernels apart.
    for (DType dtype : {DType::f32, DType::f64}) {
      for (const Shape& input : {Shape{2, 8, 16, 16}, Shape{6, 8, 4, 4}}) {
        INFO(dtype_name(dtype), ", input ", shape_str(input));
        Tensor x = leaf(input, dtype, 0.1);
        const Tensor w = values({8, 8, 1, 1}, dtype, 0.4), v = values(input, dtype, 0.8);
        Tensor h = x * 2.0;
        // Recorded in this order (operands of one expression are not), so the
        // convolution's backward runs after relu's.
        const Tensor branch = conv2d(h, w);
        const Tensor shortcut = relu(h);
        sum((branch + shortcut) * v).backward();
        // By hand: dL/dh = conv's input gradient of v, plus v where h > 0.
        const Tensor hv = h.detach();
        const Tensor by_conv = ops::cpu::conv2d_backward_input(v, w, input, {});
        std::vector<double> expected = by_conv.to_vector<double>(), hs = hv.to_vector<double>(),
                            vs = v.to_vector<double>();
        for (size_t i = 0; i < expected.size(); ++i) expected[i] = 2.0 * (expected[i] + (hs[i] > 0 ? vs[i] : 0.0));
        check_close(x.grad(), Tensor::from_vector_as(expected, input, dtype), 1.0, "x's gradient");
      }
    }
  }

  TEST_CASE("the CPU kernels write the weight and bias gradients into the memory given") {
    const Tensor x = values({2, 3, 6, 5}, DType::f32, 1.1), dy = values({2, 4, 6, 5}, DType::f32, 0.4);
    const Tensor w = values({4, 3, 3, 3}, DType::f32, 0.0);
    const Conv2dParams params{.padding = {1, 1}};
    Tensor out = Tensor::full({4, 3, 3, 3}, 7.0);
    CHECK(ops::cpu::conv2d_backward_weight(dy, x, w.sizes(), params, out).is_same(out));
    check_close(out, ops::cpu::conv2d_backward_weight(dy, x, w.sizes(), params), 1.0, "conv2d weight");
    Tensor both_out = Tensor::full({4, 3, 3, 3}, 7.0);
    CHECK(ops::cpu::conv2d_backward_input_weight(dy, x, w, params, both_out).second.is_same(both_out));
    check_close(both_out, out, 1.0, "conv2d input and weight");

    const Tensor a = values({5, 7}, DType::f32, 0.3), lw = values({3, 7}, DType::f32, 0.6);
    const Tensor ldy = values({5, 3}, DType::f32, 0.8);
    Tensor dx, dw = Tensor::full({3, 7}, 7.0), db = Tensor::full({3}, 7.0);
    const Tensor weight_out = dw, bias_out = db;
    ops::cpu::linear_backward(ldy, a, lw, false, true, true, dx, dw, db);
    CHECK(dw.is_same(weight_out));
    CHECK(db.is_same(bias_out));
    Tensor dx2, dw2, db2;
    ops::cpu::linear_backward(ldy, a, lw, false, true, true, dx2, dw2, db2);
    check_close(dw, dw2, 1.0, "linear weight");
    check_close(db, db2, 1.0, "linear bias");
  }
}
