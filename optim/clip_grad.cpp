#include <loom/optim/clip_grad.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include <loom/core/autograd.h>
#include <loom/core/memory_format.h>
#include <loom/core/parallel.h>
#include <loom/optim/clip_grad_math.h>
#include <loom/optim/cuda/fused_update.h>

namespace loom::optim {
namespace {
constexpr int64_t kBlock = 1 << 14;  // elements per partial result: fixed, so the sum's order is too

// An element as f64 (16-bit floats through float) and back.
template <class T>
double as_double(T value) {
  if constexpr (std::is_floating_point_v<T>) return static_cast<double>(value);
  else return static_cast<double>(static_cast<float>(value));
}
template <class T>
T from_double(double value) {
  if constexpr (std::is_floating_point_v<T>) return static_cast<T>(value);
  else return T(static_cast<float>(value));
}

// The gradients of `parameters` that are defined.
std::vector<Tensor> gradients_of(const std::vector<Tensor>& parameters) {
  std::vector<Tensor> gradients;
  for (const Tensor& parameter : parameters) {
    if (parameter.defined() && parameter.grad().defined()) gradients.push_back(parameter.grad());
  }
  return gradients;
}

// One CPU gradient's terms folded: per block of kBlock elements, then the
// blocks in order (deterministic for any thread count).
double cpu_norm_terms(const Tensor& gradient, const NormTerms& terms) {
  LOOM_CHECK(is_floating(gradient.dtype()), "clip_grad_norm_: gradient ", gradient.str(), " is not floating-point");
  const Tensor g = gradient.is_contiguous() ? gradient : gradient.contiguous();
  const int64_t n = g.numel(), blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(blocks), 0.0);
  visit_dtype(g.dtype(), [&]<class T>() {
    if constexpr (!std::is_integral_v<T>) {
      const T* p = static_cast<const T*>(g.raw_data());
      parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
        for (int64_t b = first; b < last; ++b) {
          double total = 0;
          for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i)
            total = terms.combine(total, terms.term(as_double(p[i])));
          partial[static_cast<size_t>(b)] = total;
        }
      });
    }
  });
  double total = 0;
  for (double v : partial) total = terms.combine(total, v);
  return total;
}

void check_bound(const char* what, const char* name, double value) {
  LOOM_CHECK(value >= 0, what, ": ", name, " must be >= 0, got ", value);
}
}  // namespace

double get_total_norm(const std::vector<Tensor>& parameters, double norm_type) {
  LOOM_CHECK(norm_type > 0, "get_total_norm: norm_type must be > 0 or infinity, got ", norm_type);
  const NormTerms terms{norm_type, std::isinf(norm_type)};
  std::vector<Tensor> on_gpu;
  double total = 0;
  for (const Tensor& gradient : gradients_of(parameters)) {
    if (gradient.device().is_cuda()) {
      on_gpu.push_back(gradient);
    } else {
      total = terms.combine(total, cpu_norm_terms(gradient, terms));
    }
  }
  if (!on_gpu.empty()) total = terms.combine(total, cuda::norm_terms(on_gpu, norm_type));
  return terms.infinity ? total : std::pow(total, 1.0 / norm_type);
}

void clip_grads_with_norm_(const std::vector<Tensor>& parameters, double max_norm, double total_norm) {
  check_bound("clip_grad_norm_", "max_norm", max_norm);
  const double clip_coef = max_norm / (total_norm + 1e-6);
  if (clip_coef >= 1.0) return;  // PyTorch clamps to 1 and multiplies: the same values
  NoGradGuard no_grad;
  for (Tensor gradient : gradients_of(parameters)) {
    LOOM_CHECK(in_a_memory_format(gradient), "clip_grad_norm_: gradient ", gradient.str(),
               " is neither contiguous nor channels-last");
    gradient.mul_(clip_coef);
  }
}

double clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  check_bound("clip_grad_norm_", "max_norm", max_norm);
  const double total_norm = get_total_norm(parameters, norm_type);
  LOOM_CHECK(!error_if_nonfinite || std::isfinite(total_norm), "clip_grad_norm_: the total norm of order ",
             norm_type, " of the gradients is ", total_norm,
             "; the gradients were left as they are (error_if_nonfinite is set)");
  clip_grads_with_norm_(parameters, max_norm, total_norm);
  return total_norm;
}

void clip_grad_value_(const std::vector<Tensor>& parameters, double clip_value) {
  check_bound("clip_grad_value_", "clip_value", clip_value);
  std::vector<Tensor> on_gpu;
  for (const Tensor& gradient : gradients_of(parameters)) {
    LOOM_CHECK(in_a_memory_format(gradient), "clip_grad_value_: gradient ", gradient.str(),
               " is neither contiguous nor channels-last");
    LOOM_CHECK(is_floating(gradient.dtype()), "clip_grad_value_: gradient ", gradient.str(), " is not floating-point");
    if (gradient.device().is_cuda()) {
      on_gpu.push_back(gradient);
      continue;
    }
    visit_dtype(gradient.dtype(), [&]<class T>() {
      if constexpr (!std::is_integral_v<T>) {
        T* p = static_cast<T*>(gradient.raw_data());
        const T low = from_double<T>(-clip_value), high = from_double<T>(clip_value);
        parallel_for(0, gradient.numel(), kBlock, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) {
            const double v = as_double(p[i]);
            if (v < -clip_value) p[i] = low;
            else if (v > clip_value) p[i] = high;
          }
        });
      }
    });
  }
  if (!on_gpu.empty()) cuda::clamp_(on_gpu, clip_value);
}

}  // namespace loom::optim
