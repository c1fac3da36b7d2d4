// The fused cuDNN graphs (ops/cuda/conv2d_graph.h, issue 47) against the
// unfused CUDA ops and the CPU, on ResNet-50's shapes at batch 32, f16 and
// bf16 (gpu.conv_graphs), then through the op that nn's ResNet blocks take
// (batch_norm_relu_conv2d) and a whole ResNet-50 step
// (gpu.conv_graphs_training): suites of their own, so that slow plan builds
// cannot cut gpu.backend_ops short. The graphs run whatever LOOM_CUDNN_GRAPH
// says (it gates the training path only). In a build without cudnn-frontend
// every graph must be refused.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <loom/core/cuda/counters.h>
#include <loom/core/memory_format.h>
#include <loom/nn/resnet.h>
#include <loom/ops/batch_norm.h>
#include <loom/ops/batch_norm_conv2d.h>
#include <loom/ops/dispatch.h>
#include <loom/ops/elementwise.h>
#include <loom/ops/loss.h>
#include <loom/ops/conv2d.h>
#include <loom/ops/cuda/conv2d_graph.h>
#include "tests/gpu/compare.h"

using namespace loom;
using namespace loom::gpu_testing;

namespace {

// One case of the fused forward graph (ops/cuda/conv2d_graph.h): x (N, C, H, W),
// w (K, C, R, R), square stride and padding.
struct ConvGraphCase {
  const char* name;
  int64_t n, c, h, w, k, r, stride, padding;
};

// Per output channel of a CPU (N, K, P, Q) tensor: (Σ|y|, Σy²), the scales
// the statistics' rounding is measured against.
std::pair<std::vector<double>, std::vector<double>> channel_magnitudes(const Tensor& y) {
  const std::vector<double> v = host_values(y.contiguous());
  const int64_t channels = y.size(1), plane = y.size(2) * y.size(3);
  std::vector<double> abs_sum(channels), sq_sum(channels);
  for (size_t i = 0; i < v.size(); ++i) {
    const auto k = static_cast<size_t>((static_cast<int64_t>(i) / plane) % channels);
    abs_sum[k] += std::abs(v[i]);
    sq_sum[k] += v[i] * v[i];
  }
  return {abs_sum, sq_sum};
}

// |got[k] - expected[k]| <= tolerance * scale[k] for every channel k.
void check_channel_sums(const Tensor& got, const std::vector<double>& expected, const std::vector<double>& scale,
                        double tolerance, const std::string& what) {
  const std::vector<double> g = host_values(got);
  REQUIRE(g.size() == expected.size());
  double worst = 0;
  size_t worst_channel = 0;
  for (size_t k = 0; k < g.size(); ++k) {
    const double error = std::abs(g[k] - expected[k]) / std::max(scale[k], 1e-30);
    if (error > worst) worst = error, worst_channel = k;
  }
  INFO(what, ": worst channel ", worst_channel, ": got ", g[worst_channel], ", expected ", expected[worst_channel],
       "; error ", worst, " of its scale (tolerance ", tolerance, ")");
  CHECK(worst <= tolerance);
}

// What running a fused graph did: whether cuDNN ran it, and the counters it moved.
struct GraphRun {
  bool ran;
  cuda::Counters counted;
};

// Runs `graph` (a fused op; false: refused), whose output `output` the caller
// filled with 7: a refusal must count one graph fallback and leave `output`
// untouched, a run must count none.
GraphRun run_checking_refusal(const std::function<bool()>& graph, const Tensor& output) {
  const cuda::Counters before = cuda::counters();
  const bool ran = graph();
  const cuda::Counters counted = cuda::counters() - before;
  if (!ran) {
    CHECK(counted.graph_fallbacks == 1);
    CHECK(host_values(output) == std::vector<double>(static_cast<size_t>(output.numel()), 7.0));
  } else {
    CHECK(counted.graph_fallbacks == 0);
  }
  return {ran, counted};
}

// Runs the fused forward on `c` in `dtype` and, when cuDNN ran it, checks it
// against the unfused CUDA ops (batch_norm_apply with mean 0, var 1, eps 0 and
// ReLU; conv2d; batch_norm_stats) and against the CPU's in f32. Returns whether
// it ran; a refusal must leave y untouched and count one graph fallback.
bool check_conv_graph_case(const ConvGraphCase& c, DType dtype) {
  INFO(std::string(c.name), " ", std::string(dtype_name(dtype)), " x ", shape_str({c.n, c.c, c.h, c.w}), " w ",
       shape_str({c.k, c.c, c.r, c.r}), " stride ", c.stride, " padding ", c.padding);
  const Conv2dParams params{.stride = {c.stride, c.stride}, .padding = {c.padding, c.padding}};
  const double bound = std::sqrt(3.0 / static_cast<double>(c.c * c.r * c.r));  // w's variance 1 / fan-in
  const Tensor x = random_cpu({c.n, c.c, c.h, c.w}, 71, dtype, -2.0, 2.0);
  const Tensor scale = random_cpu({c.c}, 72, dtype, 0.5, 1.5), bias = random_cpu({c.c}, 73, dtype, -0.5, 0.5);
  const Tensor w = random_cpu({c.k, c.c, c.r, c.r}, 74, dtype, -bound, bound);
  const Size2 out_hw = conv2d_output_size({c.h, c.w}, {c.r, c.r}, params);
  const Shape out_sizes{c.n, c.k, out_hw[0], out_hw[1]};

  const Tensor xg = to_gpu(x, true), wg = to_gpu(w, true), scale_g = to_gpu(scale), bias_g = to_gpu(bias);
  Tensor y = empty_with_format(out_sizes, dtype, kCuda, MemoryFormat::nhwc);
  y.fill_(7.0);
  const Tensor sum = Tensor::zeros({c.k}, DType::f32, kCuda), sq_sum = Tensor::zeros({c.k}, DType::f32, kCuda);
  const GraphRun run = run_checking_refusal(
      [&] { return ops::cuda::conv2d_bn_prologue_stats(xg, scale_g, bias_g, wg, params, y, sum, sq_sum); }, y);
  if (!run.ran) return false;
  CHECK(run.counted.library_calls == 1);

  // The unfused CUDA ops on the same inputs.
  const Tensor zeros = Tensor::zeros({c.c}, DType::f32, kCuda), ones = Tensor::ones({c.c}, DType::f32, kCuda);
  const Tensor a = ops::cuda::batch_norm_apply(xg, zeros, ones, scale_g, bias_g, 0.0, Activation::relu);
  const Tensor y_unfused = ops::cuda::conv2d_forward(a, wg, Tensor(), params);
  const Tensor stats_unfused = ops::cuda::batch_norm_stats(y_unfused);  // f64 (2, K)
  // The CPU in f32, from the prologue's output rounded to `dtype` as the unfused path stores it.
  const Tensor x32 = x.to(DType::f32), w32 = w.to(DType::f32);
  const Tensor a_cpu = ops::cpu::batch_norm_apply(x32, Tensor::zeros({c.c}), Tensor::ones({c.c}),
                                                  scale.to(DType::f32), bias.to(DType::f32), 0.0, Activation::relu)
                           .to(dtype)
                           .to(DType::f32);
  const Tensor y_cpu = ops::cpu::conv2d_forward(a_cpu, w32, Tensor(), params);
  const Tensor stats_cpu = ops::cpu::batch_norm_stats(y_cpu);

  // y: both CUDA paths round the same f32-accumulated sums of the same
  // products once to `dtype` (the fused prologue's output meets the tensor
  // cores in `dtype` too); they may differ by that rounding and by the
  // summation order: 2 units in the last place of the largest output.
  const double ulp = dtype == DType::f16 ? 0x1p-10 : 0x1p-7;
  check_close(y, y_unfused, 2 * ulp, "fused y against the unfused ops");
  // Against the CPU: the suite's tolerance for this dtype.
  check_close(y.to(DType::f32), y_cpu, tolerance_for(dtype).forward, "fused y against the CPU");

  // The statistics may be summed before y is rounded to `dtype` (half an ulp
  // per element) and y may differ by the 2 ulps above: |Δ sum_k| <= 2.5 ulp
  // Σ|y|, |Δ sq_sum_k| <= 2 * 2.5 ulp Σy²; measured against 3 and 6 ulp, the
  // f32 accumulation over N*P*Q terms adding far less than an f16 ulp.
  const auto [abs_sum, square_sum] = channel_magnitudes(y_cpu);
  for (const auto& [stats, source] : {std::pair{stats_unfused, "unfused"}, std::pair{stats_cpu, "CPU"}}) {
    const std::vector<double> s = host_values(stats);
    const auto k = static_cast<size_t>(c.k);
    const std::vector<double> expected_sum(s.begin(), s.begin() + k), expected_sq(s.begin() + k, s.end());
    check_channel_sums(sum, expected_sum, abs_sum, 3 * ulp, std::string("sum against the ") + source);
    check_channel_sums(sq_sum, expected_sq, square_sum, 6 * ulp, std::string("sum of squares against the ") + source);
  }
  return true;
}

// The data-gradient graph on `c` (x its input gradient's place) in `dtype`,
// against the unfused CUDA input gradient and an f64 host computation of the
// ReLU mask, the batch norm's parameter gradients and its input gradient
// (training: dx = gamma invstd (dz - Σdz / M - xhat Σ(dz xhat) / M), M = N H W)
// rebuilt from cuDNN's equivalent coefficients. Returns whether it ran.
bool check_dgrad_graph_case(const ConvGraphCase& c, DType dtype) {
  INFO(std::string(c.name), " ", std::string(dtype_name(dtype)), " (data gradient)");
  const Conv2dParams params{.stride = {c.stride, c.stride}, .padding = {c.padding, c.padding}};
  const double bound = std::sqrt(3.0 / static_cast<double>(c.c * c.r * c.r));
  const Shape x_sizes{c.n, c.c, c.h, c.w};
  const Tensor x = random_cpu(x_sizes, 91, dtype, -2.0, 2.0);
  const Tensor w = random_cpu({c.k, c.c, c.r, c.r}, 92, dtype, -bound, bound);
  const Size2 out_hw = conv2d_output_size({c.h, c.w}, {c.r, c.r}, params);
  const Tensor dy = random_cpu({c.n, c.k, out_hw[0], out_hw[1]}, 93, dtype);
  // The batch's own statistics, as training saves them (f64, then f32).
  const double eps = 1e-5;
  const std::vector<double> stats = host_values(ops::cpu::batch_norm_stats(x.to(DType::f32)));
  const int64_t count = c.n * c.h * c.w;
  std::vector<double> mean(c.c), invstd(c.c);
  for (int64_t ch = 0; ch < c.c; ++ch) {
    mean[ch] = stats[ch] / count;
    invstd[ch] = 1.0 / std::sqrt(stats[c.c + ch] / count - mean[ch] * mean[ch] + eps);
  }
  const Tensor gamma = random_cpu({c.c}, 94, DType::f32, 0.5, 1.5);
  const Tensor beta = random_cpu({c.c}, 95, DType::f32, -0.5, 0.5);
  const auto f32_gpu = [](const std::vector<double>& v) {
    return Tensor::from_vector_as(v, {static_cast<int64_t>(v.size())}, DType::f32).to(kCuda);
  };
  const ops::cuda::BatchNormSaved saved{f32_gpu(mean), f32_gpu(invstd), gamma.to(kCuda), beta.to(kCuda)};
  const auto channel_f32 = [&] { return Tensor::zeros({c.c}, DType::f32, kCuda); };
  Tensor dz = empty_with_format(x_sizes, dtype, kCuda, MemoryFormat::nhwc);
  dz.fill_(7.0);
  const ops::cuda::BatchNormBackwardTerms out{dz,           channel_f32(), channel_f32(),
                                              channel_f32(), channel_f32(), channel_f32()};
  const Tensor xg = to_gpu(x, true), wg = to_gpu(w, true), dyg = to_gpu(dy, true);
  const GraphRun run = run_checking_refusal(
      [&] { return ops::cuda::conv2d_dgrad_relu_bn_backward(dyg, wg, xg, saved, params, out); }, dz);
  if (!run.ran) return false;

  // The unfused input gradient, and the CPU's in f32.
  const std::vector<double> da = host_values(ops::cuda::conv2d_backward_input(dyg, wg, x_sizes, params));
  const std::vector<double> da_cpu =
      host_values(ops::cpu::conv2d_backward_input(dy.to(DType::f32), w.to(DType::f32), x_sizes, params));
  const std::vector<double> xs = host_values(x), got_dz = host_values(dz), g = host_values(saved.gamma),
                            b = host_values(saved.beta);
  const int64_t plane = c.h * c.w;
  const auto channel_of = [&](size_t i) { return static_cast<size_t>((static_cast<int64_t>(i) / plane) % c.c); };
  // dz: the mask from z in f64; elements with |z| < 1e-3 (where the graph's
  // f32 z and ours may disagree in sign) are left out of the comparison.
  const double ulp = dtype == DType::f16 ? 0x1p-10 : 0x1p-7;
  std::vector<double> dz_ref(xs.size()), xhat(xs.size());
  double max_da = 0, worst_dz = 0, worst_dz_cpu = 0;
  std::vector<double> dbeta(c.c), dgamma(c.c), abs_dz(c.c), abs_dz_xhat(c.c);
  for (size_t i = 0; i < xs.size(); ++i) {
    const size_t ch = channel_of(i);
    xhat[i] = (xs[i] - mean[ch]) * invstd[ch];
    const double z = xhat[i] * g[ch] + b[ch];
    dz_ref[i] = z > 0 ? da[i] : 0.0;
    max_da = std::max(max_da, std::abs(da[i]));
    if (std::abs(z) >= 1e-3) {
      worst_dz = std::max(worst_dz, std::abs(got_dz[i] - dz_ref[i]));
      worst_dz_cpu = std::max(worst_dz_cpu, std::abs(got_dz[i] - (z > 0 ? da_cpu[i] : 0.0)));
    }
    dbeta[ch] += dz_ref[i];
    dgamma[ch] += dz_ref[i] * xhat[i];
    abs_dz[ch] += std::abs(dz_ref[i]);
    abs_dz_xhat[ch] += std::abs(dz_ref[i] * xhat[i]);
  }
  // Both round f32-accumulated sums of the same products once to `dtype`.
  INFO("dz: worst difference ", worst_dz, " against max |da| ", max_da);
  CHECK(worst_dz <= 2 * ulp * max_da);
  // Against the CPU's f32 input gradient: the suite's tolerance for this dtype.
  INFO("dz against the CPU: worst difference ", worst_dz_cpu);
  CHECK(worst_dz_cpu <= tolerance_for(dtype).forward * max_da);
  // dz differs by at most 2 ulp per element: the sums by 2 ulp of Σ|.|; 3 allowed.
  check_channel_sums(out.dbeta, dbeta, abs_dz, 3 * ulp, "dbeta");
  check_channel_sums(out.dgamma, dgamma, abs_dz_xhat, 3 * ulp, "dgamma");
  // dx from cuDNN's coefficients against the training formula from the f64 sums.
  const std::vector<double> a = host_values(out.eq_scale_dy), bx = host_values(out.eq_scale_x),
                            c0 = host_values(out.eq_bias);
  double worst_dx = 0, max_dx = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const size_t ch = channel_of(i);
    const double expected =
        g[ch] * invstd[ch] * (dz_ref[i] - dbeta[ch] / count - xhat[i] * dgamma[ch] / count);
    const double rebuilt = a[ch] * got_dz[i] + bx[ch] * xs[i] + c0[ch];
    max_dx = std::max(max_dx, std::abs(expected));
    const double z = xhat[i] * g[ch] + b[ch];
    if (std::abs(z) >= 1e-3) worst_dx = std::max(worst_dx, std::abs(rebuilt - expected));
  }
  // Its terms carry dz's 2 ulp and the sums' 3 ulp: 4 ulp of the largest.
  INFO("dx: worst difference ", worst_dx, " against max |dx| ", max_dx);
  CHECK(worst_dx <= 4 * ulp * max_dx);
  return true;
}

// The weight-gradient graph (the prologue recomputed as it reads x) on `c`
// in `dtype`, against the unfused CUDA weight gradient of the prologue's
// output and the CPU's in f32. Returns whether it ran.
bool check_wgrad_graph_case(const ConvGraphCase& c, DType dtype) {
  INFO(std::string(c.name), " ", std::string(dtype_name(dtype)), " (weight gradient)");
  const Conv2dParams params{.stride = {c.stride, c.stride}, .padding = {c.padding, c.padding}};
  const Tensor x = random_cpu({c.n, c.c, c.h, c.w}, 121, dtype, -2.0, 2.0);
  const Tensor scale = random_cpu({c.c}, 122, dtype, 0.5, 1.5), bias = random_cpu({c.c}, 123, dtype, -0.5, 0.5);
  const Size2 out_hw = conv2d_output_size({c.h, c.w}, {c.r, c.r}, params);
  const Tensor dy = random_cpu({c.n, c.k, out_hw[0], out_hw[1]}, 124, dtype);
  const Shape w_sizes{c.k, c.c, c.r, c.r};
  const Tensor xg = to_gpu(x, true), dyg = to_gpu(dy, true), scale_g = to_gpu(scale), bias_g = to_gpu(bias);
  Tensor dw = empty_with_format(w_sizes, dtype, kCuda, MemoryFormat::nhwc);
  dw.fill_(7.0);
  const GraphRun run = run_checking_refusal(
      [&] { return ops::cuda::conv2d_wgrad_bn_prologue(dyg, xg, scale_g, bias_g, params, dw); }, dw);
  if (!run.ran) return false;
  const Tensor zeros = Tensor::zeros({c.c}, DType::f32, kCuda), ones = Tensor::ones({c.c}, DType::f32, kCuda);
  const Tensor a = ops::cuda::batch_norm_apply(xg, zeros, ones, scale_g, bias_g, 0.0, Activation::relu);
  check_close(dw, ops::cuda::conv2d_backward_weight(dyg, a, w_sizes, params), tolerance_for(dtype).backward,
              "fused dw against the unfused ops");
  const Tensor a_cpu = ops::cpu::batch_norm_apply(x.to(DType::f32), Tensor::zeros({c.c}), Tensor::ones({c.c}),
                                                  scale.to(DType::f32), bias.to(DType::f32), 0.0, Activation::relu)
                           .to(dtype)
                           .to(DType::f32);
  check_close(dw.to(DType::f32), ops::cpu::conv2d_backward_weight(dy.to(DType::f32), a_cpu, w_sizes, params),
              tolerance_for(dtype).backward, "fused dw against the CPU");
  return true;
}

// ||a - b||_2 / max(||b||_2, 1e-30) over the logical values: a few elements
// whose ReLU mask flips where z rounds across 0 weigh little, unlike in the
// max-norm.
double relative_l2(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = host_values(a), y = host_values(b);
  REQUIRE(x.size() == y.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < x.size(); ++i) diff += (x[i] - y[i]) * (x[i] - y[i]), norm += y[i] * y[i];
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

// One forward and backward of batch_norm_relu_conv2d (fused) or of
// conv2d(relu(batch_norm)) on `device`: x drawn in `dtype` (channels-last on
// CUDA), computed in `compute` (the CPU's f32 reference takes the same
// values). Output, output statistics, running stats, then the gradients.
std::vector<Tensor> run_batch_norm_conv(bool fused, Device device, DType dtype, DType compute, const ConvGraphCase& c,
                                        bool training) {
  const Conv2dParams params{.stride = {c.stride, c.stride}, .padding = {c.padding, c.padding}};
  const double bound = std::sqrt(3.0 / static_cast<double>(c.c * c.r * c.r));
  // Images and weights in `compute` (channels-last on CUDA); the batch
  // norm's parameters and running stats in f32, as amp O2 keeps them.
  const auto image = [&](const Tensor& t) {
    return (device.is_cuda() ? to_gpu(t.to(compute), true) : t.to(compute)).set_requires_grad(true);
  };
  const auto channel = [&](const Tensor& t, bool grad) {
    Tensor out = t.to(device);
    return grad ? out.set_requires_grad(true) : out;
  };
  Tensor x = image(random_cpu({c.n, c.c, c.h, c.w}, 101, dtype, -1.0, 2.0));
  Tensor w = image(random_cpu({c.k, c.c, c.r, c.r}, 104, dtype, -bound, bound));
  Tensor gamma = channel(random_cpu({c.c}, 102, DType::f32, 0.5, 1.5), true);
  Tensor beta = channel(random_cpu({c.c}, 103, DType::f32, -0.5, 0.5), true);
  Tensor running_mean = channel(random_cpu({c.c}, 105, DType::f32, -0.2, 0.2), false);
  Tensor running_var = channel(random_cpu({c.c}, 106, DType::f32, 0.5, 1.5), false);
  Tensor y, stats;
  if (fused) {
    BatchNormReluConv2d out = batch_norm_relu_conv2d(x, gamma, beta, running_mean, running_var, training, 0.1, 1e-5, w,
                                                     params, Tensor(), true);
    y = out.output;
    stats = out.output_stats;
  } else {
    y = conv2d(relu(batch_norm(x, gamma, beta, running_mean, running_var, training, 0.1, 1e-5)), w, Tensor(), params);
    if (training) stats = LOOM_DISPATCH(y, batch_norm_stats, y.detach());
  }
  const Tensor dy = random_cpu(y.sizes(), 107, dtype);
  y.backward(device.is_cuda() ? to_gpu(dy.to(compute), true) : dy.to(compute));
  return {y, stats, running_mean, running_var, x.grad(), gamma.grad(), beta.grad(), w.grad()};
}

const char* const kBatchNormConvNames[] = {"output",  "output_stats", "running_mean", "running_var",
                                           "d input", "d gamma",      "d beta",       "d w"};

// ResNet-50's convolutions between two batch norms at batch 32: layer1's 3x3,
// its 1x1 reduction and expansion, layer2's strided 3x3.
const ConvGraphCase kLayer1Conv3x3{"layer1 3x3", 32, 64, 56, 56, 64, 3, 1, 1};
const ConvGraphCase kLayer1Reduction1x1{"layer1 1x1 reduction", 32, 256, 56, 56, 64, 1, 1, 0};
const ConvGraphCase kLayer1Expansion1x1{"layer1 1x1 expansion", 32, 64, 56, 56, 256, 1, 1, 0};
const ConvGraphCase kLayer2Conv3x3Stride2{"layer2 3x3 stride 2", 32, 128, 56, 56, 128, 3, 2, 1};

// `check_case` (check_conv_graph_case or check_dgrad_graph_case) on each of
// ResNet's `cases` in f16 and bf16. Built in, cuDNN must take them all
// (Ampere and later; the reason for a refusal is logged at
// LOOM_LOG_LEVEL=debug); without cudnn-frontend it must refuse them all.
void check_resnet_cases(const std::vector<ConvGraphCase>& cases, bool (*check_case)(const ConvGraphCase&, DType)) {
  for (DType dtype : {DType::f16, DType::bf16}) {
    for (const ConvGraphCase& c : cases) {
      const bool ran = check_case(c, dtype);
      INFO(std::string(c.name), " ", std::string(dtype_name(dtype)),
           ": cudnn-frontend built in: ", ops::cuda::conv_graphs_built_in());
      CHECK(ran == ops::cuda::conv_graphs_built_in());
    }
  }
}
}  // namespace

TEST_SUITE("conv_graphs") {
// Issue 47's fused forward, run whatever LOOM_CUDNN_GRAPH says (it gates the
// training path only), on ResNet-50's four shapes.
TEST_CASE("cuDNN graph: batch-norm prologue + conv2d + statistics epilogue against the unfused ops and the CPU") {
  check_resnet_cases({kLayer1Conv3x3, kLayer1Reduction1x1, kLayer1Expansion1x1, kLayer2Conv3x3Stride2},
                     check_conv_graph_case);
}

TEST_CASE("cuDNN graph: a refused graph writes nothing and counts a fallback") {
  // groups != 1: refused before cuDNN is asked.
  const Tensor x = to_gpu(random_cpu({2, 16, 8, 8}, 81, DType::f16), true);
  const Tensor w = to_gpu(random_cpu({16, 8, 3, 3}, 82, DType::f16), true);
  const Tensor scale = to_gpu(random_cpu({16}, 83, DType::f16)), bias = to_gpu(random_cpu({16}, 84, DType::f16));
  const Tensor y = empty_with_format({2, 16, 8, 8}, DType::f16, kCuda, MemoryFormat::nhwc);
  const Tensor sum = Tensor::zeros({16}, DType::f32, kCuda), sq_sum = Tensor::zeros({16}, DType::f32, kCuda);
  const cuda::Counters before = cuda::counters();
  CHECK_FALSE(ops::cuda::conv2d_bn_prologue_stats(x, scale, bias, w, {.padding = {1, 1}, .groups = 2}, y, sum, sq_sum));
  CHECK((cuda::counters() - before).graph_fallbacks == 1);
  CHECK(host_values(sum) == std::vector<double>(16, 0.0));
  // Three input channels (the stem's image) and odd sizes: cuDNN may take
  // them or not; either way the contract holds (checked inside).
  const bool ran = check_conv_graph_case({"3 channels, odd sizes", 4, 3, 17, 17, 5, 3, 1, 1}, DType::f16);
  MESSAGE("cuDNN ", ran ? "ran" : "refused", " the graph for 3 input channels and odd sizes");
  // A contract violation is an error, not a refusal.
  const Tensor nchw_x = to_gpu(random_cpu({2, 16, 8, 8}, 85, DType::f16));
  const Tensor dense_w = to_gpu(random_cpu({16, 16, 3, 3}, 86, DType::f16), true);
  check_mentions(error_message([&] {
                   (void)ops::cuda::conv2d_bn_prologue_stats(nchw_x, scale, bias, dense_w, {.padding = {1, 1}}, y,
                                                             sum, sq_sum);
                 }),
                 {"conv2d_bn_prologue_stats", "channels-last"});
}

TEST_CASE("cuDNN graph: conv2d data gradient + ReLU mask + batch-norm backward terms against the unfused ops and f64") {
  check_resnet_cases({kLayer1Conv3x3, kLayer1Expansion1x1, kLayer2Conv3x3Stride2}, check_dgrad_graph_case);
}

TEST_CASE("cuDNN graph: batch-norm prologue + conv2d weight gradient against the unfused ops and the CPU") {
  check_resnet_cases({kLayer1Conv3x3, kLayer1Expansion1x1, kLayer2Conv3x3Stride2}, check_wgrad_graph_case);
}

}  // TEST_SUITE

// The training path into the graphs: the op nn's ResNet blocks take and a
// whole ResNet-50 step. A suite of its own (gpu.conv_graphs_training): its
// shapes build plans of their own, which must not cut gpu.conv_graphs short.
TEST_SUITE("conv_graphs_training") {
TEST_CASE("batch_norm_relu_conv2d on CUDA through the graphs (f16, bf16, channels-last) against the ops apart and "
          "the CPU") {
  // ResNet-50's shapes at batch 8. Fused and apart differ by the prologue's
  // coefficients rounded to the dtype, the summation orders and the few
  // elements whose ReLU mask flips: measured in the L2 norm against the
  // suite's tolerances.
  for (DType dtype : {DType::f16, DType::bf16}) {
    for (ConvGraphCase c : {kLayer1Conv3x3, kLayer1Expansion1x1, kLayer2Conv3x3Stride2}) {
      c.n = 8;
      for (bool training : {true, false}) {
        INFO(std::string(c.name), " ", std::string(dtype_name(dtype)), std::string(training ? " training" : " eval"));
        const cuda::Counters before = cuda::counters();
        const auto fused = run_batch_norm_conv(true, kCuda, dtype, dtype, c, training);
        const cuda::Counters counted = cuda::counters() - before;
        // Built in, cuDNN must take the three graphs (forward, data and
        // weight gradients); without it none is asked for.
        CHECK(counted.graph_fallbacks == 0);
        CHECK(counted.graph_runs == (ops::cuda::conv_graphs_built_in() ? 3 : 0));
        const auto apart = run_batch_norm_conv(false, kCuda, dtype, dtype, c, training);
        const auto cpu = run_batch_norm_conv(false, Device::cpu(), dtype, DType::f32, c, training);
        const Tolerance tolerance = tolerance_for(dtype);
        for (size_t i = 0; i < fused.size(); ++i) {
          INFO(std::string(kBatchNormConvNames[i]));
          REQUIRE(fused[i].defined() == apart[i].defined());
          if (!fused[i].defined()) continue;
          CHECK(relative_l2(fused[i], apart[i]) <= tolerance.backward);
          CHECK(relative_l2(fused[i], cpu[i]) <= tolerance.backward);
        }
        CHECK(is_channels_last(fused[0]));
      }
    }
  }
}

TEST_CASE("batch_norm_relu_conv2d on CUDA in f32 (no graph) equals the CUDA ops apart bit for bit") {
  ConvGraphCase c = kLayer2Conv3x3Stride2;
  c.n = 4;
  const cuda::Counters before = cuda::counters();
  const auto fused = run_batch_norm_conv(true, kCuda, DType::f32, DType::f32, c, true);
  const cuda::Counters counted = cuda::counters() - before;
  CHECK(counted.graph_fallbacks + counted.graph_runs == 0);  // not a candidate: no graph asked for
  const auto apart = run_batch_norm_conv(false, kCuda, DType::f32, DType::f32, c, true);
  for (size_t i = 0; i < fused.size(); ++i) {
    INFO(std::string(kBatchNormConvNames[i]));
    check_close(fused[i], apart[i], 0, kBatchNormConvNames[i]);
  }
}

TEST_CASE("ResNet-50 (f16, channels-last) forward and backward with the fused graphs against without") {
  // The training path as LOOM_CUDNN_GRAPH=1 takes it (FuseBatchNormConv
  // here): 32 fused convolutions; a shape cuDNN refuses runs apart, counted.
  const auto run = [](bool fused, cuda::Counters* counted) {
    manual_seed(3);
    auto model = nn::resnet50(nn::ResNetOptions().num_classes(10).stem(nn::ResNetStem::cifar));
    model->to(MemoryFormat::nhwc);
    model->to(DType::f16);
    model->to(kCuda);
    const Tensor images = to_gpu(random_cpu({8, 3, 32, 32}, 111, DType::f16), true);
    const Tensor labels = random_labels(8, 10, 112).to(kCuda);
    const cuda::Counters before = cuda::counters();
    std::optional<ops::FuseBatchNormConv> fuse;
    if (fused) fuse.emplace();
    Tensor loss = cross_entropy((*model)(images), labels);
    loss.backward();
    if (counted) *counted = cuda::counters() - before;
    std::vector<Tensor> out{loss};
    for (const Tensor& p : model->parameters()) out.push_back(p.grad());
    return out;
  };
  cuda::Counters counted;
  const auto fused = run(true, &counted);
  const auto apart = run(false, nullptr);
  MESSAGE("fused ResNet-50 step: ", counted.graph_runs, " graphs ran, ", counted.graph_fallbacks, " refused");
  // 32 fused convolutions, 3 graphs each; refusals are allowed (they run apart) but none expected.
  if (ops::cuda::conv_graphs_built_in()) CHECK(counted.graph_runs == 96);
  CHECK(relative_l2(fused[0], apart[0]) <= 1e-2);
  double worst = 0;
  for (size_t i = 1; i < fused.size(); ++i) worst = std::max(worst, relative_l2(fused[i], apart[i]));
  INFO("worst parameter gradient, relative L2: ", worst);
  CHECK(worst <= 5e-2);
}

}  // TEST_SUITE
