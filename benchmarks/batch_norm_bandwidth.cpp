// Batch norm's training passes at ResNet-50's shapes as memory bandwidth
// (issue 46): forward (statistics, gather, apply) and backward (reduce,
// apply) of plain batch norm, with the fused ReLU and with add + ReLU, per
// dtype and memory format. On CUDA both sets of kernels
// (LOOM_CUDA_BATCH_NORM=v1, v2; ops/batch_norm_cuda_kernels.h) run
// interleaved, run by run; v2 is checked against v1 before it is timed. On the
// CPU the CPU kernels run, checked against the same steps in f64.
// One JSON line per (shape, dtype, layout, fusion, pass, kernels):
//   bytes        the traffic no implementation avoids: forward reads x (and
//                the residual) and writes y; backward reads dy and x and writes
//                dx (add + ReLU: also reads the output and writes the residual's
//                gradient)
//   gbs          bytes / median time, GB/s (10^9)
//   pass_bytes, pass_gbs  the same for the traffic of the fewest passes the
//                math allows (the statistics read x once more; backward's
//                reduction reads dy and x before the apply reads them again)
//   peak_gbs, fraction_of_peak  the device's DRAM bandwidth (memory clock x bus
//                width x 2, or --peak-gbs) and gbs / peak_gbs
//   max_rel_diff the largest |result - reference| / max |reference| over the
//                outputs, checked against the dtype's tolerance before timing
//   batch_norm_bandwidth --device cuda
//   batch_norm_bandwidth --device cpu --shapes 4x8x4x4 --repeats 1 --steps 1
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <loom/core/cuda/runtime.h>
#include <loom/core/generator.h>
#include <loom/core/memory_format.h>
#include <loom/ops/batch_norm.h>
#include <loom/ops/batch_norm_cuda_kernels.h>
#include <loom/ops/dispatch.h>
#include "benchmarks/stats.h"
#include "benchmarks/step_timing.h"

using namespace loom;

namespace {

enum class Fusion { none, relu, add_relu };
const char* fusion_name(Fusion f) { return f == Fusion::none ? "none" : f == Fusion::relu ? "relu" : "add_relu"; }

constexpr double kEps = 1e-5, kMomentum = 0.1;

// Row `i` of a (2, C) tensor as a (C) view.
Tensor row(const Tensor& pairs, int64_t i) { return pairs.slice(0, i, i + 1).reshape({pairs.size(1)}); }

// One configuration's tensors on the device (inputs f32 parameters, as under mixed precision).
struct Problem {
  Tensor x, residual, dy, weight, bias, running_mean, running_var;
  Fusion fusion;
};

// What one run of the passes produces, for the check.
struct Forward {
  Tensor y, mean, var;
};
struct Backward {
  Tensor dx, sums, masked;
};

Forward forward(const Problem& p) {
  const Tensor stats = LOOM_DISPATCH(p.x, batch_norm_stats, p.x);
  const int64_t count = p.x.numel() / p.x.size(1);
  const Tensor mean_var =
      LOOM_DISPATCH(p.x, batch_norm_gather_stats, stats, count, p.running_mean, p.running_var, kMomentum);
  Forward f{Tensor(), row(mean_var, 0), row(mean_var, 1)};
  f.y = LOOM_DISPATCH(p.x, batch_norm_apply, p.x, f.mean, f.var, p.weight, p.bias, kEps,
                      p.fusion == Fusion::none ? Activation::none : Activation::relu,
                      p.fusion == Fusion::add_relu ? p.residual : Tensor());
  return f;
}

// Backward from the forward `f` (its statistics, and its output for add + ReLU).
Backward backward(const Problem& p, const Forward& f) {
  const int64_t count = p.x.numel() / p.x.size(1);
  Backward b;
  ops::FusedRelu relu;
  Tensor g = p.dy;
  if (p.fusion == Fusion::add_relu) {
    std::tie(b.sums, b.masked) =
        LOOM_DISPATCH(p.x, batch_norm_backward_reduce_relu_output, p.dy, f.y, p.x, f.mean, f.var, kEps);
    g = b.masked;
  } else {
    relu = {p.fusion == Fusion::relu, p.weight, p.bias};
    b.sums = LOOM_DISPATCH(p.x, batch_norm_backward_reduce, p.dy, p.x, f.mean, f.var, kEps, relu);
  }
  b.dx = LOOM_DISPATCH(p.x, batch_norm_backward_apply, g, p.x, f.mean, f.var, p.weight, b.sums, count, kEps, relu);
  return b;
}

// max |a - b| / max |b| (b the reference), on the host in f64.
double relative_difference(const Tensor& a, const Tensor& b) {
  const std::vector<double> u = a.to(Device::cpu()).to(DType::f64).contiguous().to_vector<double>();
  const std::vector<double> v = b.to(Device::cpu()).to(DType::f64).contiguous().to_vector<double>();
  double diff = 0, scale = 1e-3;
  for (size_t i = 0; i < u.size(); ++i) {
    diff = std::max(diff, std::isnan(u[i]) != std::isnan(v[i]) ? INFINITY : std::abs(u[i] - v[i]));
    scale = std::max(scale, std::abs(v[i]));
  }
  return diff / scale;
}

// tests/gpu/compare.h's backward tolerances: the check every output must pass.
double tolerance(DType t) { return t == DType::f32 ? 2e-4 : t == DType::f16 ? 1e-2 : 6e-2; }

Shape parse_shape(const std::string& text) {
  Shape shape;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, 'x')) shape.push_back(std::stoll(part));
  LOOM_CHECK(shape.size() == 4, "--shapes: expected NxCxHxW, got '", text, "'");
  return shape;
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

Fusion parse_fusion(const std::string& name) {
  if (name == "none") return Fusion::none;
  if (name == "relu") return Fusion::relu;
  if (name == "add_relu") return Fusion::add_relu;
  throw Error("--fusions: expected none, relu or add_relu, got '" + name + "'");
}

// Uniform values in [low, high) drawn on the CPU, stored as `dtype` on `device` in `format`.
Tensor random(const Shape& shape, uint64_t seed, DType dtype, const Device& device, MemoryFormat format,
              double low = -1.0, double high = 1.0) {
  Generator gen(seed);
  Tensor t = Tensor::empty(shape, DType::f32);
  gen.uniform_(t, low, high);
  return in_memory_format(t.to(device).to(dtype), format);
}

// A JSON number with `digits` decimals (3 significant digits when negative),
// or null when not finite (not measured).
std::string json_number(double value, int digits) {
  if (!std::isfinite(value)) return "null";
  char text[64];
  if (digits < 0) {
    std::snprintf(text, sizeof(text), "%.3g", value);
  } else {
    std::snprintf(text, sizeof(text), "%.*f", digits, value);
  }
  return text;
}

std::string shape_json(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loom batch norm's passes as memory bandwidth (GB/s), v1 and v2 CUDA kernels interleaved"};
  std::string device_name = "cuda", shapes = "128x64x32x32,128x256x32x32,128x512x16x16,128x1024x8x8,128x2048x4x4,"
                                             "32x64x56x56,32x256x56x56";
  std::string dtypes = "f16,bf16,f32", layouts = "nchw,nhwc", fusions = "none,relu,add_relu", passes = "forward,backward";
  int repeats = 5, steps = 20, warmup = 3;
  double peak_gbs = 0;
  app.add_option("--device", device_name, "cuda or cpu")->capture_default_str();
  app.add_option("--shapes", shapes, "NxCxHxW,... (ResNet-50's batch-norm inputs by default)")->capture_default_str();
  app.add_option("--dtypes", dtypes, "of f32, f16, bf16")->capture_default_str();
  app.add_option("--layouts", layouts, "of nchw, nhwc")->capture_default_str();
  app.add_option("--fusions", fusions, "of none, relu, add_relu")->capture_default_str();
  app.add_option("--passes", passes, "of forward, backward")->capture_default_str();
  app.add_option("--repeats", repeats, "timed runs per variant, interleaved; the median is reported")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "calls per timed run")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed calls per variant first")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--peak-gbs", peak_gbs, "the device's bandwidth in GB/s (default: CUDA's memory clock x bus width x 2)");
  CLI11_PARSE(app, argc, argv);
  try {
    const Device device = device_name == "cpu" ? Device::cpu() : Device::cuda(0);
    LOOM_CHECK(device_name == "cpu" || device_name == "cuda", "--device: expected cuda or cpu, got '", device_name, "'");
    if (device.is_cuda() && peak_gbs <= 0) peak_gbs = cuda::peak_memory_bandwidth_gbs(device.index);
    using Kernels = ops::CudaBatchNormKernels;
    // The CPU has one set of kernels; on CUDA v1 is the reference of v2.
    const std::vector<std::optional<Kernels>> variants =
        device.is_cuda() ? std::vector<std::optional<Kernels>>{Kernels::v1, Kernels::v2}
                         : std::vector<std::optional<Kernels>>{std::nullopt};
    const auto variant_name = [](const std::optional<Kernels>& k) {
      return !k ? "cpu" : *k == Kernels::v1 ? "v1" : "v2";
    };
    bool all_passed = true;
    uint64_t seed = 1;
    for (const std::string& shape_text : split(shapes)) {
      const Shape shape = parse_shape(shape_text);
      const int64_t channels = shape[1];
      for (const std::string& dtype_text : split(dtypes)) {
        const DType dtype = parse_dtype(dtype_text);
        LOOM_CHECK(dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16,
                   "--dtypes: expected f32, f16 or bf16, got '", dtype_text, "'");
        for (const std::string& layout : split(layouts)) {
          LOOM_CHECK(layout == "nchw" || layout == "nhwc", "--layouts: expected nchw or nhwc, got '", layout, "'");
          const MemoryFormat format = layout == "nhwc" ? MemoryFormat::nhwc : MemoryFormat::nchw;
          Problem base{random(shape, seed, dtype, device, format, -2.0, 3.0), random(shape, seed + 1, dtype, device, format),
                       random(shape, seed + 2, dtype, device, format), random({channels}, seed + 3, DType::f32, device,
                       MemoryFormat::nchw, -1.5, 1.5), random({channels}, seed + 4, DType::f32, device, MemoryFormat::nchw),
                       Tensor(), Tensor(), Fusion::none};
          seed += 10;
          for (const std::string& fusion_text : split(fusions)) {
            Problem p = base;
            p.fusion = parse_fusion(fusion_text);
            const auto fresh_running = [&] {
              p.running_mean = Tensor::zeros({channels}, DType::f32, device);
              p.running_var = Tensor::full({channels}, 1.0, DType::f32, device);
            };
            fresh_running();
            // Every variant's backward starts from the first variant's forward (its
            // statistics, and its output for add + ReLU), so that all mask the same
            // elements. The reference: v1 on CUDA; on the CPU the same steps in f64.
            Forward first, ref_forward;
            Backward ref_backward;
            const std::string reference = device.is_cuda() ? "v1" : "cpu_f64";
            {
              NoGradGuard no_grad;
              std::optional<ops::ScopedCudaBatchNormKernels> chosen;
              if (variants[0]) chosen.emplace(*variants[0]);
              first = forward(p);
              if (device.is_cuda()) {
                ref_forward = first;
                ref_backward = backward(p, first);
              } else {
                Problem p64 = p;
                for (Tensor* t : {&p64.x, &p64.residual, &p64.dy}) *t = t->to(DType::f64);
                fresh_running();
                ref_forward = forward(p64);
                ref_backward = backward(p64, Forward{first.y.to(DType::f64), first.mean, first.var});
              }
            }
            for (const std::string& pass : split(passes)) {
              LOOM_CHECK(pass == "forward" || pass == "backward", "--passes: expected forward or backward, got '",
                         pass, "'");
              const bool is_forward = pass == "forward";
              const double n = static_cast<double>(p.x.numel()) * static_cast<double>(element_size(dtype));
              const double residual = p.fusion == Fusion::add_relu ? 1 : 0;
              // Compulsory traffic, and that of the fewest passes (see the file's comment).
              const double bytes = is_forward ? (2 + residual) * n : (3 + 2 * residual) * n;
              const double pass_bytes = is_forward ? (3 + residual) * n : (5 + 2 * residual) * n;
              const Forward& stats = first;
              std::vector<double> differences;
              for (const auto& variant : variants) {
                std::optional<ops::ScopedCudaBatchNormKernels> chosen;
                if (variant) chosen.emplace(*variant);
                NoGradGuard no_grad;
                double difference = 0;
                if (is_forward) {
                  fresh_running();
                  const Forward f = forward(p);
                  difference = std::max(relative_difference(f.y, ref_forward.y),
                                        std::max(relative_difference(f.mean, ref_forward.mean),
                                                 relative_difference(f.var, ref_forward.var)));
                } else {
                  const Backward b = backward(p, stats);
                  difference = std::max(relative_difference(b.dx, ref_backward.dx),
                                        relative_difference(b.sums, ref_backward.sums));
                  if (b.masked.defined()) difference = std::max(difference, relative_difference(b.masked, ref_backward.masked));
                }
                differences.push_back(difference);
              }
              const bool checked = std::all_of(differences.begin(), differences.end(),
                                               [&](double d) { return d <= tolerance(dtype); });
              all_passed = all_passed && checked;
              std::vector<std::vector<double>> ms(variants.size(), std::vector<double>{NAN});
              const auto run_step = [&](size_t v) {
                std::optional<ops::ScopedCudaBatchNormKernels> chosen;
                if (variants[v]) chosen.emplace(*variants[v]);
                NoGradGuard no_grad;
                if (is_forward) {
                  (void)forward(p);
                } else {
                  (void)backward(p, stats);
                }
              };
              for (size_t v = 0; v < variants.size() && checked; ++v) {
                ms[v].clear();
                for (int i = 0; i < warmup; ++i) run_step(v);
              }
              for (int r = 0; r < repeats && checked; ++r) {
                for (size_t v = 0; v < variants.size(); ++v) {
                  const bench::StepTiming t = bench::time_steps(device, 1, steps, [&] { run_step(v); });
                  ms[v].push_back(t.ms_per_step[0]);
                }
              }
              // A variant not timed (a failed check) has nulls for its figures.
              const double v1_ms = bench::median(ms[0]);
              for (size_t v = 0; v < variants.size(); ++v) {
                const double median_ms = bench::median(ms[v]);
                const double gbs = bytes / (median_ms * 1e-3) / 1e9;
                std::printf(
                    "{\"bench\": \"loom batch_norm_bandwidth\", \"device\": \"%s\", \"shape\": %s, \"dtype\": \"%s\", "
                    "\"layout\": \"%s\", \"fusion\": \"%s\", \"pass\": \"%s\", \"kernels\": \"%s\", \"median_ms\": %s, "
                    "\"min_ms\": %s, \"bytes\": %.0f, \"gbs\": %s, \"pass_bytes\": %.0f, \"pass_gbs\": %s, "
                    "\"peak_gbs\": %s, \"fraction_of_peak\": %s, \"speedup_vs_v1\": %s, \"reference\": \"%s\", "
                    "\"max_rel_diff\": %s, \"tolerance\": %.1g, \"check\": \"%s\"}\n",
                    device.str().c_str(), shape_json(shape).c_str(), dtype_name(dtype), layout.c_str(),
                    fusion_name(p.fusion), pass.c_str(), variant_name(variants[v]), json_number(median_ms, 5).c_str(),
                    json_number(*std::min_element(ms[v].begin(), ms[v].end()), 5).c_str(), bytes,
                    json_number(gbs, 1).c_str(), pass_bytes, json_number(pass_bytes / (median_ms * 1e-3) / 1e9, 1).c_str(),
                    json_number(peak_gbs > 0 ? peak_gbs : NAN, 1).c_str(),
                    json_number(peak_gbs > 0 ? gbs / peak_gbs : NAN, 3).c_str(),
                    json_number(device.is_cuda() ? v1_ms / median_ms : NAN, 3).c_str(), reference.c_str(),
                    json_number(differences[v], -1).c_str(), tolerance(dtype),
                    differences[v] <= tolerance(dtype) ? "passed" : "FAILED");
                std::fflush(stdout);
              }
            }
          }
        }
      }
    }
    if (!all_passed) {
      std::fprintf(stderr, "batch_norm_bandwidth: a result differs from its reference beyond the tolerance\n");
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "batch_norm_bandwidth: %s\n", e.what());
    return 1;
  }
  return 0;
}
