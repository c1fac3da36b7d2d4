// What the GPU suites share: random inputs, copies to the device (optionally
// channels-last), and comparisons of CUDA results against CPU results with
// dtype-appropriate tolerances.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <initializer_list>
#include <string>
#include <vector>

#include <loom/core/autograd.h>
#include <loom/core/generator.h>
#include <loom/core/tensor.h>

namespace loom::gpu_testing {

inline const Device kCuda = Device::cuda(0);

// The message of the loom::Error that fn() throws; empty when it throws none
// (which then fails check_mentions).
template <class Fn>
std::string error_message(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Checks that `message` contains each of `parts`.
inline void check_mentions(const std::string& message, std::initializer_list<const char*> parts) {
  INFO(message);
  for (const char* part : parts) {
    INFO("expected to find: ", part);
    CHECK(message.find(part) != std::string::npos);
  }
}

// A CPU leaf of `dtype` with values uniform in [low, high) (drawn in f64, then rounded).
inline Tensor random_cpu(const Shape& sizes, uint64_t seed, DType dtype, double low = -1.0, double high = 1.0) {
  Generator gen(seed);
  Tensor t = Tensor::empty(sizes, DType::f64);
  gen.uniform_(t, low, high);
  NoGradGuard no_grad;
  return t.to(dtype).detach();
}

// Integer class labels in [0, classes) as an i64 CPU tensor.
inline Tensor random_labels(int64_t n, int64_t classes, uint64_t seed) {
  Generator gen(seed);
  std::vector<int64_t> values(static_cast<size_t>(n));
  for (auto& v : values) v = static_cast<int64_t>(gen.below(static_cast<uint64_t>(classes)));
  return Tensor::from_vector<int64_t>(values, {n});
}

// `t` copied to the GPU as a new leaf; channels_last stores a 4-d tensor NHWC.
inline Tensor to_gpu(const Tensor& t, bool channels_last = false) {
  NoGradGuard no_grad;
  Tensor out;
  if (channels_last && t.dim() == 4) {
    const int64_t n = t.size(0), c = t.size(1), h = t.size(2), w = t.size(3);
    Tensor memory = Tensor::empty({n, h, w, c}, t.dtype(), kCuda);
    out = make_view(memory, t.sizes(), {h * w * c, 1, w * c, c}, 0);
    out.copy_(t);
  } else {
    out = t.detach().to(kCuda);
  }
  if (t.requires_grad()) out.set_requires_grad(true);
  return out;
}

// Tolerances on ||gpu - cpu||_inf / max(||cpu||_inf, floor), forward and
// backward. The floor is the scale below which a result counts as zero: where
// a gradient is zero up to rounding by construction (batch norm over two values
// per channel), what remains is the rounding of the O(1) terms that cancelled.
struct Tolerance {
  double forward, backward;
  double floor = 1e-3;
};
inline Tolerance tolerance_for(DType t) {
  switch (t) {
    case DType::f64: return {1e-10, 1e-9};
    case DType::f32: return {1e-4, 2e-4};
    case DType::f16: return {5e-3, 1e-2};
    case DType::bf16: return {3e-2, 6e-2};
    default: return {0, 0};
  }
}

inline std::vector<double> host_values(const Tensor& t) { return t.detach().to_vector<double>(); }

// Checks that `gpu` (any device) matches `cpu` within `tolerance` (0: exactly),
// relative to the larger of ||cpu||_inf and `floor`.
inline void check_close(const Tensor& gpu, const Tensor& cpu, double tolerance, const std::string& what,
                        double floor = 1e-3) {
  INFO(what, ": gpu ", gpu.str(), " vs cpu ", cpu.str());
  REQUIRE(gpu.defined());
  REQUIRE(cpu.defined());
  REQUIRE(gpu.sizes() == cpu.sizes());
  CHECK(gpu.dtype() == cpu.dtype());
  const std::vector<double> a = host_values(gpu), b = host_values(cpu);
  double max_diff = 0, max_ref = 0;
  size_t worst = 0, nan_mismatch = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) != std::isnan(b[i])) ++nan_mismatch;
    if (std::isnan(a[i]) || std::isnan(b[i])) continue;
    const double d = std::abs(a[i] - b[i]);
    if (d > max_diff) {
      max_diff = d;
      worst = i;
    }
    max_ref = std::max(max_ref, std::abs(b[i]));
  }
  const double error = max_diff / std::max(max_ref, floor);
  INFO("relative error ", error, " (tolerance ", tolerance, "), worst at flat index ", worst, ": gpu ",
       a.empty() ? 0.0 : a[worst], " cpu ", b.empty() ? 0.0 : b[worst], "; NaN mismatches ", nan_mismatch);
  CHECK(nan_mismatch == 0);
  if (tolerance == 0) {
    CHECK(max_diff == 0);
  } else {
    CHECK(error <= tolerance);
  }
}

}  // namespace loom::gpu_testing
