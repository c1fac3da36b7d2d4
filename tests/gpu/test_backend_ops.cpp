// Every op and its backward on CUDA against the CPU backend, in the spirit of
// ggml's test-backend-ops: the same inputs (bit for bit) go through both
// backends for several shapes (odd sizes included), each dtype, and for
// conv / batch norm / pooling also with channels-last inputs on the GPU.
// Forward outputs and input gradients (from one random upstream gradient)
// must agree within the dtype's tolerance (compare.h).
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <initializer_list>
#include <vector>

#include <loom/core/cuda/counters.h>
#include <loom/core/cuda/runtime.h>
#include <loom/core/generator.h>
#include <loom/core/memory_format.h>
#include <loom/ops/batch_norm.h>
#include <loom/ops/batch_norm_cuda_kernels.h>
#include <loom/ops/cat.h>
#include <loom/ops/conv2d.h>
#include <loom/ops/dropout.h>
#include <loom/ops/elementwise.h>
#include <loom/ops/layer_norm.h>
#include <loom/ops/linear.h>
#include <loom/ops/loss.h>
#include <loom/ops/pooling.h>
#include "tests/gpu/compare.h"

using namespace loom;
using namespace loom::gpu_testing;

namespace {

const DType kFloatTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16};

using Op = std::function<TensorList(const TensorList&)>;

// Runs `op` on `inputs` (CPU leaves; those with requires_grad get gradients)
// and on their GPU copies; compares every output, then backpropagates the
// same random gradient from output 0 and compares the input gradients.
// Outputs of integer dtype must match exactly.
void check_op(const std::string& name, const TensorList& inputs, const Op& op, Tolerance tol,
              bool channels_last = false) {
  INFO(name, channels_last ? " (channels-last on the GPU)" : "");
  // Callers pass the same CPU leaves to several ops: start their gradients afresh
  // (backward accumulates into .grad, and the GPU copies are new leaves).
  for (Tensor t : inputs) {
    if (t.defined()) t.set_grad(Tensor());
  }
  TensorList gpu_inputs;
  for (const Tensor& t : inputs) gpu_inputs.push_back(t.defined() ? to_gpu(t, channels_last) : Tensor());
  const TensorList cpu_out = op(inputs);
  const TensorList gpu_out = op(gpu_inputs);
  REQUIRE(cpu_out.size() == gpu_out.size());
  for (size_t i = 0; i < cpu_out.size(); ++i) {
    CHECK(gpu_out[i].device().is_cuda());
    const bool exact = !is_floating(cpu_out[i].dtype());
    check_close(gpu_out[i], cpu_out[i], exact ? 0.0 : tol.forward, name + ": output " + std::to_string(i), tol.floor);
  }
  if (!cpu_out[0].requires_grad()) return;
  const Tensor upstream = random_cpu(cpu_out[0].sizes(), 4242, cpu_out[0].dtype());
  cpu_out[0].backward(upstream);
  gpu_out[0].backward(upstream.to(kCuda));
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined() || !inputs[i].requires_grad()) continue;
    REQUIRE(gpu_inputs[i].grad().defined());
    check_close(gpu_inputs[i].grad(), inputs[i].grad(), tol.backward, name + ": gradient of input " + std::to_string(i),
                tol.floor);
  }
}

Tensor leaf(const Shape& sizes, uint64_t seed, DType dtype, double low = -1.0, double high = 1.0) {
  return random_cpu(sizes, seed, dtype, low, high).set_requires_grad(true);
}

std::string label(const char* op, DType dtype, const Shape& shape) {
  return std::string(op) + " " + dtype_name(dtype) + shape_str(shape);
}

struct BatchNormCase {
  Shape input;
  bool affine, running, training;
};

// How a batch-norm variant's inputs are drawn: seeds from `first_seed` on
// (input, weight, bias, running mean, running var, residual), weights uniform
// in [weight_low, 1.5), and a residual only for batch_norm_add_relu.
struct BatchNormInputs {
  uint64_t first_seed;
  double weight_low;
  bool residual;
};

// One run of check_batch_norm_variant's cases, with the CUDA kernels chosen now.
template <size_t N>
void check_batch_norm_variant_once(const char* name, const BatchNormCase (&cases)[N], BatchNormInputs draw,
                                   const std::function<Tensor(const TensorList&, bool)>& op) {
  for (DType dtype : kFloatTypes) {
    const DType param_dtype = dtype == DType::f64 ? DType::f64 : DType::f32;
    for (const BatchNormCase& c : cases) {
      for (bool channels_last : {false, true}) {
        if (channels_last && c.input.size() != 4) continue;
        const int64_t channels = c.input[1];
        const uint64_t seed = draw.first_seed;
        const TensorList inputs{
            leaf(c.input, seed, dtype, -2.0, 3.0),
            c.affine ? leaf({channels}, seed + 1, param_dtype, draw.weight_low, 1.5) : Tensor(),
            c.affine ? leaf({channels}, seed + 2, param_dtype) : Tensor(),
            c.running ? random_cpu({channels}, seed + 3, param_dtype) : Tensor(),
            c.running ? random_cpu({channels}, seed + 4, param_dtype, 0.5, 2.0) : Tensor(),
            draw.residual ? leaf(c.input, seed + 5, dtype) : Tensor()};
        const bool training = c.training;
        // Two values per channel in training: the input gradient is zero up to
        // eps, the rounding of O(1) terms (f32: ~3e-7 seen on an H200), so
        // measured against 1e-2 rather than 1e-3.
        int64_t per_channel = 1;
        for (size_t d = 0; d < c.input.size(); ++d) per_channel *= d == 1 ? 1 : c.input[d];
        Tolerance tol = tolerance_for(dtype);
        if (training && per_channel == 2) tol.floor = 1e-2;
        check_op(label((std::string(name) + (training ? " train" : " eval")).c_str(), dtype, c.input), inputs,
                 [&op, training](const TensorList& t) {
                   // The running statistics are updated in place; compare them too.
                   const Tensor y = op(t, training);
                   return t[3].defined() ? TensorList{y, t[3], t[4]} : TensorList{y};
                 },
                 tol, channels_last);
      }
    }
  }
}

// Checks a batch-norm variant, op(t, training) with
// t = {input, weight, bias, running_mean, running_var, residual} (undefined
// where the case has none), on CUDA against the CPU for every float dtype
// (f16 / bf16 inputs with f32 parameters and statistics: mixed precision) and
// each case, with the input NCHW and (4-d inputs) channels-last on the GPU:
// the output, the running statistics updated in place, and the gradients of
// the input, weight, bias and residual. Both sets of CUDA kernels
// (LOOM_CUDA_BATCH_NORM=v1 and v2, ops/batch_norm_cuda_kernels.h) run every case.
template <size_t N>
void check_batch_norm_variant(const char* name, const BatchNormCase (&cases)[N], BatchNormInputs draw,
                              const std::function<Tensor(const TensorList&, bool)>& op) {
  for (ops::CudaBatchNormKernels kernels : {ops::CudaBatchNormKernels::v1, ops::CudaBatchNormKernels::v2}) {
    const ops::ScopedCudaBatchNormKernels chosen(kernels);
    INFO("CUDA batch-norm kernels ", kernels == ops::CudaBatchNormKernels::v1 ? "v1" : "v2");
    check_batch_norm_variant_once(name, cases, draw, op);
  }
}

}  // namespace

TEST_SUITE("backend_ops") {

TEST_CASE("elementwise ops and reductions") {
  for (DType dtype : kFloatTypes) {
    const Tolerance tol = tolerance_for(dtype);
    for (const Shape& shape : {Shape{3, 5, 7}, Shape{1}, Shape{1000, 1001}, Shape{2, 3, 17, 19}}) {
      const Tensor a = leaf(shape, 1, dtype), b = leaf(shape, 2, dtype);
      check_op(label("add", dtype, shape), {a, b}, [](const TensorList& t) { return TensorList{add(t[0], t[1])}; }, tol);
      check_op(label("sub", dtype, shape), {a, b}, [](const TensorList& t) { return TensorList{sub(t[0], t[1])}; }, tol);
      check_op(label("mul", dtype, shape), {a, b}, [](const TensorList& t) { return TensorList{mul(t[0], t[1])}; }, tol);
      check_op(label("scale", dtype, shape), {a}, [](const TensorList& t) { return TensorList{scale(t[0], 2.5)}; }, tol);
      check_op(label("add_scalar", dtype, shape), {a},
               [](const TensorList& t) { return TensorList{add_scalar(t[0], -0.75)}; }, tol);
      check_op(label("relu", dtype, shape), {a}, [](const TensorList& t) { return TensorList{relu(t[0])}; }, tol);
      check_op(label("gelu", dtype, shape), {a}, [](const TensorList& t) { return TensorList{gelu(t[0])}; }, tol);
      // Inputs in [-4, 4): both sides of every kink of the MobileNet activations.
      const Tensor wide = leaf(shape, 5, dtype, -4.0, 4.0);
      check_op(label("silu", dtype, shape), {wide}, [](const TensorList& t) { return TensorList{silu(t[0])}; }, tol);
      check_op(label("sigmoid", dtype, shape), {wide},
               [](const TensorList& t) { return TensorList{sigmoid(t[0])}; }, tol);
      check_op(label("hardswish", dtype, shape), {wide},
               [](const TensorList& t) { return TensorList{hardswish(t[0])}; }, tol);
      check_op(label("hardsigmoid", dtype, shape), {wide},
               [](const TensorList& t) { return TensorList{hardsigmoid(t[0])}; }, tol);
      check_op(label("relu6", dtype, shape), {leaf(shape, 6, dtype, -2.0, 8.0)},
               [](const TensorList& t) { return TensorList{relu6(t[0])}; }, tol);
      check_op(label("sum", dtype, shape), {a}, [](const TensorList& t) { return TensorList{sum(t[0])}; }, tol);
      check_op(label("mean", dtype, shape), {a}, [](const TensorList& t) { return TensorList{mean(t[0])}; }, tol);
    }
  }
}

TEST_CASE("elementwise ops keep channels-last strides") {
  const Tensor a = leaf({2, 3, 5, 4}, 3, DType::f32), b = leaf({2, 3, 5, 4}, 4, DType::f32);
  check_op("add f32 channels-last", {a, b}, [](const TensorList& t) { return TensorList{add(t[0], t[1])}; },
           tolerance_for(DType::f32), true);
  const Tensor x = to_gpu(a, true);
  const Tensor y = relu(x);
  CHECK(y.strides() == x.strides());
}

TEST_CASE("linear") {
  struct Case {
    int64_t n, in, out;
    bool bias;
  };
  for (DType dtype : kFloatTypes) {
    // {4, 0, 3}: no input features, the output is the bias.
    for (const Case& c : {Case{7, 13, 5, true}, Case{64, 300, 10, false}, Case{1, 1, 1, true}, Case{100, 1568, 10, true},
                          Case{4, 0, 3, true}}) {
      const Tensor x = leaf({c.n, c.in}, 11, dtype), w = leaf({c.out, c.in}, 12, dtype);
      const Tensor b = c.bias ? leaf({c.out}, 13, dtype) : Tensor();
      Tolerance tol = tolerance_for(dtype);
      check_op(label("linear", dtype, {c.n, c.in, c.out}), {x, w, b},
               [](const TensorList& t) { return TensorList{linear(t[0], t[1], t[2])}; }, tol);
    }
  }
}

// Every conv2d case for `dtypes` in both memory orders, within `tol` (the
// dtype's tolerance when null).
void check_conv2d_cases(std::initializer_list<DType> dtypes, const Tolerance* tol = nullptr) {
  struct Case {
    Shape input, weight;
    Conv2dParams params;
    bool bias;
  };
  const Case cases[] = {
      {{2, 3, 7, 9}, {4, 3, 3, 3}, {.stride = {1, 1}, .padding = {1, 1}}, true},
      {{3, 5, 11, 10}, {6, 5, 5, 5}, {.stride = {2, 2}, .padding = {2, 2}}, false},
      {{2, 4, 9, 9}, {3, 4, 3, 3}, {.stride = {1, 1}, .padding = {2, 2}, .dilation = {2, 2}}, true},
      {{2, 8, 6, 5}, {16, 8, 1, 1}, {}, true},
      {{4, 1, 28, 28}, {16, 1, 5, 5}, {.stride = {1, 1}, .padding = {2, 2}}, true},
      {{2, 3, 8, 7}, {4, 3, 3, 1}, {.stride = {2, 1}, .padding = {1, 0}}, true},
      {{2, 0, 5, 5}, {3, 0, 3, 3}, {.stride = {1, 1}, .padding = {1, 1}}, true},  // no input channels: the bias
      {{2, 6, 9, 8}, {6, 1, 3, 3}, {.padding = {1, 1}, .groups = 6}, true},                 // depthwise
      {{2, 4, 9, 9}, {8, 1, 5, 5}, {.stride = {2, 2}, .padding = {2, 2}, .groups = 4}, false},  // multiplier 2
      {{2, 8, 6, 7}, {12, 2, 3, 3}, {.padding = {1, 1}, .groups = 4}, true},                // grouped
  };
  for (DType dtype : dtypes) {
    for (const Case& c : cases) {
      for (bool channels_last : {false, true}) {
        if (channels_last && dtype == DType::f64) continue;  // cuDNN's f64 kernels are NCHW
        const Tensor x = leaf(c.input, 21, dtype), w = leaf(c.weight, 22, dtype, -0.5, 0.5);
        const Tensor b = c.bias ? leaf({c.weight[0]}, 23, dtype) : Tensor();
        const Conv2dParams params = c.params;
        check_op(label("conv2d", dtype, c.input) + " w" + shape_str(c.weight), {x, w, b},
                 [params](const TensorList& t) { return TensorList{conv2d(t[0], t[1], t[2], params)}; },
                 tol ? *tol : tolerance_for(dtype), channels_last);
      }
    }
  }
}

// Sets the CUDA math settings for a scope, and puts the previous ones back.
struct MathSettings {
  MathSettings(cuda::ConvAlgorithmSearch search, bool tf32)
      : previous_search(cuda::conv_algorithm_search()), previous_tf32(cuda::allow_tf32()) {
    cuda::set_conv_algorithm_search(search);
    cuda::set_allow_tf32(tf32);
  }
  ~MathSettings() {
    cuda::set_conv_algorithm_search(previous_search);
    cuda::set_allow_tf32(previous_tf32);
  }
  cuda::ConvAlgorithmSearch previous_search;
  bool previous_tf32;
};

TEST_CASE("conv2d forward, backward-data, backward-filter, bias") {
  check_conv2d_cases({DType::f32, DType::f64, DType::f16, DType::bf16});
}

TEST_CASE("conv2d with cuDNN's heuristic algorithm choice (cudnnGet) and with TF32") {
  SUBCASE("heuristic") {
    MathSettings settings(cuda::ConvAlgorithmSearch::heuristic, false);
    check_conv2d_cases({DType::f32, DType::f16, DType::bf16});
  }
  SUBCASE("TF32") {
    // Inputs read with 10 mantissa bits (as f16) and products accumulated in
    // f32; cuDNN's Winograd algorithms amplify the input rounding several
    // times, so twice f16's tolerance.
    const Tolerance tf32{1e-2, 2e-2};
    for (auto search : {cuda::ConvAlgorithmSearch::benchmark, cuda::ConvAlgorithmSearch::heuristic}) {
      MathSettings settings(search, true);
      check_conv2d_cases({DType::f32}, &tf32);
    }
    MathSettings settings(cuda::ConvAlgorithmSearch::benchmark, true);
    const Tensor x = leaf({64, 300}, 11, DType::f32), w = leaf({10, 300}, 12, DType::f32);
    const Tensor b = leaf({10}, 13, DType::f32);
    check_op("linear with TF32", {x, w, b}, [](const TensorList& t) { return TensorList{linear(t[0], t[1], t[2])}; },
             tf32);
  }
}

TEST_CASE("conv2d keeps the input's memory order") {
  const Tensor x = to_gpu(random_cpu({2, 8, 6, 6}, 24, DType::f16), true);
  const Tensor w = to_gpu(random_cpu({16, 8, 3, 3}, 25, DType::f16));
  const Tensor y = conv2d(x, w, Tensor(), {.stride = {1, 1}, .padding = {1, 1}});
  const Shape expected{6 * 6 * 16, 1, 6 * 16, 16};
  CHECK(y.strides() == expected);
}

TEST_CASE("batch_norm: training, eval, running statistics, mixed precision, channels-last") {
  const BatchNormCase cases[] = {
      {{4, 3, 5, 7}, true, true, true},  {{6, 10}, true, true, true},    {{2, 16, 1, 1}, true, false, true},
      {{3, 8, 5, 6}, false, true, true}, {{4, 3, 5, 7}, true, true, false}, {{5, 4, 3}, true, true, true},
  };
  check_batch_norm_variant("batch_norm", cases, {31, 0.5, false}, [](const TensorList& t, bool training) {
    return batch_norm(t[0], t[1], t[2], t[3], t[4], training, 0.1, 1e-5);
  });
}

TEST_CASE("batch_norm + ReLU fused: one pass forward, the mask recomputed from the input in backward") {
  // Weights of both signs, so the mask differs from the sign of xhat.
  const BatchNormCase cases[] = {{{4, 3, 5, 7}, true, true, true},  {{6, 10}, true, true, true},
                                 {{2, 16, 1, 1}, true, true, true}, {{3, 8, 5, 6}, false, true, true},
                                 {{4, 3, 5, 7}, true, true, false}, {{5, 4, 3}, true, true, false}};
  check_batch_norm_variant("batch_norm + relu", cases, {36, -1.5, false}, [](const TensorList& t, bool training) {
    return batch_norm(t[0], t[1], t[2], t[3], t[4], training, 0.1, 1e-5, Activation::relu);
  });
}

TEST_CASE("batch_norm_add_relu: the CUDA twin of the CPU's fused ResNet block tail, forward and every gradient") {
  // Weights of both signs and a residual, so the mask is neither the sign of
  // xhat nor of the normalised output.
  const BatchNormCase cases[] = {{{4, 3, 5, 7}, true, true, true},   {{6, 10}, true, true, true},
                                 {{2, 16, 1, 1}, true, false, true}, {{3, 8, 5, 6}, false, true, true},
                                 {{4, 3, 5, 7}, true, true, false},  {{2, 16, 1, 1}, true, true, false},
                                 {{5, 4, 3}, true, true, true}};
  check_batch_norm_variant("batch_norm_add_relu", cases, {50, -1.5, true}, [](const TensorList& t, bool training) {
    return batch_norm_add_relu(t[0], t[5], t[1], t[2], t[3], t[4], training, 0.1, 1e-5);
  });
}

TEST_CASE("batch_norm_relu_max_pool2d: CUDA (the ops apart) against the CPU's fused op") {
  // Even and odd planes, 7-wide pooled rows (the ConvNet's layer2), weights
  // of both signs (a negative scale flips the pool's choice).
  const BatchNormCase cases[] = {{{4, 3, 6, 8}, true, true, true},   {{2, 5, 7, 9}, true, false, true},
                                 {{2, 3, 14, 14}, true, true, true}, {{3, 4, 6, 6}, true, true, false},
                                 {{2, 3, 5, 8}, false, true, true}};
  check_batch_norm_variant("batch_norm_relu_max_pool2d", cases, {60, -1.5, false},
                           [](const TensorList& t, bool training) {
                             return batch_norm_relu_max_pool2d(t[0], t[1], t[2], t[3], t[4], training, 0.1, 1e-5);
                           });
}

TEST_CASE("batch_norm + ReLU fused equals batch_norm then relu on CUDA, and saves no output") {
  const Tensor x = to_gpu(random_cpu({4, 6, 5, 5}, 44, DType::f32, -2.0, 2.0)).set_requires_grad(true);
  const Tensor w = to_gpu(random_cpu({6}, 45, DType::f32, -1.5, 1.5)).set_requires_grad(true);
  const Tensor b = to_gpu(random_cpu({6}, 46, DType::f32)).set_requires_grad(true);
  const Tensor upstream = to_gpu(random_cpu({4, 6, 5, 5}, 47, DType::f32));
  const Tensor fused = batch_norm(x, w, b, Tensor(), Tensor(), true, 0.1, 1e-5, Activation::relu);
  fused.backward(upstream);
  const TensorList fused_grads{x.grad(), w.grad(), b.grad()};
  const Tensor x2 = x.detach().set_requires_grad(true), w2 = w.detach().set_requires_grad(true),
               b2 = b.detach().set_requires_grad(true);
  const Tensor separate = relu(batch_norm(x2, w2, b2, Tensor(), Tensor(), true, 0.1, 1e-5));
  separate.backward(upstream);
  check_close(fused, separate, 1e-6, "fused forward");
  check_close(fused_grads[0], x2.grad(), 1e-5, "fused input gradient");
  check_close(fused_grads[1], w2.grad(), 1e-5, "fused weight gradient");
  check_close(fused_grads[2], b2.grad(), 1e-5, "fused bias gradient");
}

// SyncBatchNorm passes its total count as a device tensor (no host wait for
// the all-reduce): both sets of kernels must divide by it exactly as by the
// number, here with a wrong lower bound on the host to show which they read.
TEST_CASE("batch_norm kernels read a total count on the device as they read a known one") {
  const int64_t count = 4 * 5 * 7;
  const Tensor total = Tensor::full({1}, static_cast<double>(count), DType::f64, kCuda);
  for (ops::CudaBatchNormKernels kernels : {ops::CudaBatchNormKernels::v1, ops::CudaBatchNormKernels::v2}) {
    const ops::ScopedCudaBatchNormKernels chosen(kernels);
    for (DType dtype : {DType::f32, DType::f16}) {
      INFO((kernels == ops::CudaBatchNormKernels::v1 ? "v1 " : "v2 "), dtype_name(dtype));
      const Tensor x = to_gpu(random_cpu({4, 6, 5, 7}, 61, dtype, -2.0, 3.0));
      const Tensor dy = to_gpu(random_cpu({4, 6, 5, 7}, 62, dtype));
      const Tensor weight = to_gpu(random_cpu({6}, 63, DType::f32, 0.5, 1.5));
      const Tensor stats = ops::cuda::batch_norm_stats(x);
      TensorList results[2];
      for (int on_device = 0; on_device < 2; ++on_device) {
        const StatisticsCount n = on_device ? StatisticsCount(count / 3, total) : StatisticsCount(count);
        const Tensor running_mean = Tensor::zeros({6}, DType::f32, kCuda);
        const Tensor running_var = Tensor::full({6}, 1.0, DType::f32, kCuda);
        const Tensor mean_var = ops::cuda::batch_norm_gather_stats(stats, n, running_mean, running_var, 0.1);
        const Tensor mean = mean_var.slice(0, 0, 1).reshape({6}), var = mean_var.slice(0, 1, 2).reshape({6});
        const Tensor sums = ops::cuda::batch_norm_backward_reduce(dy, x, mean, var, 1e-5);
        const Tensor dx = ops::cuda::batch_norm_backward_apply(dy, x, mean, var, weight, sums, n, 1e-5);
        results[on_device] = {mean_var, running_var, dx};
      }
      for (size_t i = 0; i < results[0].size(); ++i) {
        CHECK(host_values(results[1][i]) == host_values(results[0][i]));
      }
    }
  }
}

// LOOM_CUDA_BATCH_NORM=v2's kernels (f32 accumulation) at ResNet-50's
// batch-norm shapes against the CPU, each dtype, layout and fusion at least
// once (CIFAR stem: 64 channels at 32x32 down to 2048 at 4x4; 1x1 planes; the
// ImageNet stem's 64 at 56x56, batch 32). Tolerances: compare.h's per dtype
// (relative to the largest CPU value: f32 1e-4 forward, 2e-4 backward; f16
// 5e-3 / 1e-2; bf16 3e-2 / 6e-2). The f32 sums are expected within ~1e-6 of
// f64's, far inside them. Where the ReLU's input is within 1e-4 of zero,
// GPU and CPU statistics differing in the last bits may flip the mask (an
// O(1) change of that element's gradient, for either set of kernels), so
// those elements (about 1 in 10^4) are left out of the input and residual
// gradients' comparison.
// A suite of its own (gpu.batch_norm_v2, a step of the device script after
// the proven suites): v2 is unproven and these shapes are large, so neither a
// failure nor a slow CPU reference can cut gpu.backend_ops short.
TEST_CASE("batch_norm v2 at ResNet-50 shapes: forward, backward, ReLU and add-ReLU against the CPU" *
          doctest::test_suite("batch_norm_v2")) {
  enum class Fusion { none, relu, add_relu };
  struct ResNetCase {
    Shape input;
    DType dtype;
    bool channels_last, training;
    Fusion fusion;
  };
  const ResNetCase cases[] = {
      {{128, 64, 32, 32}, DType::f16, true, true, Fusion::relu},         // layer1 bn1 / bn2
      {{128, 2048, 4, 4}, DType::bf16, true, true, Fusion::add_relu},    // layer4 bn3 + identity
      {{128, 128, 16, 16}, DType::f32, false, true, Fusion::add_relu},   // layer2's width at 16x16
      {{128, 256, 8, 8}, DType::bf16, false, true, Fusion::none},        // layer3 bn1 / bn2
      {{128, 512, 4, 4}, DType::f32, true, false, Fusion::none},         // layer4, eval
      {{128, 2048, 1, 1}, DType::f16, false, true, Fusion::add_relu},    // 1x1 planes
      {{128, 1024, 1, 1}, DType::bf16, true, true, Fusion::relu},        // 1x1 planes, channels-last
      {{32, 64, 56, 56}, DType::f16, false, true, Fusion::relu},         // ImageNet stem, layer1
      {{32, 64, 56, 56}, DType::f32, true, true, Fusion::add_relu},
  };
  const ops::ScopedCudaBatchNormKernels v2(ops::CudaBatchNormKernels::v2);
  uint64_t seed = 700;
  for (const ResNetCase& c : cases) {
    INFO(label("batch_norm v2", c.dtype, c.input), c.channels_last ? " channels-last" : " NCHW", " fusion ",
         static_cast<int>(c.fusion), c.training ? " train" : " eval");
    const int64_t channels = c.input[1];
    seed += 10;
    // Weights of both signs, so that the mask is not the sign of xhat.
    const TensorList inputs{leaf(c.input, seed, c.dtype, -2.0, 3.0), leaf({channels}, seed + 1, DType::f32, -1.5, 1.5),
                            leaf({channels}, seed + 2, DType::f32), random_cpu({channels}, seed + 3, DType::f32),
                            random_cpu({channels}, seed + 4, DType::f32, 0.5, 2.0),
                            c.fusion == Fusion::add_relu ? leaf(c.input, seed + 5, c.dtype) : Tensor()};
    // The ReLU's input in f64 on the CPU (before the running statistics move).
    std::vector<double> keep;
    if (c.fusion != Fusion::none) {
      NoGradGuard no_grad;
      Tensor pre = batch_norm(inputs[0].to(DType::f64), inputs[1].to(DType::f64), inputs[2].to(DType::f64),
                              inputs[3].to(DType::f64), inputs[4].to(DType::f64), c.training, 0.1, 1e-5);
      if (inputs[5].defined()) pre = add(pre, inputs[5].to(DType::f64));
      for (double v : host_values(pre)) keep.push_back(std::abs(v) < 1e-4 ? 0.0 : 1.0);
    }
    TensorList gpu_inputs;
    for (const Tensor& t : inputs) gpu_inputs.push_back(t.defined() ? to_gpu(t, c.channels_last) : Tensor());
    const auto run = [&c](const TensorList& t) {
      if (c.fusion == Fusion::add_relu) return batch_norm_add_relu(t[0], t[5], t[1], t[2], t[3], t[4], c.training);
      return batch_norm(t[0], t[1], t[2], t[3], t[4], c.training, 0.1, 1e-5,
                        c.fusion == Fusion::relu ? Activation::relu : Activation::none);
    };
    const Tensor cpu_y = run(inputs), gpu_y = run(gpu_inputs);
    const Tolerance tol = tolerance_for(c.dtype);
    check_close(gpu_y, cpu_y, tol.forward, "output", tol.floor);
    check_close(gpu_inputs[3], inputs[3], tol.forward, "running mean", tol.floor);
    check_close(gpu_inputs[4], inputs[4], tol.forward, "running var", tol.floor);
    const Tensor upstream = random_cpu(c.input, seed + 6, c.dtype);
    cpu_y.backward(upstream);
    gpu_y.backward(upstream.to(kCuda));
    check_close(gpu_inputs[1].grad(), inputs[1].grad(), tol.backward, "weight gradient", tol.floor);
    check_close(gpu_inputs[2].grad(), inputs[2].grad(), tol.backward, "bias gradient", tol.floor);
    const Tensor mask = keep.empty() ? Tensor() : Tensor::from_vector<double>(keep, c.input).to(c.dtype);
    for (size_t i : {size_t{0}, size_t{5}}) {
      if (!inputs[i].defined()) continue;
      const Tensor gpu_grad = gpu_inputs[i].grad().to(Device::cpu()).contiguous(), cpu_grad = inputs[i].grad();
      check_close(mask.defined() ? mul(gpu_grad, mask) : gpu_grad, mask.defined() ? mul(cpu_grad, mask) : cpu_grad,
                  tol.backward, i == 0 ? "input gradient" : "residual gradient", tol.floor);
    }
  }
}

TEST_CASE("conv2d backward kernels: input alone, weight alone, both at once, into an output tensor") {
  const Conv2dParams params{.stride = {1, 1}, .padding = {1, 1}};
  for (DType dtype : {DType::f32, DType::f16}) {
    for (bool channels_last : {false, true}) {
      INFO(dtype_name(dtype), channels_last ? " channels-last" : "");
      const Tensor x = random_cpu({2, 3, 7, 6}, 26, dtype), w = random_cpu({4, 3, 3, 3}, 27, dtype, -0.5, 0.5);
      const Tensor dy = random_cpu({2, 4, 7, 6}, 28, dtype);
      const Tensor gx = to_gpu(x, channels_last), gw = to_gpu(w, channels_last), gdy = to_gpu(dy, channels_last);
      const Tensor dx_cpu = ops::cpu::conv2d_backward_input(dy, w, x.sizes(), params);
      const Tensor dw_cpu = ops::cpu::conv2d_backward_weight(dy, x, w.sizes(), params);
      const Tolerance tol = tolerance_for(dtype);
      check_close(ops::cuda::conv2d_backward_input(gdy, gw, x.sizes(), params), dx_cpu, tol.backward, "input alone");
      check_close(ops::cuda::conv2d_backward_weight(gdy, gx, w.sizes(), params), dw_cpu, tol.backward, "weight alone");
      // The weight gradient written into a contiguous output (a DDP bucket view).
      Tensor out = Tensor::zeros(w.sizes(), dtype, kCuda);
      const auto [dx, dw] = ops::cuda::conv2d_backward_input_weight(gdy, gx, gw, params, out);
      check_close(dx, dx_cpu, tol.backward, "input of both");
      check_close(dw, dw_cpu, tol.backward, "weight of both");
      CHECK(dw.is_same(out));
      check_close(out, dw_cpu, tol.backward, "the output tensor");
      // Into an output laid out as the input (a channels-last model's DDP
      // bucket view under channels-last input): cuDNN writes it there, no
      // copy after; and a channels-last weight is taken as it is, no re-layout.
      const MemoryFormat format = channels_last ? MemoryFormat::nhwc : MemoryFormat::nchw;
      Tensor laid_out = empty_with_format(w.sizes(), dtype, kCuda, format).zero_();
      cuda::Counters before = cuda::counters();
      const Tensor dw3 = ops::cuda::conv2d_backward_weight(gdy, gx, w.sizes(), params, laid_out);
      const cuda::Counters backward = cuda::counters() - before;
      CHECK(dw3.is_same(laid_out));
      CHECK(backward.kernel_launches == 0);
      CHECK(backward.device_copies == 0);
      check_close(laid_out, dw_cpu, tol.backward, "the output laid out as the input");
      before = cuda::counters();
      const Tensor y = ops::cuda::conv2d_forward(gx, gw, Tensor(), params);
      const cuda::Counters forward = cuda::counters() - before;
      CHECK(forward.kernel_launches == 0);  // cuDNN's pass alone
      CHECK(forward.device_copies == 0);
      check_close(y, ops::cpu::conv2d_forward(x, w, Tensor(), params), tol.forward, "forward");
      // An output that does not fit (another dtype) is left alone.
      Tensor other = Tensor::zeros(w.sizes(), DType::f64, kCuda);
      const Tensor dw2 = ops::cuda::conv2d_backward_weight(gdy, gx, w.sizes(), params, other);
      CHECK_FALSE(dw2.is_same(other));
      check_close(other, Tensor::zeros(w.sizes(), DType::f64), 0.0, "the unfitting output, untouched");
    }
  }
}

TEST_CASE("linear backward writes into given weight and bias gradients, as on the CPU") {
  const Tensor x = random_cpu({5, 7}, 14, DType::f32), w = random_cpu({3, 7}, 15, DType::f32);
  const Tensor dy = random_cpu({5, 3}, 16, DType::f32);
  Tensor dx_cpu, dw_cpu, db_cpu;
  ops::cpu::linear_backward(dy, x, w, true, true, true, dx_cpu, dw_cpu, db_cpu);
  Tensor dx, dw = Tensor::zeros({3, 7}, DType::f32, kCuda), db = Tensor::zeros({3}, DType::f32, kCuda);
  const Tensor weight_out = dw, bias_out = db;
  ops::cuda::linear_backward(to_gpu(dy), to_gpu(x), to_gpu(w), true, true, true, dx, dw, db);
  CHECK(dw.is_same(weight_out));
  CHECK(db.is_same(bias_out));
  check_close(dx, dx_cpu, 2e-4, "input gradient");
  check_close(weight_out, dw_cpu, 2e-4, "weight gradient in place");
  check_close(bias_out, db_cpu, 2e-4, "bias gradient in place");
}

TEST_CASE("max_pool2d and adaptive_avg_pool2d") {
  struct MaxCase {
    Shape input;
    Size2 kernel, stride, padding;
  };
  const MaxCase max_cases[] = {
      {{2, 3, 7, 9}, {2, 2}, {2, 2}, {0, 0}},
      {{2, 3, 8, 8}, {3, 3}, {2, 2}, {1, 1}},
      {{1, 2, 5, 6}, {2, 3}, {1, 2}, {1, 1}},
      {{4, 16, 28, 28}, {2, 2}, {2, 2}, {0, 0}},
  };
  struct AvgCase {
    Shape input;
    Size2 output;
  };
  const AvgCase avg_cases[] = {{{2, 3, 7, 9}, {3, 4}}, {{2, 5, 7, 7}, {1, 1}}, {{1, 2, 3, 5}, {4, 7}}};
  for (DType dtype : kFloatTypes) {
    const Tolerance tol = tolerance_for(dtype);
    for (bool channels_last : {false, true}) {
      for (const MaxCase& c : max_cases) {
        const Tensor x = leaf(c.input, 41, dtype);
        check_op(label("max_pool2d", dtype, c.input), {x},
                 [c](const TensorList& t) {
                   MaxPool2dResult r = max_pool2d_with_indices(t[0], c.kernel, c.stride, c.padding);
                   return TensorList{r.output, r.indices};
                 },
                 tol, channels_last);
      }
      for (const AvgCase& c : avg_cases) {
        const Tensor x = leaf(c.input, 42, dtype);
        check_op(label("adaptive_avg_pool2d", dtype, c.input), {x},
                 [c](const TensorList& t) { return TensorList{adaptive_avg_pool2d(t[0], c.output)}; }, tol,
                 channels_last);
      }
    }
  }
}

TEST_CASE("log_softmax, nll_loss, cross_entropy, argmax") {
  for (DType dtype : kFloatTypes) {
    const Tolerance tol = tolerance_for(dtype);
    for (const Shape& shape : {Shape{5, 10}, Shape{3, 1000}, Shape{1, 1}, Shape{100, 10}, Shape{33, 47}}) {
      const Tensor x = leaf(shape, 51, dtype, -3.0, 3.0);
      const Tensor targets = random_labels(shape[0], shape[1], 52);
      check_op(label("log_softmax", dtype, shape), {x},
               [](const TensorList& t) { return TensorList{log_softmax(t[0])}; }, tol);
      check_op(label("log_softmax + nll_loss", dtype, shape), {x, targets},
               [](const TensorList& t) { return TensorList{nll_loss(log_softmax(t[0]), t[1])}; }, tol);
      check_op(label("cross_entropy", dtype, shape), {x, targets},
               [](const TensorList& t) { return TensorList{cross_entropy(t[0], t[1])}; }, tol);
      // Label smoothing, and rows whose target is ignore_index (here class 0).
      const auto smoothed = CrossEntropyOptions().label_smoothing(0.2).ignore_index(0);
      check_op(label("cross_entropy smoothed, ignore_index", dtype, shape), {x, targets},
               [&](const TensorList& t) { return TensorList{cross_entropy(t[0], t[1], smoothed)}; }, tol);
      check_op(label("argmax", dtype, shape), {x.detach()}, [](const TensorList& t) { return TensorList{argmax(t[0])}; },
               tol);
      CHECK(count_correct(to_gpu(x), targets.to(kCuda)) == count_correct(x, targets));
    }
    const Tensor no_columns = random_cpu({3, 0}, 53, dtype);  // argmax says 0 on both backends
    check_close(argmax(to_gpu(no_columns)), argmax(no_columns), 0.0, "argmax of (3, 0)");
  }
}

TEST_CASE("nll_loss on given log-probabilities (not from log_softmax)") {
  for (DType dtype : kFloatTypes) {
    const Tensor lp = leaf({9, 6}, 61, dtype, -4.0, 0.0);
    const Tensor targets = random_labels(9, 6, 62);
    check_op(label("nll_loss", dtype, {9, 6}), {lp, targets},
             [](const TensorList& t) { return TensorList{nll_loss(t[0], t[1])}; }, tolerance_for(dtype));
  }
}

TEST_CASE("an out-of-range target makes the CUDA loss NaN instead of reading out of bounds") {
  const Tensor x = to_gpu(random_cpu({3, 4}, 63, DType::f32));
  const Tensor targets = Tensor::from_vector<int64_t>({0, 7, 1}, {3}).to(kCuda);
  CHECK(std::isnan(cross_entropy(x, targets).item()));
}

TEST_CASE("mul broadcast, dropout, stochastic depth, cat") {
  for (DType dtype : kFloatTypes) {
    const Tolerance tol = tolerance_for(dtype);
    const Tensor x = leaf({3, 5, 7, 6}, 91, dtype), channels = leaf({3, 5, 1, 1}, 92, dtype);
    const Tensor samples = leaf({3, 1, 1, 1}, 93, dtype);
    check_op(label("mul (N, C, 1, 1)", dtype, x.sizes()), {x, channels},
             [](const TensorList& t) { return TensorList{mul(t[0], t[1])}; }, tol);
    check_op(label("mul (N, 1, 1, 1)", dtype, x.sizes()), {x, samples},
             [](const TensorList& t) { return TensorList{mul(t[1], t[0])}; }, tol);
    // ConvNeXt's layer scale (C, 1, 1) over the batch, and (C) over channels-last rows.
    const Tensor layer_scale = leaf({5, 1, 1}, 99, dtype), last = leaf({6}, 100, dtype);
    check_op(label("mul (C, 1, 1)", dtype, x.sizes()), {x, layer_scale},
             [](const TensorList& t) { return TensorList{mul(t[1], t[0])}; }, tol);
    check_op(label("mul (C) over the last dim", dtype, x.sizes()), {x, last},
             [](const TensorList& t) { return TensorList{mul(t[0], t[1])}; }, tol);
    // One seed on both backends gives one mask (ops/dropout_math.h).
    check_op(label("dropout", dtype, x.sizes()), {x}, [](const TensorList& t) {
      manual_seed(17);
      return TensorList{dropout(t[0], 0.3, true)};
    }, tol);
    check_op(label("stochastic_depth", dtype, x.sizes()), {x}, [](const TensorList& t) {
      manual_seed(18);
      return TensorList{stochastic_depth(t[0], 0.5, StochasticDepthMode::row, true)};
    }, tol);
    const Tensor y = leaf({3, 2, 7, 6}, 94, dtype);
    check_op(label("cat", dtype, x.sizes()), {x, y}, [](const TensorList& t) { return TensorList{cat({t[0], t[1]}, 1)}; },
             tol, true);
  }
}

TEST_CASE("avg_pool2d and layer_norm") {
  struct PoolCase {
    Shape input;
    AvgPool2dParams params;
  };
  const PoolCase pool_cases[] = {
      {{2, 3, 7, 9}, {.kernel = {2, 2}, .stride = {2, 2}}},
      {{2, 3, 8, 8}, {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}}},
      {{1, 2, 5, 6}, {.kernel = {3, 2}, .stride = {1, 2}, .padding = {1, 1}, .count_include_pad = false}},
  };
  for (DType dtype : kFloatTypes) {
    const Tolerance tol = tolerance_for(dtype);
    for (bool channels_last : {false, true}) {
      for (const PoolCase& c : pool_cases) {
        check_op(label("avg_pool2d", dtype, c.input), {leaf(c.input, 95, dtype)},
                 [c](const TensorList& t) { return TensorList{avg_pool2d(t[0], c.params)}; }, tol, channels_last);
      }
    }
    for (const Shape& shape : {Shape{4, 7}, Shape{2, 5, 3, 96}, Shape{1, 1000}}) {
      const int64_t features = shape.back();
      const Tensor x = leaf(shape, 96, dtype, -2.0, 3.0), w = leaf({features}, 97, dtype, 0.5, 1.5);
      const Tensor b = leaf({features}, 98, dtype);
      check_op(label("layer_norm", dtype, shape), {x, w, b},
               [](const TensorList& t) { return TensorList{layer_norm(t[0], t[1], t[2])}; }, tol);
    }
    // ConvNeXt's LayerNorm2d: over the channels of (N, C, H, W), through NHWC and back.
    const Tensor x = leaf({2, 24, 5, 3}, 101, dtype, -2.0, 3.0), w = leaf({24}, 102, dtype, 0.5, 1.5);
    const Tensor b = leaf({24}, 103, dtype);
    check_op(label("layer_norm over channels (LayerNorm2d)", dtype, x.sizes()), {x, w, b}, [](const TensorList& t) {
      const Tensor nhwc = t[0].permute({0, 2, 3, 1}).contiguous();
      return TensorList{layer_norm(nhwc, t[1], t[2], 1e-6).permute({0, 3, 1, 2}).contiguous()};
    }, tol);
  }
}

}  // TEST_SUITE
